// bench/suites.h: the suites mp_bench can run. Each is collective over the
// world and throws on failure (ConfigError for bad options); mp_bench's main
// decides the exit code.
#pragma once

#include "bench/bench.h"

namespace mp::bench {

// comm: MpiCommunicator collectives against the raw MPI calls (comm_bench.cc).
void run_comm_suite(const BenchContext& ctx);
// comm_gloo: the Gloo backend against the MPI backend (comm_bench.cc).
void run_comm_gloo_suite(const BenchContext& ctx);

// reduce_accuracy: kWire vs kFp32 error against the exact sum (accuracy_bench.cc).
void run_reduce_accuracy_suite(const BenchContext& ctx);

// update: the fused optimizer step vs a STREAM triad (update_bench.cc).
void run_update_suite(const BenchContext& ctx);

// update_cuda: the fused optimizer step on a CUDA device vs a device-to-
// device copy (update_cuda_bench.cc; CUDA builds only).
void run_update_cuda_suite(const BenchContext& ctx);

// gemm_cuda: every GEMM of a GPT-2 124M step at B = 4 and 16 through
// gemm_cuda, as the model runs it and as a plain fp32 product, vs the bf16
// GEMM peak on 8192^3 (gemm_cuda_bench.cc; CUDA builds only).
void run_gemm_cuda_suite(const BenchContext& ctx);

// step: one engine step per phase, overlapped vs serialized communication
// (step_bench.cc).
void run_step_suite(const BenchContext& ctx);

// gemm: gemm_cpu on the GPT-2 124M shapes vs the 2048^3 GEMM peak
// (gemm_bench.cc).
void run_gemm_suite(const BenchContext& ctx);

// gpt: GPT-2 124M and a small GPT trained through the engine: tokens/s and
// model FLOP/s vs the job's GEMM peak (gpt_bench.cc).
void run_gpt_suite(const BenchContext& ctx);

// muon: the time optimizer kind MUON adds to a GPT step against its
// Newton-Schulz FLOPs over the same run's GEMM peak (muon_bench.cc).
void run_muon_suite(const BenchContext& ctx);

// recipes: the default GPT trained under every precision recipe and
// strategy: loss, tokens/s, bytes per parameter (recipes_bench.cc).
void run_recipes_suite(const BenchContext& ctx);

// ckpt: checkpoint save and load GB/s vs plain write+fsync and read of the
// same bytes (ckpt_bench.cc).
void run_ckpt_suite(const BenchContext& ctx);

// ckpt_async: the cost of a save every 10 steps of GPT-2 124M training,
// synchronous vs asynchronous vs none (ckpt_async_bench.cc).
void run_ckpt_async_suite(const BenchContext& ctx);

}  // namespace mp::bench
