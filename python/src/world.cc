#include "python/src/world.h"

#include <dlfcn.h>
#include <mpi.h>

#include <map>
#include <memory>
#include <utility>

#include "core/error.h"
#include "core/stream.h"

namespace mp::python {
namespace {

std::unique_ptr<MpiWorld> g_world;
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

void init() {
  if (g_world) return;
  make_mpi_symbols_global();
  g_world = std::make_unique<MpiWorld>(nullptr, nullptr);
  set_error_rank(g_world->rank());
}

void finalize() {
  // Closing an engine may call back into this map: take them out first.
  std::map<int, std::function<void()>> closers;
  closers.swap(g_closers);
  for (auto& [token, close] : closers) close();
  if (!g_world) return;
  if (cpu_streams_abandoned()) {
    (void)g_world.release();  // MPI_Finalize would wait for threads stuck in MPI
    return;
  }
  g_world.reset();
}

bool initialized() { return g_world != nullptr; }

const MpiWorld& world() {
  if (!g_world) MP_THROW(ConfigError, "call mp.init() before using mp (it starts MPI)");
  return *g_world;
}

int register_closer(std::function<void()> close) {
  const int token = g_next_token++;
  g_closers.emplace(token, std::move(close));
  return token;
}

void unregister_closer(int token) { g_closers.erase(token); }

}  // namespace mp::python
