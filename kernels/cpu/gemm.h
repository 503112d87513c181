// kernels/cpu/gemm.h: C = op(A) op(B) (+ bias) (+ C) on the CPU, through
// oneDNN's matmul primitive. A and B are fp32 or bf16, C is fp32 and every
// product is accumulated in fp32.
//
// Layout: every matrix is row-major with a leading dimension (the elements
// between the starts of consecutive stored rows). A transposed operand is
// described by strides, never copied: op(A) = A^T reads A stored [k, m].
//
// Note [bf16 GEMMs on the CPU]
// A bf16 x bf16 product is exact in fp32, so a bf16 GEMM accumulated in fp32
// is an fp32 GEMM of the operands widened exactly. Where the CPU has bf16
// dot-product instructions (avx512_bf16 or AMX) and oneDNN a kernel for
// them, the bf16 operands go to oneDNN as they are (gemm_native_bf16()).
// Elsewhere they are widened to fp32 scratch and the fp32 GEMM runs: on
// AVX2 machines oneDNN 2.6 has no bf16 matmul at all, and on AVX-512
// machines without avx512_bf16 (Skylake, Cascade Lake) it emulates one at
// about 0.4x its fp32 speed, so the widened fp32 GEMM is faster there. The
// choice is made once, from the CPU's features; MP_CPU_BF16_GEMM=native or
// widen forces it for the process (native: ConfigError where oneDNN has no
// bf16 kernel), and GemmOptions::bf16 for one call (tests).
//
// Note [CPU GEMM threads]
// oneDNN (Debian's build) would run its own parallel regions on OpenMP
// threads, a second pool beside core/parallel.h's. gemm_cpu never lets it:
// it splits C into tiles whose shape is a function of (m, n, k) alone
// (gemm_tiling), runs the tiles on core/parallel.h's pool with `threads`
// threads, and calls oneDNN on each tile with the OpenMP thread count of the
// calling thread set to 1 (restored afterwards). So:
//   - each C element is computed by one single-threaded oneDNN call whose
//     arguments do not depend on `threads`: results are bitwise identical for
//     any thread count (oneDNN's own threading would choose kernels and split
//     K by thread count);
//   - the thread count is the caller's `threads` (0: default_cpu_threads(),
//     i.e. MP_NUM_THREADS or the CPUs this process may run on), the same knob
//     as every other CPU loop, and no OpenMP worker ever spins beside them.
// Bits can differ between machines: oneDNN picks kernels by instruction set.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "kernels/gemm_problem.h"

namespace mp {

// How gemm_cpu multiplies two bf16 operands (Note [bf16 GEMMs on the CPU]).
enum class Bf16Gemm { kAuto, kNative, kWidened };

struct GemmOptions {
  int threads = 0;  // Note [CPU GEMM threads]; 0: default_cpu_threads()
  // kAuto: the process's choice (gemm_native_bf16()); kNative: EnforceError
  // where oneDNN has no bf16 kernel.
  Bf16Gemm bf16 = Bf16Gemm::kAuto;
  // fp32 scratch for inputs gemm_cpu copies first (bf16 widened where oneDNN
  // has no bf16 matmul; a B whose rows are a multiple of 4 KiB apart,
  // re-laid: Note [4K aliasing] in gemm.cc), at least
  // gemm_scratch_elements(problem) long. Null or too short: a buffer of the
  // calling thread that gemm_cpu grows as needed and keeps.
  float* scratch = nullptr;
  int64_t scratch_elements = 0;
};

// Throws EnforceError for a bad shape, leading dimension, dtype or pointer
// (naming the problem), or if oneDNN fails.
void gemm_cpu(const GemmProblem& problem, const GemmOptions& options = {});

// The fp32 scratch gemm_cpu needs for `problem`: 0 unless it copies an
// input first (about m k for A, k n for B).
//
// Memory: besides that scratch, each thread that runs tiles keeps a
// scratchpad for oneDNN (a few MB at most for the GPT's shapes), grown to the
// largest need and kept for the thread's life, so no call after the first
// few allocates or faults in pages.
int64_t gemm_scratch_elements(const GemmProblem& problem);

// Whether gemm_cpu hands bf16 operands to oneDNN as they are (Note [bf16
// GEMMs on the CPU]): the CPU has bf16 dot-product instructions and oneDNN a
// kernel for them (not a reference loop), or MP_CPU_BF16_GEMM=native.
// Decided once per process.
bool gemm_native_bf16();
// Whether oneDNN has a bf16 matmul kernel on this CPU (native or emulated).
bool gemm_bf16_kernel_available();
// Why bf16 GEMMs run as they do here, for the run log: e.g. "bf16 widened to
// fp32: this CPU has no bf16 dot-product instructions (avx512_bf16, AMX)".
const char* gemm_bf16_reason();

// The dtype gemm_cpu multiplies bf16 values in on this CPU: kBF16 where
// native, else kF32. A caller that holds bf16 values as fp32 (exactly) can
// pass them as fp32 there and skip the widening copy: the result is the same.
DType gemm_bf16_storage();

// How gemm_cpu splits C into tiles (Note [CPU GEMM threads]): tile_m rows by
// tile_n columns, the last ones possibly smaller. A function of the shape only.
struct GemmTiling {
  int64_t tile_m = 0, tile_n = 0;
};
GemmTiling gemm_tiling(int64_t m, int64_t n, int64_t k);

// "oneDNN 2.6.3 matmul, bf16 widened to fp32: ...": for logs and benchmarks.
const char* gemm_describe();

// The kernel family oneDNN runs the GPT's matmuls with in `dtype` (fp32 or
// bf16) on this CPU, as oneDNN names it: "brg:avx512_core_amx",
// "brg:avx512_core_bf16", "gemm:jit" (AVX2 or AVX-512 fp32), ...
std::string gemm_kernel(DType dtype);

}  // namespace mp
