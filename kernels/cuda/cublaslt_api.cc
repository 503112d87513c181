#include "kernels/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include "core/error.h"

#ifndef MP_CUBLASLT_SONAME
#error "kernels/CMakeLists.txt defines MP_CUBLASLT_SONAME and MP_CUBLASLT_PATH for this file"
#endif

namespace mp {
namespace {

using detail::str;

template <class F>
void resolve(void* lib, const char* name, F& f, std::string& error) {
  void* sym = dlsym(lib, name);
  if (sym == nullptr) {
    if (error.empty()) error = str("libcublasLt has no symbol ", name);
    return;
  }
  f = reinterpret_cast<F>(sym);
}

CublasLt load_cublaslt() {
  CublasLt api;
  void* lib = nullptr;
  std::string tried;
  // The soname first (LD_LIBRARY_PATH, ld.so.conf), then the file CMake found.
  for (const char* name : {MP_CUBLASLT_SONAME, MP_CUBLASLT_PATH}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) {
      api.path = name;
      break;
    }
    const char* why = dlerror();
    tried += str(tried.empty() ? "" : "; ", why != nullptr ? why : name);
  }
  if (lib == nullptr) {
    api.error = str("cannot load cuBLASLt: ", tried);
    return api;
  }
  // Never closed: handles and plans may outlive any one user.
  resolve(lib, "cublasLtGetVersion", api.get_version, api.error);
  resolve(lib, "cublasLtCreate", api.create, api.error);
  resolve(lib, "cublasLtDestroy", api.destroy, api.error);
  resolve(lib, "cublasLtMatmulDescCreate", api.desc_create, api.error);
  resolve(lib, "cublasLtMatmulDescDestroy", api.desc_destroy, api.error);
  resolve(lib, "cublasLtMatmulDescSetAttribute", api.desc_set, api.error);
  resolve(lib, "cublasLtMatrixLayoutCreate", api.layout_create, api.error);
  resolve(lib, "cublasLtMatrixLayoutDestroy", api.layout_destroy, api.error);
  resolve(lib, "cublasLtMatmulPreferenceCreate", api.pref_create, api.error);
  resolve(lib, "cublasLtMatmulPreferenceDestroy", api.pref_destroy, api.error);
  resolve(lib, "cublasLtMatmulPreferenceSetAttribute", api.pref_set, api.error);
  resolve(lib, "cublasLtMatmulAlgoGetHeuristic", api.heuristic, api.error);
  resolve(lib, "cublasLtMatmulAlgoConfigGetAttribute", api.algo_config_get, api.error);
  resolve(lib, "cublasLtMatmul", api.matmul, api.error);
  if (api.error.empty() && api.get_version() / 10000 != CUBLAS_VER_MAJOR) {
    api.error = str(api.path, " is cuBLASLt ", api.get_version(), ", built against major version ",
                    CUBLAS_VER_MAJOR);
  }
  return api;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt api = load_cublaslt();  // thread-safe, once
  if (!api.error.empty()) MP_THROW(CudaError, api.error);
  return api;
}

}  // namespace mp
