#include "python/src/world.h"

#include <dlfcn.h>
#include <mpi.h>
#include <nanobind/stl/string.h>

#include <cstdio>
#include <map>
#include <utility>

#include "comm/data_plane.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_world.h"
#include "comm/store.h"
#include "core/error.h"
#include "core/stream.h"

namespace nb = nanobind;

namespace mp::python {
namespace {

// mp/_launch.py's store: set(key, bytes), get(key, timeout_s) -> bytes, with
// the GIL taken for each call (engines are made with it released).
class PythonStore final : public KeyValueStore {
 public:
  explicit PythonStore(nb::object store) : store_(std::move(store)) {}
  ~PythonStore() override {
    nb::gil_scoped_acquire gil;
    store_.reset();
  }
  void set(const std::string& key, const std::string& value) override {
    nb::gil_scoped_acquire gil;
    call([&] { store_.attr("set")(key, nb::bytes(value.data(), value.size())); }, key);
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    nb::gil_scoped_acquire gil;
    std::string out;
    call([&] {
      const nb::bytes b(store_.attr("get")(key, static_cast<double>(timeout.count()) / 1000.0));
      out.assign(b.c_str(), b.size());
    }, key);
    return out;
  }

 private:
  template <class F>
  void call(F&& f, const std::string& key) {
    try {
      f();
    } catch (const nb::python_error& e) {
      MP_THROW(CommError, "the store, key '", key, "': ", e.what());
    }
  }
  nb::object store_;
};

struct State {
  World world;
  std::unique_ptr<MpiWorld> mpi;
  std::unique_ptr<GlooCommunicator> gloo;  // the world's; engines get splits of it
  std::unique_ptr<Communicator> mpi_control;
};
std::unique_ptr<State> g_state;
std::map<int, std::function<void()>> g_closers;
int g_next_token = 0;

// Re-opens the already loaded MPI library with RTLD_GLOBAL (RTLD_NOLOAD: it
// is never loaded a second time), as mpi4py does.
void make_mpi_symbols_global() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &info) == 0 || info.dli_fname == nullptr) return;
  (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
}

}  // namespace

void init(const Ranks& ranks, nb::object store, bool use_mpi) {
  if (g_state) return;
  auto s = std::make_unique<State>();
  s->world.ranks = ranks;
  if (use_mpi) {
    make_mpi_symbols_global();
    s->mpi = std::make_unique<MpiWorld>(nullptr, nullptr);
    s->world.data_plane = "MPI";
    set_error_rank(s->mpi->rank());
    check_world_size(ranks, s->mpi->size(), "MPI's world");
    Ranks& r = s->world.ranks;
    r.rank = s->mpi->rank(), r.size = s->mpi->size();
    r.local_rank = s->mpi->local_rank(), r.local_size = s->mpi->local_size();
  } else {
    MP_ENFORCE(!store.is_none(), "a world without MPI needs a store");
    set_error_rank(ranks.rank);
    auto kv = std::make_shared<PythonStore>(std::move(store));
    const std::string host = local_address_toward(ranks.master_addr);
    nb::gil_scoped_release release;
    s->gloo = GlooCommunicator::create_world(std::move(kv), ranks.rank, ranks.size, host, "world", CommOptions{});
    s->world.data_plane = "Gloo";
  }
  if (s->world.ranks.rank == 0) {
    std::fprintf(stderr, "mp: %s; data plane: %s\n", s->world.ranks.describe().c_str(),
                 s->world.data_plane == "MPI" ? "MPI" : "Gloo over TCP, MPI not started");
  }
  g_state = std::move(s);
}

void finalize() {
  // Closing an engine may call back into this map: take them out first.
  std::map<int, std::function<void()>> closers;
  closers.swap(g_closers);
  for (auto& [token, close] : closers) close();
  if (!g_state) return;
  if (cpu_streams_abandoned()) {
    (void)g_state.release();  // MPI_Finalize, or Gloo's teardown, would wait for threads stuck in them
    return;
  }
  nb::gil_scoped_release release;
  g_state.reset();
}

bool initialized() { return g_state != nullptr; }

bool mpi_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
}

const World& world() {
  if (!g_state) MP_THROW(ConfigError, "call mp.init() before using mp");
  return g_state->world;
}

std::unique_ptr<Communicator> make_world_communicator(Device device, const CommOptions& options, bool shared_devices) {
  const World& w = world();
  if (g_state->mpi) return make_data_plane(device, options, shared_devices);
  if (device.is_cpu()) return g_state->gloo->split(0, w.ranks.rank, "world", options);
  if (shared_devices) {
    MP_THROW(ConfigError, "an engine on ", to_string(device), " in a world without MPI (", w.ranks.describe(),
             "): ranks that share a GPU need the staged MPI backend; launch with mpirun, or one rank per GPU");
  }
  // NCCL, its control plane (unique id, host values, splits) a Gloo split.
  return make_nccl_world(g_state->gloo->split(0, w.ranks.rank, "world (host)", options), device, options);
}

Communicator& control() {
  world();
  if (g_state->gloo) return *g_state->gloo;
  if (!g_state->mpi_control) g_state->mpi_control = MpiCommunicator::create_world("control", CommOptions{});
  return *g_state->mpi_control;
}

int register_closer(std::function<void()> close) {
  const int token = g_next_token++;
  g_closers.emplace(token, std::move(close));
  return token;
}

void unregister_closer(int token) { g_closers.erase(token); }

}  // namespace mp::python
