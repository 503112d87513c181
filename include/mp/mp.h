// include/mp/mp.h: the C++ API for programs that embed mp in their own
// trainer (the C ABI is mp/mp_c.h). One include gives:
//
//   MpiWorld            MPI start-up with the thread level mp needs (or the
//                       host's own MPI_Init_thread(MPI_THREAD_MULTIPLE))
//   MpiCommunicator     the world communicator the engine shards over
//   ModelSpec           the host's parameters: ordered units of named, shaped
//                       parameters with an initializer each
//   Engine              the sharded engine: Engine::step(model) gathers each
//                       unit's parameters in the compute dtype before the
//                       host's forward and backward, takes the host's
//                       gradients and reduce-scatters them asynchronously,
//                       then runs the fused update; set_weights /
//                       gather_master move weights in and out; memory()
//                       and StepResult are the metrics
//   HostModel           what the host implements: forward(unit, params),
//                       loss(), backward(unit, params, grads) per
//                       micro-batch, run on the engine's compute thread
//                       (models/model.h has the contract; Model is its
//                       base, for models that enqueue their own ops)
//   save_checkpoint / load_checkpoint   sharded, atomic, reshardable
//   CheckpointWriter    save_async / wait: the same checkpoints written by
//                       a background thread while training goes on
//   parse_engine_config the EngineConfig from protobuf text format
//   install_stop_signal_watcher / StopSignalScope / stop_signal()
//                       SIGTERM and SIGUSR1 (preemption) recorded by a
//                       watcher thread, never handled on a thread inside a
//                       GEMM (core/stop_signals.h, Note [Signals and
//                       oneDNN]): call install first in main()
//
// Errors are exceptions derived from mp::Error (ConfigError, IoError,
// CommError, NumericError, ...; core/error.h); the library never ends
// the process. examples/host_trainer.cc is a complete host.
//
// Build against an installed mp with CMake:
//   find_package(mp REQUIRED)
//   target_link_libraries(app PRIVATE mp::runtime)
// or pkg-config: pkg-config --cflags --libs mp
#pragma once

#include <string>

#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_world.h"
#include "core/error.h"
#include "core/stop_signals.h"
#include "formats/text_proto.h"
#include "models/model.h"
#include "mp/config.h"
#include "runtime/checkpoint.h"
#include "runtime/engine.h"
#include "runtime/precision.h"

namespace mp {

// The library's version, "MAJOR.MINOR.PATCH" (mp_worker --version prints it).
inline const char* version() { return MP_VERSION; }

// An EngineConfig from protobuf text format, e.g.
//   sharding { strategy: FULL_SHARD } precision { recipe: BF16_MASTER }
//   optimizer { lr: 3e-4 }
// Throws ConfigError "SOURCE:LINE:COLUMN: message".
inline proto::EngineConfig parse_engine_config(const std::string& text, const std::string& source = "engine config") {
  proto::EngineConfig config;
  parse_text_proto(text, source, config);
  return config;
}

}  // namespace mp
