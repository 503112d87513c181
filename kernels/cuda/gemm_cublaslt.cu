// kernels/cuda/gemm_cublaslt.cu: the cuBLASLt GEMM (Note [cuBLASLt GEMM] in
// gemm_cublaslt.h): cuBLASLt opened at run time, the per-shape plan cache,
// and two small kernels for what cuBLASLt does not do (packing an operand
// to fp32: the bf16 side of a mixed pair, or a layout no algorithm takes;
// adding a bias: the k = 0 product, or a bias the epilogue cannot read).
#include "kernels/cuda/gemm_cublaslt.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <algorithm>
#include <compare>
#include <map>
#include <utility>

#include "kernels/convert_math.h"
#include "kernels/gpt_math.h"
#include "core/error.h"
#include "core/error_cuda.h"

#ifndef MP_CUBLASLT_SONAME
#error "kernels/CMakeLists.txt defines MP_CUBLASLT_SONAME and MP_CUBLASLT_PATH for this file"
#endif

namespace mp {
namespace {

using detail::str;

// ---- cuBLASLt, opened at run time ---------------------------------------------

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
  decltype(&cublasLtMatmul) matmul = nullptr;
  std::string path;   // the library that was opened
  std::string error;  // why it could not be loaded; empty when it was
};

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
  resolve(lib, "cublasLtMatmul", api.matmul, api.error);
  if (api.error.empty() && api.get_version() / 10000 != CUBLAS_VER_MAJOR) {
    api.error = str(api.path, " is cuBLASLt ", api.get_version(), ", built against major version ",
                    CUBLAS_VER_MAJOR);
  }
  return api;
}

// cuBLASLt, loaded on the first call; throws CudaError when it cannot be.
const CublasLt& cublaslt() {
  static const CublasLt api = load_cublaslt();  // thread-safe, once
  if (!api.error.empty()) MP_THROW(CudaError, api.error);
  return api;
}

// ---- problem description -----------------------------------------------------------

std::string describe(const GemmProblem& p) {
  const auto input = [](const GemmInput& x) {
    return str(dtype_name(x.dtype), " ld ", x.ld, x.transposed ? " transposed" : "");
  };
  return str(p.m, " x ", p.n, " x ", p.k, " gemm (A ", input(p.a), ", B ", input(p.b), ", ldc ", p.ldc,
             p.bias != nullptr ? ", bias" : "", p.accumulate ? ", accumulate" : "", ")");
}

// MP_CHECK_CUBLAS naming the problem.
#define MP_CHECK_CUBLAS_FOR(call, problem)                                                                \
  do {                                                                                                    \
    const int mp_cublas_rc_ = static_cast<int>(call);                                                     \
    if (mp_cublas_rc_ != 0) {                                                                             \
      ::mp::detail::throw_cublas_error(str(#call, " for a ", describe(problem)).c_str(), mp_cublas_rc_, \
                                       __FILE__, __LINE__);                                               \
    }                                                                                                     \
  } while (0)

// Stored shape of an operand: op(X) is [rows, cols]; X is stored [rows, cols]
// or, transposed, [cols, rows].
struct Stored {
  int64_t rows, cols;
};
Stored stored(const GemmInput& x, int64_t rows, int64_t cols) {
  return x.transposed ? Stored{cols, rows} : Stored{rows, cols};
}

void check_input(const GemmInput& x, const char* name, int64_t rows, int64_t cols) {
  const int64_t stored_cols = stored(x, rows, cols).cols;
  MP_ENFORCE(x.data != nullptr, "gemm input ", name, " is null");
  MP_ENFORCE(x.dtype == DType::kF32 || x.dtype == DType::kBF16, "gemm input ", name, " in ", dtype_name(x.dtype),
             ": need fp32 or bf16");
  MP_ENFORCE(x.ld >= std::max<int64_t>(stored_cols, 1), "gemm input ", name, ": leading dimension ", x.ld,
             " < its ", stored_cols, " stored columns");
}

// The alignment class of a pointer: the largest power of two up to 256 that
// divides the address (what an algorithm may assume of it); 0 for null.
uint32_t alignment(const void* p) {
  if (p == nullptr) return 0;
  const auto u = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && u % a != 0) a /= 2;
  return a;
}

// The bias alignment the epilogue is given (llm.c's rule for cuBLASLt
// pointers); a bias less aligned is added by bias_rows_kernel after the matmul.
constexpr uint32_t kBiasEpilogueAlignment = 16;

