// kernels/cpu/gemm.cc: gemm_cpu on oneDNN's matmul (kernels/cpu/gemm.h).
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/gemm_epilogue.h"
#include "kernels/cpu/layer_loops.h"
#include "kernels/op_profile.h"

#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#elif DNNL_CPU_RUNTIME != DNNL_RUNTIME_SEQ
#error "gemm.cc pins oneDNN to one thread per call: it supports oneDNN's OpenMP and sequential runtimes"
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>  // the CPU's bf16 instructions (Note [bf16 GEMMs on the CPU])
#endif

namespace mp {
namespace {

using dnnl_dt = dnnl::memory::data_type;

// Tiles: Note [CPU GEMM threads]. C is split along its longer side into a
// "round" number of tiles (kTileCounts: they share out evenly over 2, 3 or
// 4 threads) of at least kMinTile, each a multiple of kTileAlign. Where the
// other side of C is long enough, tiles are also long enough for oneDNN's
// AVX2 sgemm to pack its inputs: it takes its no-copy kernels whenever
// 1/m + 1/n >= kNoCopyThreshold (oneDNN 2.6, gemm_driver.cpp), and those
// run the GPT's weight gradients at 40-70 instead of 90 GFLOP/s per core
// (measured here), unless that leaves a single tile. A function of the
// shape only, never of the threads.
constexpr int64_t kTileCounts[] = {1, 2, 4, 6, 8, 12, 16, 24, 32};
constexpr int64_t kTileAlign = 16;
constexpr int64_t kMinTile = 128;
constexpr double kNoCopyThreshold = 0.0038;
// Primitives kept; the cache is cleared when it is full (a new shape mix).
constexpr size_t kMaxCachedPrimitives = 1024;

// One macro per foreign library (docs/architecture.md "Error tiers"): a oneDNN call that throws
// dnnl::error becomes an EnforceError naming the call and the status.
#define MP_CHECK_DNNL(call, ...)                                                                        \
  do {                                                                                                  \
    try {                                                                                               \
      call;                                                                                             \
    } catch (const dnnl::error& e_) {                                                                   \
      MP_THROW(EnforceError, "Call to " #call " failed: ", e_.what(), " (status ", static_cast<int>(e_.status), \
               ") ", __VA_ARGS__);                                                                      \
    }                                                                                                   \
  } while (0)

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl_dt dnnl_type(DType t) { return t == DType::kBF16 ? dnnl_dt::bf16 : dnnl_dt::f32; }

// The calling thread's OpenMP thread count, 1 for the scope: oneDNN then
// runs the call inline, on this thread.
class OneOmpThread {
 public:
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
  OneOmpThread() : saved_(omp_get_max_threads()) {
    if (saved_ != 1) omp_set_num_threads(1);
  }
  ~OneOmpThread() {
    if (saved_ != 1) omp_set_num_threads(saved_);
  }

