// kernels/cpu/matmul.h: the rounding of a GEMM input to bf16 on the CPU (the models' GEMMs are gemm_cpu,
// kernels/cpu/gemm.h, through kernels/nn/gemm.h; the tests' matmul loops are tests/gpt_matmul.h).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mp {

// A GEMM input of fp32 or bf16 values (the GEMM ops of the tests,
// tests/gpt_matmul.h, take them).
struct GptGemmInput {
  const void* data = nullptr;
  DType dtype = DType::kF32;  // kF32 or kBF16
};

// out[i] := x[i] rounded to bf16 (nearest even), for a bf16 GEMM input:
// stored as bf16 (storage kBF16) or as the fp32 of the bf16 value (kF32,
// exact; gemm_bf16_storage() says which gemm_cpu multiplies faster).
// Returns the GEMM input that reads out.
GptGemmInput gpt_round_to_bf16(const float* x, int64_t n, DType storage, void* out, int threads);

}  // namespace mp
