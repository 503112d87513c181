// kernels/cpu/newton_schulz.h: the Newton-Schulz orthogonalization of Muon
// (optim/muon.h) on the CPU, as torch.optim.Muon computes it
// (torch/optim/_muon.py, _zeropower_via_newtonschulz, PyTorch 2.15).
//
// Note [Newton-Schulz iteration]
// For G [rows, cols] (row-major fp32), with s the iteration dtype and
// round_s its rounding (nearest even; none for fp32):
//   X = round_s(G), transposed to [cols, rows] when rows > cols, so that X
//       is [m, n] with m = min(rows, cols) <= n;
//   d = max(round_s(||X||_F), round_s(eps));  X = round_s(X / d)
//   repeat steps times:
//     A = round_s(X X^T)                       [m, m]
//     B = round_s(b A + c (A A))               [m, m]
//     X = round_s(a X + B X)                   [m, n]
//   out = X, transposed back to [rows, cols].
// Every product accumulates in fp32 (gemm_cpu, kernels/cpu/gemm.h) and each
// line above rounds once at its end, after the scalar combination in fp32:
// what torch's bf16 matmul and addmm(beta, alpha) do on the CPU (one
// oneDNN call, alpha acc + beta C in fp32, one rounding to bf16). torch
// computes the norm of the bf16 X in fp32 and returns it as bf16 (a bf16
// tensor's norm() is bf16), clamps it with eps rounded to bf16 (clamp on a
// bf16 tensor), and divides in fp32 by that bf16 value; here the sum of
// squares is fp64 (grad_stats_cpu), so the bf16 norm can differ from
// torch's only where the fp32 norm lies within its accumulation error of a
// bf16 rounding boundary.
//
// The result is the quintic's approximation of U V^T (G = U S V^T): its
// singular values are not 1 but spread over about [0.7, 1.2] for the
// default coefficients (Keller Jordan's: they maximize the slope at zero).
//
// Deterministic: the GEMMs are gemm_cpu's (bitwise the same for any thread
// count), the element passes split rows between threads, and the norm's
// fp64 sum uses fixed blocks. Bits may differ between machines where oneDNN
// picks another kernel (gemm_cpu's Note [CPU GEMM threads]); bf16 operands
// go to oneDNN as bf16 where the CPU has bf16 dot products, else widened
// (Note [bf16 GEMMs on the CPU]).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/newton_schulz.h"

namespace mp {

// The fp32 elements of scratch newton_schulz_cpu needs for a [rows, cols]
// matrix: X [m, n], A and B [m, m] in the iteration dtype, an fp32 product
// [m, n], and the GEMMs' staging (gemm_scratch_elements).
int64_t newton_schulz_scratch_elements(int64_t rows, int64_t cols, const NewtonSchulzOptions& options);

// out = NS(g) (Note [Newton-Schulz iteration]); g and out are row-major
// [rows, cols] fp32 and may be the same array. In bf16 every element of out
// is a bf16 value. scratch: at least newton_schulz_scratch_elements long, or
// null for a buffer of the calling thread that grows as needed and is kept
// (no allocation after the first call of a shape). Throws EnforceError for a
// bad shape, option or a scratch too short.
void newton_schulz_cpu(const float* g, float* out, int64_t rows, int64_t cols, const NewtonSchulzOptions& options,
                       float* scratch = nullptr, int64_t scratch_elements = 0);

}  // namespace mp