 private:
  int saved_;
#endif
};

// What a primitive is created for: one tile shape of one problem.
struct PrimitiveKey {
  int64_t m, n, k, lda, ldb, ldc;
  DType a_dtype, b_dtype;
  bool a_transposed, b_transposed, bias, accumulate;
  bool operator==(const PrimitiveKey&) const = default;
};

struct PrimitiveKeyHash {
  size_t operator()(const PrimitiveKey& key) const {
    size_t h = 0;
    auto mix = [&](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(key.a_dtype) | static_cast<uint64_t>(key.b_dtype) << 8 |
        static_cast<uint64_t>(key.a_transposed) << 16 | static_cast<uint64_t>(key.b_transposed) << 17 |
        static_cast<uint64_t>(key.bias) << 18 | static_cast<uint64_t>(key.accumulate) << 19);
    return h;
  }
};

// The memory descriptors of a tile and its primitive. Immutable once made.
// oneDNN primitives may execute concurrently from several threads only with
// a scratchpad per execution: its library-managed scratchpad is shared (the
// Debian build has DNNL_ENABLE_CONCURRENT_EXEC off; measured: tiles of one
// primitive run on two threads corrupted each other's bias and sum
// post-ops). So the scratchpad mode is user and each thread brings its own.
struct TilePrimitive {
  dnnl::memory::desc a, b, bias, c, scratchpad;
  dnnl::matmul matmul;
};

// The calling thread's scratchpad for oneDNN calls, grown as needed and
// kept: the pool's workers are persistent, so after the first steps no call
// allocates or faults in pages. Page-aligned.
void* thread_scratchpad(size_t bytes) {
  constexpr size_t kAlign = 4096;
  thread_local std::vector<char> buffer;
  if (buffer.size() < bytes + kAlign) buffer.resize(bytes + kAlign);
  const auto base = reinterpret_cast<uintptr_t>(buffer.data());
  return reinterpret_cast<void*>((base + kAlign - 1) / kAlign * kAlign);
}

dnnl::memory::desc matrix_desc(int64_t rows, int64_t cols, DType dtype, int64_t ld, bool transposed) {
  // Logical [rows, cols]; stored row-major, or as the transpose ([cols, rows]).
  const dnnl::memory::dims strides = transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1};
  return dnnl::memory::desc({rows, cols}, dnnl_type(dtype), strides);
}

std::shared_ptr<const TilePrimitive> make_primitive(const PrimitiveKey& key) {
  auto p = std::make_shared<TilePrimitive>();
  p->a = matrix_desc(key.m, key.k, key.a_dtype, key.lda, key.a_transposed);
  p->b = matrix_desc(key.k, key.n, key.b_dtype, key.ldb, key.b_transposed);
  p->c = matrix_desc(key.m, key.n, DType::kF32, key.ldc, false);
  if (key.bias) p->bias = matrix_desc(1, key.n, DType::kF32, key.n, false);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  [[maybe_unused]] const OneOmpThread one;  // oneDNN may size its choices by the thread count it sees
  try {
    const dnnl::matmul::desc desc =
        key.bias ? dnnl::matmul::desc(p->a, p->b, p->bias, p->c) : dnnl::matmul::desc(p->a, p->b, p->c);
    const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    p->scratchpad = pd.scratchpad_desc();
    p->matmul = dnnl::matmul(pd);
  } catch (const dnnl::error& e) {
    MP_THROW(EnforceError, "oneDNN matmul creation failed for a ", key.m, " x ", key.n, " x ", key.k, " tile (",
             dtype_name(key.a_dtype), " x ", dtype_name(key.b_dtype), "): ", e.what());
  }
  return p;
}

class PrimitiveCache {
 public:
  std::shared_ptr<const TilePrimitive> get(const PrimitiveKey& key) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) return it->second;
    }
    // Created outside the lock: creation takes milliseconds (JIT).
    std::shared_ptr<const TilePrimitive> p = make_primitive(key);
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() >= kMaxCachedPrimitives) map_.clear();
    return map_.emplace(key, std::move(p)).first->second;
  }

 private:
  std::mutex mu_;
  std::unordered_map<PrimitiveKey, std::shared_ptr<const TilePrimitive>, PrimitiveKeyHash> map_;
};

PrimitiveCache& primitive_cache() {
  static PrimitiveCache cache;
  return cache;
}

// The tile length along `dim` of C when the other side (`other`) stays whole.
int64_t tile_length(int64_t dim, int64_t other) {
  double min_tile = kMinTile;
  const double room = kNoCopyThreshold - 1.0 / static_cast<double>(other);
  if (room > 0) min_tile = std::max(min_tile, 1.0 / room);
  int64_t count = 1;
  for (int64_t c : kTileCounts) {
    if (static_cast<double>(dim) >= static_cast<double>(c) * min_tile) count = c;
  }
  // One packed tile would leave every other thread idle: two no-copy tiles
  // instead (about 0.75x one core's speed each, so 1.5x on two threads).
  if (count == 1 && dim >= 2 * kMinTile) count = 2;
  const int64_t per_tile = (dim + count - 1) / count;
  return std::min(dim, (per_tile + kTileAlign - 1) / kTileAlign * kTileAlign);
}

void check_input(const GemmInput& x, const char* name, int64_t rows, int64_t cols) {
  // Stored [rows, cols], or [cols, rows] when transposed.
  const int64_t stored_cols = x.transposed ? rows : cols;
  MP_ENFORCE(x.data != nullptr, "gemm input ", name, " is null");
  MP_ENFORCE(x.dtype == DType::kF32 || x.dtype == DType::kBF16, "gemm input ", name, " in ", dtype_name(x.dtype),
             ": need fp32 or bf16");
  MP_ENFORCE(x.ld >= std::max<int64_t>(stored_cols, 1), "gemm input ", name, ": leading dimension ", x.ld,
             " < its ", stored_cols, " stored columns");
}