// ---- kernels ------------------------------------------------------------------------

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// dst[r, c] (packed, ld = cols) = src[r, c] (ld src_ld) as fp32 (exact).
template <class T>
__global__ void pack_fp32_kernel(const T* src, int64_t src_ld, int64_t rows, int64_t cols, float* dst) {
  const int64_t n = rows * cols, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / cols, c = i % cols;
    dst[i] = math::to_f32(src[r * src_ld + c]);
  }
}

// c[i, j] = bias[j] (or 0), added to c when keep_c: the k = 0 product, and
// c += bias after a matmul whose bias the epilogue could not read.
__global__ void bias_rows_kernel(const float* bias, int64_t m, int64_t n, float* c, int64_t ldc, bool keep_c) {
  const int64_t count = m * n, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t r = i / n, j = i % n;
    const float v = bias != nullptr ? bias[j] : 0.0f;
    float* out = c + r * ldc + j;
    *out = keep_c ? *out + v : v;
  }
}

// The GELU epilogue by a kernel after the plain product (and bias): kGelu
// aux := c, c := gelu(c); kDGelu c := c * gelu'(aux).
__global__ void gelu_epilogue_kernel(GemmEpilogue epilogue, float* c, int64_t ldc, float* aux, int64_t aux_ld,
                                     int64_t m, int64_t n) {
  const int64_t count = m * n, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t r = i / n, j = i % n;
    float* out = c + r * ldc + j;
    float* pre = aux + r * aux_ld + j;
    if (epilogue == GemmEpilogue::kGelu) {
      *pre = *out;
      *out = math::gelu(*out);
    } else {
      *out = *out * math::gelu_grad(*pre);
    }
  }
}

// ---- plans --------------------------------------------------------------------------

// Everything a plan depends on, the alignment class of every pointer an
// algorithm may assume aligned included (A, B, C = D, bias, aux; 0 when
// absent): a plan chosen for aligned pointers is never run on less aligned ones.
struct PlanKey {
  int64_t m, n, k, lda, ldb, ldc;
  DType a_dtype, b_dtype;
  bool a_transposed, b_transposed, accumulate, tf32;
  uint32_t align_a, align_b, align_c, align_bias, align_aux;
  GemmEpilogue epilogue;
  int64_t aux_ld;
  auto operator<=>(const PlanKey&) const = default;
};

struct Plan {
  const CublasLt* api = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  // cuBLASLt's A is our B and its B our A (Note [cuBLASLt GEMM]); C is also D.
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool pack_a = false, pack_b = false;  // operand copied to packed fp32 first
  bool epilogue_by_kernel = false;      // the key's GELU epilogue runs as gelu_epilogue_kernel

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (layout_c != nullptr) api->layout_destroy(layout_c);
    if (layout_b != nullptr) api->layout_destroy(layout_b);
    if (layout_a != nullptr) api->layout_destroy(layout_a);
    if (desc != nullptr) api->desc_destroy(desc);
  }
};

struct Preference {
  const CublasLt* api;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Preference() {
    if (pref != nullptr) api->pref_destroy(pref);
  }
};

cudaDataType_t cuda_type(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Whether cuBLASLt's epilogue adds the key's bias (else bias_rows_kernel does).
bool bias_in_library(const PlanKey& key) { return key.align_bias >= kBiasEpilogueAlignment; }

// Points the descriptor at this call's bias and aux, as far as its epilogue
// reads them. Before the heuristic too: routines that do not dereference
// them, cublasLtMatmulAlgoGetHeuristic included, take their alignment from
// these pointers (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER).
void set_epilogue_pointers(const CublasLt& api, cublasLtMatmulDesc_t desc, bool bias, bool gelu,
                           const GemmProblem& p, const GemmCudaOptions& options) {
  if (bias) MP_CHECK_CUBLAS_FOR(api.desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)), p);
  if (gelu) {
    void* aux = options.aux;
    MP_CHECK_CUBLAS_FOR(api.desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)), p);
  }
}

