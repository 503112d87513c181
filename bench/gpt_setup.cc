#include "bench/gpt_setup.h"

#include <algorithm>
#include <cstdlib>

#include "core/parallel.h"

namespace mp::bench {

GptConfig gpt2_124m_bench_config() {
  GptConfig g;
  g.vocab = 50257;
  g.context = 64;
  g.channels = 768;
  g.heads = 12;
  g.layers = 12;
  return g;
}

GptConfig small_gpt_bench_config() {
  GptConfig g;
  g.vocab = 256;
  g.context = 64;
  g.channels = 128;
  g.heads = 4;
  g.layers = 4;
  return g;
}

int threads_per_rank(const MpiWorld& world) {
  if (const char* env = std::getenv("MP_NUM_THREADS"); env != nullptr && *env != '\0') return default_cpu_threads();
  return std::max(1, default_cpu_threads() / std::max(1, world.local_size()));
}

}  // namespace mp::bench