// Note [4K aliasing]: oneDNN's AVX2 no-copy sgemm reads a non-transposed B
// row after row; when those rows lie a multiple of 4 KiB apart (ld = 1024,
// 2048, 3072 floats: the GPT's c_fc weight at C = 768) they compete for the
// same L1 sets and the product runs at half speed (measured: 256 x 3072 x
// 768 at 45 instead of 90 GFLOP/s per core, any alignment of B). Such a B
// is staged into scratch with its rows kPad floats further apart first (a
// 9 MB copy, about 1 ms, against 13 ms saved for that shape).
constexpr int64_t kPad = 16;

bool aliased_ld(int64_t ld_floats) { return ld_floats >= 1024 && ld_floats * 4 % 4096 == 0; }

// The leading dimension of a staged copy of `stored_cols` fp32 columns.
int64_t staged_ld(int64_t stored_cols) {
  const int64_t ld = std::max<int64_t>(stored_cols, 1);
  return aliased_ld(ld) ? ld + kPad : ld;
}

// How an input reaches oneDNN: as it is, or staged into fp32 scratch
// (widened from bf16, or re-laid with a padded leading dimension).
struct Staging {
  bool stage = false;
  int64_t stored_rows = 0, stored_cols = 0, ld = 0;
  int64_t elements() const { return stage ? stored_rows * ld : 0; }
};

Staging staging_of(const GemmInput& x, int64_t rows, int64_t cols, bool widen, bool is_b, bool no_copy) {
  Staging s;
  s.stored_rows = x.transposed ? cols : rows;
  s.stored_cols = x.transposed ? rows : cols;
  const bool repack = is_b && !x.transposed && x.dtype == DType::kF32 && no_copy && aliased_ld(x.ld);
  s.stage = (widen && x.dtype == DType::kBF16) || repack;
  s.ld = staged_ld(s.stored_cols);
  return s;
}

// Copies x (fp32 or bf16) into dst as fp32 with leading dimension s.ld.
GemmInput stage(const GemmInput& x, const Staging& s, float* dst, int threads) {
  parallel_for(s.stored_rows, threads, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* d = dst + r * s.ld;
      if (x.dtype == DType::kBF16) {
        const bf16* src = static_cast<const bf16*>(x.data) + r * x.ld;
        for (int64_t j = 0; j < s.stored_cols; ++j) d[j] = math::to_f32(src[j]);
      } else {
        const float* src = static_cast<const float*>(x.data) + r * x.ld;
        std::memcpy(d, src, static_cast<size_t>(s.stored_cols) * sizeof(float));
      }
    }
  });
  return GemmInput{dst, DType::kF32, s.ld, x.transposed};
}

// Whether oneDNN's sgemm takes its no-copy kernels for a tile (Note [CPU
// GEMM threads], Note [4K aliasing]).
bool no_copy_tile(const GemmTiling& t) {
  return 1.0 / static_cast<double>(t.tile_m) + 1.0 / static_cast<double>(t.tile_n) >= kNoCopyThreshold;
}

struct ProblemStaging {
  Staging a, b;
};

bool native_for(Bf16Gemm choice) {
  if (choice == Bf16Gemm::kAuto) return gemm_native_bf16();
  if (choice == Bf16Gemm::kNative) {
    MP_ENFORCE(gemm_bf16_kernel_available(), "gemm: bf16 operands forced native, but oneDNN has no bf16 matmul "
               "kernel on this CPU");
    return true;
  }
  return false;
}

ProblemStaging staging_of(const GemmProblem& p, Bf16Gemm choice) {
  const bool widen = !(p.a.dtype == DType::kBF16 && p.b.dtype == DType::kBF16 && native_for(choice));
  const bool no_copy = no_copy_tile(gemm_tiling(p.m, p.n, p.k));
  return ProblemStaging{staging_of(p.a, p.m, p.k, widen, false, no_copy),
                        staging_of(p.b, p.k, p.n, widen, true, no_copy)};
}