// The plan for `key`, with the operands flagged packed taken as packed
// fp32 (256-byte aligned); null when cuBLASLt has no algorithm for it (or, with `may_fail`,
// when the heuristic refuses the layout in any way).
// With `gelu_in_library` false the key's GELU epilogue is left out of the
// descriptor (run() then applies it by a kernel).
std::unique_ptr<Plan> make_plan(const CublasLt& api, cublasLtHandle_t handle, const PlanKey& key, bool pack_a,
                                bool pack_b, bool may_fail, int64_t workspace_bytes, const GemmProblem& problem,
                                const GemmCudaOptions& options, bool gelu_in_library = true) {
  auto plan = std::make_unique<Plan>();
  plan->api = &api;
  plan->pack_a = pack_a;
  plan->pack_b = pack_b;
  plan->epilogue_by_kernel = key.epilogue != GemmEpilogue::kNone && !gelu_in_library;
  const Stored sa = key.a_transposed ? Stored{key.k, key.m} : Stored{key.m, key.k};
  const Stored sb = key.b_transposed ? Stored{key.n, key.k} : Stored{key.k, key.n};
  const DType a_type = pack_a ? DType::kF32 : key.a_dtype, b_type = pack_b ? DType::kF32 : key.b_dtype;
  const int64_t lda = pack_a ? std::max<int64_t>(sa.cols, 1) : key.lda;
  const int64_t ldb = pack_b ? std::max<int64_t>(sb.cols, 1) : key.ldb;
  const uint32_t align_a = pack_a ? 256 : key.align_a, align_b = pack_b ? 256 : key.align_b;

  // TF32 only where asked and both inputs really are fp32 values.
  const bool tf32 = key.tf32 && key.a_dtype == DType::kF32 && key.b_dtype == DType::kF32;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  MP_CHECK_CUBLAS_FOR(api.desc_create(&plan->desc, compute, CUDA_R_32F), problem);
  const int32_t trans_a = key.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t trans_b = key.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const bool bias_epilogue = bias_in_library(key);
  uint32_t epilogue = bias_epilogue ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (gelu_in_library && key.epilogue == GemmEpilogue::kGelu) {
    epilogue = bias_epilogue ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  } else if (gelu_in_library && key.epilogue == GemmEpilogue::kDGelu) {
    epilogue = CUBLASLT_EPILOGUE_DGELU;
  }
  MP_CHECK_CUBLAS_FOR(api.desc_set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)), problem);
  MP_CHECK_CUBLAS_FOR(api.desc_set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)), problem);
  MP_CHECK_CUBLAS_FOR(api.desc_set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
                      problem);
  if (gelu_in_library && key.epilogue != GemmEpilogue::kNone) {
    // The aux matrix has C's column-major shape [n, m]: its ld counts rows of n.
    const int64_t aux_ld = key.aux_ld;
    MP_CHECK_CUBLAS_FOR(api.desc_set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)),
                        problem);
  }
  set_epilogue_pointers(api, plan->desc, bias_epilogue, !plan->epilogue_by_kernel && key.epilogue != GemmEpilogue::kNone,
                        problem, options);

  // Column-major views: our B stored [sb.rows, sb.cols] is [sb.cols, sb.rows].
  MP_CHECK_CUBLAS_FOR(api.layout_create(&plan->layout_a, cuda_type(b_type), static_cast<uint64_t>(sb.cols),
                                        static_cast<uint64_t>(sb.rows), ldb),
                      problem);
  MP_CHECK_CUBLAS_FOR(api.layout_create(&plan->layout_b, cuda_type(a_type), static_cast<uint64_t>(sa.cols),
                                        static_cast<uint64_t>(sa.rows), lda),
                      problem);
  MP_CHECK_CUBLAS_FOR(api.layout_create(&plan->layout_c, CUDA_R_32F, static_cast<uint64_t>(key.n),
                                        static_cast<uint64_t>(key.m), key.ldc),
                      problem);

  Preference pref{&api};
  MP_CHECK_CUBLAS_FOR(api.pref_create(&pref.pref), problem);
  const auto ws = static_cast<uint64_t>(workspace_bytes);
  MP_CHECK_CUBLAS_FOR(api.pref_set(pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), problem);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
  for (const auto& [attr, bytes] : aligns) {
    MP_CHECK_CUBLAS_FOR(api.pref_set(pref.pref, attr, &bytes, sizeof(bytes)), problem);
  }

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = api.heuristic(handle, plan->desc, plan->layout_a, plan->layout_b, plan->layout_c,
                                              plan->layout_c, pref.pref, 1, &result, &found);
  // A result's fields are valid only when its state is success (cublasLt.h).
  if (status == CUBLAS_STATUS_NOT_SUPPORTED ||
      (status == CUBLAS_STATUS_SUCCESS && (found == 0 || result.state != CUBLAS_STATUS_SUCCESS)) ||
      (may_fail && status != CUBLAS_STATUS_SUCCESS)) {
    return nullptr;
  }
  MP_CHECK_CUBLAS_FOR(status, problem);
  plan->algo = result.algo;
  return plan;
}

