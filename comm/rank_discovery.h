// comm/rank_discovery.h: who this process is in its job, decided once, from
// explicit arguments or the launcher's environment.
//
// Note [Rank discovery]
// Sources, first present wins:
//   1. explicit arguments (mp.init(rank=..., world_size=...), a trainer's
//      strategy);
//   2. torchrun's (and Lightning's): RANK, WORLD_SIZE, LOCAL_RANK,
//      LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; torchrun's agent serves a
//      TCP store at MASTER_ADDR:MASTER_PORT when it exports
//      TORCHELASTIC_USE_AGENT_STORE=True, else rank 0 starts one there;
//   3. Open MPI's / PMI's: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
//      _LOCAL_SIZE, PMI_RANK, PMI_SIZE, PMIX_RANK;
//   4. Slurm's, for a task that srun started (SLURM_STEP_ID set):
//      SLURM_PROCID, SLURM_STEP_NUM_TASKS (or SLURM_NTASKS), SLURM_LOCALID,
//      SLURM_STEP_TASKS_PER_NODE; the store on the first host of
//      SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) unless MASTER_ADDR says
//      where, at MASTER_PORT or 20000 + SLURM_JOB_ID % 20000;
//   5. none: a world of one.
// Contradictions are ConfigErrors naming the variables and their values:
// a source's own variables that disagree (OMPI_COMM_WORLD_RANK against
// PMIX_RANK, RANK outside WORLD_SIZE, RANK without WORLD_SIZE), and
// explicit arguments or torchrun's variables against MPI's. Two sources
// agree when they describe the same processes (equal sizes and ranks), or
// when the first runs LOCAL_WORLD_SIZE processes under each of the second's
// (torchrun started once per node by mpirun: WORLD_SIZE = its size x
// LOCAL_WORLD_SIZE, RANK / LOCAL_WORLD_SIZE = its rank). Slurm's variables
// are never held against the others: they describe the allocation or the
// step, inside which torchrun and mpirun (whose daemons srun starts) run
// with other shapes. Whether the data plane then has the world size the
// launcher announced is checked where it is made (check_world_size).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace mp {

using Environment = std::map<std::string, std::string>;

// This process's environment variables.
Environment process_environment();

enum class RankSource : uint8_t { kExplicit, kTorchrun, kMpi, kSlurm, kNone };
std::string_view rank_source_name(RankSource source);  // "explicit", "torchrun", "MPI", "Slurm", "none"

// What a caller says; -1 and empty mean not given.
struct RankArguments {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  int local_world_size = -1;
  std::string master_addr;
  int master_port = 0;
};

struct Ranks {
  RankSource source = RankSource::kNone;
  int rank = 0;
  int size = 1;  // -1: only MPI knows (PMIX_RANK without a size)
  int local_rank = 0;
  int local_size = 1;
  std::string master_addr;  // the store's host and port, where one is needed
  int master_port = 0;
  bool agent_store = false;  // torchrun's agent serves it; otherwise rank 0 starts it
  std::string evidence;      // the variables read: "RANK=1, WORLD_SIZE=2, ..."

  // MPI carries the data plane (under mpirun, or alone); otherwise the
  // ranks meet through the store (comm/gloo/).
  bool uses_mpi() const { return source == RankSource::kMpi || source == RankSource::kNone; }
  // "ranks: torchrun (RANK=1, WORLD_SIZE=2, ...): rank 1 of 2, local 1 of 2"
  std::string describe() const;
};

// Note [Rank discovery]. Throws ConfigError on a contradiction.
Ranks discover_ranks(const Environment& env, const RankArguments& given = {});

// Throws ConfigError unless the data plane's `actual` size is the one the
// launcher announced (`what` names the data plane, e.g. "MPI's world").
void check_world_size(const Ranks& ranks, int actual, std::string_view what);

}  // namespace mp