void check_problem(const GemmProblem& p) {
  MP_ENFORCE(p.m == 0 || (p.c != nullptr && p.ldc >= p.n), "gemm output: ldc ", p.ldc, " for ", p.n, " columns");
  MP_ENFORCE(p.c_dtype == DType::kF32 || p.c_dtype == DType::kBF16, "gemm output in ", dtype_name(p.c_dtype),
             ": need fp32 or bf16");
  const bool f32_c = p.c_dtype == DType::kF32 && !p.c_bf16;
  MP_ENFORCE(!p.accumulate || (f32_c && p.epilogue == GemmEpilogue::kNone && p.addend == nullptr),
             "gemm accumulate: only into an fp32 C without an epilogue or addend");
  MP_ENFORCE(p.addend == nullptr || f32_c, "gemm addend: only with an fp32 C");
  if (p.epilogue != GemmEpilogue::kNone) {
    MP_ENFORCE(p.aux != nullptr && p.aux_ld >= p.n, "gemm GELU epilogue: aux ", p.aux, " with ld ", p.aux_ld, " for ",
               p.n, " columns");
    MP_ENFORCE(p.epilogue == GemmEpilogue::kGelu || (p.bias == nullptr && p.addend == nullptr),
               "gemm DGELU epilogue: takes no bias and no addend");
  }
}

// The k = 0 product: zeros, through the bias, addend, accumulate and
// epilogue (Note [GEMM epilogue]).
void run_without_product(const GemmProblem& p) {
  const int64_t cols = p.n;
  float* tile = thread_floats(ThreadFloats::kGemmTile, cols);
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < cols; ++j) tile[j] = p.bias != nullptr ? p.bias[j] : 0.0f;
    if (gemm_needs_epilogue(p)) {
      gemm_epilogue_tile(p, tile, cols, i, 1, 0, cols);
    } else {
      float* row = p.c_f32() + i * p.ldc;
      const float* add = p.addend != nullptr ? p.addend + i * p.ldc : nullptr;
      for (int64_t j = 0; j < cols; ++j) {
        float v = tile[j];
        if (add != nullptr) v += add[j];
        row[j] = p.accumulate ? row[j] + v : v;
      }
    }
  }
}

bool probe_native_bf16() {
  try {
    [[maybe_unused]] const OneOmpThread one;
    const dnnl::memory::desc a({64, 64}, dnnl_dt::bf16, dnnl::memory::dims{64, 1});
    const dnnl::memory::desc c({64, 64}, dnnl_dt::f32, dnnl::memory::dims{64, 1});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), cpu_engine());
    // A reference implementation would be slower than widening to fp32.
    return std::string(pd.impl_info_str()).find("ref") == std::string::npos;
  } catch (const dnnl::error&) {
    return false;  // dnnl_unimplemented: no bf16 matmul for this ISA
  }
}

// The implementation oneDNN picks for a [256, 768] x [768, 768] matmul of
// `dtype` (the GPT's shapes): its impl_info_str, e.g. "brg:avx512_core_amx".
std::string probe_kernel(dnnl_dt t) {
  try {
    [[maybe_unused]] const OneOmpThread one;
    const dnnl::memory::desc a({256, 768}, t, dnnl::memory::dims{768, 1});
    const dnnl::memory::desc b({768, 768}, t, dnnl::memory::dims{768, 1});
    const dnnl::memory::desc c({256, 768}, dnnl_dt::f32, dnnl::memory::dims{768, 1});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), cpu_engine());
    return pd.impl_info_str();
  } catch (const dnnl::error&) {
    return "unimplemented";
  }
}

}  // namespace

std::string gemm_kernel(DType dtype) {
  static const std::string f32 = probe_kernel(dnnl_dt::f32);
  static const std::string bf = gemm_native_bf16() ? probe_kernel(dnnl_dt::bf16) : f32 + " (bf16 widened)";
  return dtype == DType::kBF16 ? bf : f32;
}

namespace {

// bf16 dot-product instructions: AVX512_BF16 (CPUID.(7,1):EAX bit 5) or
// AMX-BF16 (CPUID.(7,0):EDX bit 22).
bool cpu_has_bf16_dot() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const bool amx = (d >> 22) & 1u;
  const unsigned max_subleaf = a;
  bool avx512_bf16 = false;
  if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0) avx512_bf16 = (a >> 5) & 1u;
  return amx || avx512_bf16;
#else
  return false;
#endif
}

struct Bf16Decision {
  bool native = false;
  std::string reason;
};