// Device memory freed on the stream when it goes out of scope.
struct StreamScratch {
  void* p = nullptr;
  cudaStream_t stream = nullptr;
  StreamScratch() = default;
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    if (p != nullptr) cudaFreeAsync(p, stream);
  }
};

// Copies `x` (stored rows x cols) into fresh packed fp32 on the stream.
const float* pack(const GemmInput& x, Stored s, StreamScratch& scratch, cudaStream_t stream) {
  const int64_t bytes = std::max<int64_t>(s.rows * s.cols, 1) * static_cast<int64_t>(sizeof(float));
  scratch.stream = stream;
  MP_CHECK_CUDA(cudaMallocAsync(&scratch.p, static_cast<size_t>(bytes), stream));
  auto* dst = static_cast<float*>(scratch.p);
  if (x.dtype == DType::kBF16) {
    pack_fp32_kernel<<<blocks_for(s.rows * s.cols), kThreads, 0, stream>>>(static_cast<const bf16*>(x.data), x.ld,
                                                                           s.rows, s.cols, dst);
  } else {
    pack_fp32_kernel<<<blocks_for(s.rows * s.cols), kThreads, 0, stream>>>(static_cast<const float*>(x.data), x.ld,
                                                                           s.rows, s.cols, dst);
  }
  MP_CHECK_CUDA(cudaGetLastError());
  return dst;
}

// Makes `device` current for a scope.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    MP_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) MP_CHECK_CUDA(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

// ---- GemmCuda -----------------------------------------------------------------------

