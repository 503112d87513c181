// kernels/cuda/cublaslt_api.h (private to kernels/cuda): cuBLASLt, opened
// with dlopen on first use and never linked (Note [cuBLASLt GEMM] in
// gemm_cublaslt.h): the entry points the GEMM calls.
#pragma once

#include <cublasLt.h>

#include <string>

namespace mp {

struct CublasLt {
  decltype(&cublasLtGetVersion) get_version = nullptr;
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmulAlgoConfigGetAttribute) algo_config_get = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  std::string path;   // the library that was opened
  std::string error;  // why it could not be loaded; empty when it was
};

// cuBLASLt, loaded on the first call (thread-safe); throws CudaError naming
// what was tried when it cannot be.
const CublasLt& cublaslt();

}  // namespace mp