Bf16Decision decide_bf16() {
  const bool kernel = gemm_bf16_kernel_available(), dot = cpu_has_bf16_dot();
  const char* env = std::getenv("MP_CPU_BF16_GEMM");
  const std::string forced = env != nullptr ? env : "";
  if (forced == "native") {
    if (!kernel) {
      MP_THROW(ConfigError, "MP_CPU_BF16_GEMM=native, but oneDNN has no bf16 matmul kernel on this CPU: use widen "
               "or auto");
    }
    return {true, "bf16 native (MP_CPU_BF16_GEMM=native)"};
  }
  if (forced == "widen") return {false, "bf16 widened to fp32 (MP_CPU_BF16_GEMM=widen)"};
  if (!forced.empty() && forced != "auto") {
    MP_THROW(ConfigError, "MP_CPU_BF16_GEMM = '", forced, "': use native, widen or auto");
  }
  if (!kernel) return {false, "bf16 widened to fp32: oneDNN has no bf16 matmul on this CPU"};
  if (!dot) {
    return {false, "bf16 widened to fp32: this CPU has no bf16 dot-product instructions (avx512_bf16, AMX), "
                   "where oneDNN's bf16 matmul is emulated and slower than fp32"};
  }
  return {true, "bf16 native: the CPU has bf16 dot-product instructions"};
}

const Bf16Decision& bf16_decision() {
  static const Bf16Decision d = decide_bf16();
  return d;
}

}  // namespace

bool gemm_bf16_kernel_available() {
  static const bool kernel = probe_native_bf16();
  return kernel;
}

bool gemm_native_bf16() { return bf16_decision().native; }

const char* gemm_bf16_reason() { return bf16_decision().reason.c_str(); }

DType gemm_bf16_storage() { return gemm_native_bf16() ? DType::kBF16 : DType::kF32; }

const char* gemm_describe() {
  static const std::string text = [] {
    const dnnl_version_t* v = dnnl_version();
    return detail::str("oneDNN ", v->major, ".", v->minor, ".", v->patch, " matmul, ", gemm_bf16_reason());
  }();
  return text.c_str();
}

GemmTiling gemm_tiling(int64_t m, int64_t n, int64_t /*k*/) {
  // Split the longer side of C; the other stays whole.
  m = std::max<int64_t>(m, 1);
  n = std::max<int64_t>(n, 1);
  if (n > m) return GemmTiling{m, tile_length(n, m)};
  return GemmTiling{tile_length(m, n), n};  // square: row tiles, measured faster (2048^3: 1.1x)
}

int64_t gemm_scratch_elements(const GemmProblem& p) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) return 0;
  const ProblemStaging s = staging_of(p, Bf16Gemm::kAuto);
  return s.a.elements() + s.b.elements();
}

namespace {

// One tile of C: [i0, i0 + tm) x [j0, j0 + tn).
struct Tile {
  int64_t i0, j0, tm, tn;
};

// oneDNN's product of one tile (with the bias, and the sum post-op when
// `accumulate`) into `c` (fp32, leading dimension ldc).
void product_tile(const GemmProblem& p, const Tile& t, bool accumulate, float* c, int64_t ldc,
                  dnnl::stream& stream) {
  const size_t a_bytes = dtype_size(p.a.dtype), b_bytes = dtype_size(p.b.dtype);
  // Elements between consecutive rows (columns) of op(A) and op(B).
  const int64_t a_row = p.a.transposed ? 1 : p.a.ld, b_col = p.b.transposed ? p.b.ld : 1;
  const PrimitiveKey key{t.tm,      t.tn,      p.k,            p.a.ld,         p.b.ld,           ldc,
                         p.a.dtype, p.b.dtype, p.a.transposed, p.b.transposed, p.bias != nullptr, accumulate};
  const std::shared_ptr<const TilePrimitive> prim = primitive_cache().get(key);
  auto* a = static_cast<char*>(const_cast<void*>(p.a.data)) + static_cast<size_t>(t.i0 * a_row) * a_bytes;
  auto* b = static_cast<char*>(const_cast<void*>(p.b.data)) + static_cast<size_t>(t.j0 * b_col) * b_bytes;
  const dnnl::memory am(prim->a, cpu_engine(), a), bm(prim->b, cpu_engine(), b), cm(prim->c, cpu_engine(), c);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (p.bias != nullptr) {
    args.emplace(DNNL_ARG_BIAS, dnnl::memory(prim->bias, cpu_engine(), const_cast<float*>(p.bias + t.j0)));
  }
  if (const size_t bytes = prim->scratchpad.get_size(); bytes > 0) {
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(prim->scratchpad, cpu_engine(), thread_scratchpad(bytes)));
  }
  MP_CHECK_DNNL(prim->matmul.execute(stream, args), "for tile (", t.i0, ", ", t.j0, ") of a ", p.m, " x ", p.n,
                " x ", p.k, " gemm");
}