struct GemmCuda::Impl {
  const CublasLt* api = nullptr;
  int device = 0;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

GemmCuda::GemmCuda(int device, int64_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  MP_ENFORCE(workspace_bytes >= 0, "cuBLASLt workspace of ", workspace_bytes, " bytes");
  impl_->api = &cublaslt();
  impl_->device = device;
  impl_->workspace_bytes = workspace_bytes;
  const DeviceScope scope(device);
  MP_CHECK_CUBLAS(impl_->api->create(&impl_->handle));
  if (workspace_bytes > 0) {
    const cudaError_t rc = cudaMalloc(&impl_->workspace, static_cast<size_t>(workspace_bytes));
    if (rc != cudaSuccess) {
      impl_->api->destroy(impl_->handle);
      MP_CHECK_CUDA(rc);
    }
  }
}

GemmCuda::~GemmCuda() {
  impl_->plans.clear();
  if (impl_->workspace != nullptr) cudaFree(impl_->workspace);  // errors at process exit are moot
  if (impl_->handle != nullptr) impl_->api->destroy(impl_->handle);
}

int GemmCuda::device() const { return impl_->device; }

int64_t GemmCuda::cached_plans() const { return static_cast<int64_t>(impl_->plans.size()); }

void GemmCuda::run(const GemmProblem& p, cudaStream_t stream, const GemmCudaOptions& options) {
  MP_ENFORCE(p.m >= 0 && p.n >= 0 && p.k >= 0, "gemm shape ", p.m, " x ", p.n, " x ", p.k);
  if (p.m == 0 || p.n == 0) return;
  MP_ENFORCE(p.c != nullptr && p.ldc >= p.n, "gemm output: ldc ", p.ldc, " for ", p.n, " columns");
  int current = -1;
  MP_CHECK_CUDA(cudaGetDevice(&current));
  MP_ENFORCE_EQ(current, impl_->device, "the current device must be the GemmCuda's");
  if (p.k == 0) {
    bias_rows_kernel<<<blocks_for(p.m * p.n), kThreads, 0, stream>>>(p.bias, p.m, p.n, p.c, p.ldc, p.accumulate);
    MP_CHECK_CUDA(cudaGetLastError());
    return;
  }
  check_input(p.a, "A", p.m, p.k);
  check_input(p.b, "B", p.k, p.n);

  const GemmEpilogue ep = options.epilogue;
  if (ep != GemmEpilogue::kNone) {
    MP_ENFORCE(options.aux != nullptr && options.aux_ld >= p.n && options.aux_ld % 8 == 0 &&
                   alignment(options.aux) >= 16 && !p.accumulate && (ep == GemmEpilogue::kGelu || p.bias == nullptr),
               "gemm GELU epilogue: aux ", static_cast<const void*>(options.aux), " with ld ", options.aux_ld, " for ",
               describe(p), " (ld a multiple of 8 and >= n, 16-byte aligned, no accumulate, no bias with dgelu)");
  }
  const PlanKey key{p.m,
                    p.n,
                    p.k,
                    p.a.ld,
                    p.b.ld,
                    p.ldc,
                    p.a.dtype,
                    p.b.dtype,
                    p.a.transposed,
                    p.b.transposed,
                    p.accumulate,
                    options.allow_tf32,
                    alignment(p.a.data),
                    alignment(p.b.data),
                    alignment(p.c),
                    alignment(p.bias),
                    ep == GemmEpilogue::kNone ? 0 : alignment(options.aux),
                    ep,
                    ep == GemmEpilogue::kNone ? 0 : options.aux_ld};
  const bool bias_epilogue = bias_in_library(key);
  // cuBLASLt's GELU follows its bias: with a bias it cannot read, the GELU
  // too runs as a kernel, after bias_rows_kernel.
  const bool library_gelu = ep != GemmEpilogue::kGelu || p.bias == nullptr || bias_epilogue;
  auto found = impl_->plans.find(key);
  if (found == impl_->plans.end()) {
    const CublasLt& api = *impl_->api;
    const bool mixed = p.a.dtype != p.b.dtype;
    // The operands as they are (a mixed pair packs its bf16 side); where no
    // algorithm takes that layout or alignment, both packed to fp32.
    std::unique_ptr<Plan> made = make_plan(api, impl_->handle, key, mixed && p.a.dtype == DType::kBF16,
                                           mixed && p.b.dtype == DType::kBF16, true, impl_->workspace_bytes, p,
                                           options, library_gelu);
    if (made == nullptr && ep != GemmEpilogue::kNone) {  // no fused algorithm: the GELU by a kernel after
      made = make_plan(api, impl_->handle, key, mixed && p.a.dtype == DType::kBF16, mixed && p.b.dtype == DType::kBF16,
                       true, impl_->workspace_bytes, p, options, /*gelu_in_library=*/false);
    }
    if (made == nullptr) {
      made = make_plan(api, impl_->handle, key, true, true, false, impl_->workspace_bytes, p, options,
                       /*gelu_in_library=*/false);
    }
    if (made == nullptr) MP_THROW(CudaError, "cuBLASLt has no algorithm for a ", describe(p));
    found = impl_->plans.emplace(key, std::move(made)).first;
  }
  Plan* plan = found->second.get();

  StreamScratch scratch_a, scratch_b;
  const void* a = plan->pack_a ? pack(p.a, stored(p.a, p.m, p.k), scratch_a, stream) : p.a.data;
  const void* b = plan->pack_b ? pack(p.b, stored(p.b, p.k, p.n), scratch_b, stream) : p.b.data;
  const CublasLt& api = *impl_->api;
  // This call's pointers: of the alignment class the plan was chosen for (the key).
  set_epilogue_pointers(api, plan->desc, bias_epilogue, ep != GemmEpilogue::kNone && !plan->epilogue_by_kernel, p,
                        options);
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  MP_CHECK_CUBLAS_FOR(api.matmul(impl_->handle, plan->desc, &alpha, b, plan->layout_a, a, plan->layout_b, &beta,
                                 p.c, plan->layout_c, p.c, plan->layout_c, &plan->algo, impl_->workspace,
                                 static_cast<size_t>(impl_->workspace_bytes), stream),
                      p);
  if (p.bias != nullptr && !bias_epilogue) {
    bias_rows_kernel<<<blocks_for(p.m * p.n), kThreads, 0, stream>>>(p.bias, p.m, p.n, p.c, p.ldc, true);
    MP_CHECK_CUDA(cudaGetLastError());
  }
  if (plan->epilogue_by_kernel) {
    gelu_epilogue_kernel<<<blocks_for(p.m * p.n), kThreads, 0, stream>>>(ep, p.c, p.ldc, options.aux, options.aux_ld,
                                                                         p.m, p.n);
    MP_CHECK_CUDA(cudaGetLastError());
  }
}

void gemm_cuda(const GemmProblem& problem, cudaStream_t stream, const GemmCudaOptions& options) {
  thread_local std::map<std::pair<int, cudaStream_t>, std::unique_ptr<GemmCuda>> per_stream;
  int device = -1;
  MP_CHECK_CUDA(cudaGetDevice(&device));
  std::unique_ptr<GemmCuda>& gemm = per_stream[{device, stream}];
  if (gemm == nullptr) gemm = std::make_unique<GemmCuda>(device);
  gemm->run(problem, stream, options);
}

std::string gemm_cuda_describe() {
  const CublasLt& api = cublaslt();
  return str("cuBLASLt ", api.get_version(), " (", api.path, ")");
}

}  // namespace mp
