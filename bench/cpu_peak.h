// bench/cpu_peak.h: the theoretical FMA peak of this CPU, the ceiling beside
// the measured GEMM peak (Note [GEMM peak reference] in bench/gemm_peak.h).
//
// peak = cores x clock x flops per cycle per core, where
//   - cores: the threads the job runs, capped at the physical cores they
//     may share (hyperthreads share FMA units);
//   - clock: the highest "cpu MHz" /proc/cpuinfo reports, the nominal
//     clock on the virtual machines seen (turbo may run above it, so a
//     measured GEMM can exceed this figure by the turbo ratio);
//   - flops per cycle, fp32: two FMA units of the widest vector the CPU
//     runs at full rate (Intel AVX-512: 2 x 16 lanes x 2 = 64; AMD family
//     25 runs AVX-512 on 256-bit units: 32; AVX2 + FMA: 32); bf16: twice
//     that with avx512_bf16 (vdpbf16ps: two products per fp32 lane), 1024
//     with AMX-BF16 (a 16 x 32 x 16 tile product per 16 cycles), and the
//     fp32 figure without either (bf16 GEMMs are widened to fp32 there:
//     Note [bf16 GEMMs on the CPU]).
// An upper bound by construction: CPUs with one AVX-512 FMA unit (some
// Xeon Silver and Bronze) peak at half.
#pragma once

#include <string>

#include "core/dtype.h"

namespace mp::bench {

struct CpuPeak {
  double gflops = 0;
  std::string basis;  // "2 cores x 2300 MHz x 64 flops/cycle (AVX-512 FMA, fp32)"
};

CpuPeak cpu_fma_peak(int threads, DType dtype);

}  // namespace mp::bench