// Tile t of C: oneDNN alone (fp32 C; an addend is copied into C first and
// summed by the post-op), or oneDNN into the thread's fp32 tile and the
// epilogue from there into C (kernels/cpu/gemm_epilogue.h).
void run_tile(const GemmProblem& p, const Tile& t, dnnl::stream& stream) {
  if (!gemm_needs_epilogue(p)) {
    float* c = p.c_f32() + t.i0 * p.ldc + t.j0;
    if (p.addend != nullptr) {
      for (int64_t r = 0; r < t.tm; ++r) {
        std::memcpy(c + r * p.ldc, p.addend + (t.i0 + r) * p.ldc + t.j0, static_cast<size_t>(t.tn) * sizeof(float));
      }
    }
    product_tile(p, t, p.accumulate || p.addend != nullptr, c, p.ldc, stream);
    MP_CHECK_DNNL(stream.wait(), "");
    return;
  }
  float* tile = thread_floats(ThreadFloats::kGemmTile, t.tm * t.tn);
  product_tile(p, t, /*accumulate=*/false, tile, t.tn, stream);
  MP_CHECK_DNNL(stream.wait(), "");
  gemm_epilogue_tile(p, tile, t.tn, t.i0, t.tm, t.j0, t.tn);
}


}  // namespace

void gemm_cpu(const GemmProblem& problem, const GemmOptions& options) {
  ScopedOp op(OpFamily::kGemm);
  GemmProblem p = problem;
  MP_ENFORCE(p.m >= 0 && p.n >= 0 && p.k >= 0, "gemm shape ", p.m, " x ", p.n, " x ", p.k);
  if (p.n == 0 || (p.m == 0 && p.bias_grad == nullptr)) return;  // nothing to do, nothing read
  check_problem(p);
  if (p.k > 0) check_input(p.b, "B", p.k, p.n);
  if (p.m == 0 || p.k == 0) {
    if (p.bias_grad != nullptr) gemm_bias_grad_of_b(p, 0, p.n);
    if (p.m > 0) run_without_product(p);
    return;
  }
  check_input(p.a, "A", p.m, p.k);

  // bf16 inputs without a native bf16 matmul are widened (exactly) to fp32;
  // a B with a 4K-aliased leading dimension is re-laid (Note [4K aliasing]).
  const ProblemStaging staging = staging_of(p, options.bf16);
  if (const int64_t need = staging.a.elements() + staging.b.elements(); need > 0) {
    float* scratch = options.scratch != nullptr && options.scratch_elements >= need
                         ? options.scratch
                         : thread_floats(ThreadFloats::kGemmStaging, need);
    if (staging.a.stage) {
      p.a = stage(p.a, staging.a, scratch, options.threads);
      scratch += staging.a.elements();
    }
    if (staging.b.stage) p.b = stage(p.b, staging.b, scratch, options.threads);
  }

  const GemmTiling t = gemm_tiling(p.m, p.n, p.k);
  const int64_t tiles_m = (p.m + t.tile_m - 1) / t.tile_m, tiles_n = (p.n + t.tile_n - 1) / t.tile_n;
  parallel_for(tiles_m * tiles_n, options.threads, 1, [&](int64_t t0, int64_t t1) {
    [[maybe_unused]] const OneOmpThread one;
    dnnl::stream stream(cpu_engine());
    for (int64_t tile = t0; tile < t1; ++tile) {
      const int64_t i0 = tile / tiles_n * t.tile_m, j0 = tile % tiles_n * t.tile_n;
      const Tile tl{i0, j0, std::min(t.tile_m, p.m - i0), std::min(t.tile_n, p.n - j0)};
      // The bias gradient of the tile's columns, by the first row of tiles
      // (in the same parallel region: no second wake-up of the threads).
      if (p.bias_grad != nullptr && i0 == 0) gemm_bias_grad_of_b(p, j0, j0 + tl.tn);
      run_tile(p, tl, stream);
    }
  });
}

}  // namespace mp
