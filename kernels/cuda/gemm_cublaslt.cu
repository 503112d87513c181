// kernels/cuda/gemm_cublaslt.cu: the cuBLASLt GEMM (Note [cuBLASLt GEMM] in
// gemm_cublaslt.h): cuBLASLt opened at run time, the plan cache and its
// forms, and the small kernels for what cuBLASLt does not do in a form
// (packing an operand to fp32: the bf16 side of a mixed pair, or a layout no
// algorithm takes; adding a bias: the k = 0 product, or a bias the epilogue
// cannot read; the GELU epilogue where no fused algorithm runs).
#include <cublasLt.h>
#include <dlfcn.h>

#include <algorithm>
#include <compare>
#include <map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/convert_math.h"
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/gpt_math.h"

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

// The least bias alignment the epilogue is given (llm.c's rule for cuBLASLt
// pointers; the heuristic also sees the bias's real alignment); a bias less
// aligned is added by bias_rows_kernel after the matmul.
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

// Launches bias_rows_kernel over C (see there).
void add_bias_rows(const GemmProblem& p, bool keep_c, cudaStream_t stream) {
  bias_rows_kernel<<<blocks_for(p.m * p.n), kThreads, 0, stream>>>(p.bias, p.m, p.n, p.c, p.ldc, keep_c);
  MP_CHECK_CUDA(cudaGetLastError());
}

// Launches gelu_epilogue_kernel over C and aux (see there).
void apply_gelu_epilogue(const GemmProblem& p, const GemmCudaOptions& o, cudaStream_t stream) {
  gelu_epilogue_kernel<<<blocks_for(p.m * p.n), kThreads, 0, stream>>>(o.epilogue, p.c, p.ldc, o.aux, o.aux_ld, p.m,
                                                                       p.n);
  MP_CHECK_CUDA(cudaGetLastError());
}

// ---- packing ------------------------------------------------------------------------

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

// The alignment a plan assumes of a packed operand: fresh device memory from
// any allocation routine is at least 256-byte aligned (CUDA C++ Programming
// Guide, device memory accesses); pack() checks it.
constexpr uint32_t kPackedAlignment = 256;

// Copies `x` (stored rows x cols) into fresh packed fp32 on the stream.
const float* pack(const GemmInput& x, Stored s, StreamScratch& scratch, cudaStream_t stream) {
  const int64_t bytes = std::max<int64_t>(s.rows * s.cols, 1) * static_cast<int64_t>(sizeof(float));
  scratch.stream = stream;
  MP_CHECK_CUDA(cudaMallocAsync(&scratch.p, static_cast<size_t>(bytes), stream));
  MP_ENFORCE(alignment(scratch.p) >= kPackedAlignment, "cudaMallocAsync gave ", scratch.p, ", not ",
             kPackedAlignment, "-byte aligned");
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

// ---- keys and forms -----------------------------------------------------------------

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
  bool gelu_by_kernel;
  auto operator<=>(const PlanKey&) const = default;
};

PlanKey plan_key(const GemmProblem& p, const GemmCudaOptions& o) {
  const bool gelu = o.epilogue != GemmEpilogue::kNone;
  return PlanKey{p.m,
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
                 o.allow_tf32,
                 alignment(p.a.data),
                 alignment(p.b.data),
                 alignment(p.c),
                 alignment(p.bias),
                 gelu ? alignment(o.aux) : 0,
                 o.epilogue,
                 gelu ? o.aux_ld : 0,
                 gelu && o.gelu_by_kernel};
}

// How a plan computes its problem: the operands first widened to packed fp32,
// and the parts of the epilogue cuBLASLt runs. The rest runs as kernels after
// the matmul: bias_rows_kernel, then gelu_epilogue_kernel.
struct Form {
  bool pack_a = false, pack_b = false;
  bool library_bias = false, library_gelu = false;
  bool operator==(const Form&) const = default;
};

// The forms a plan for `key` may take, best first (Note [cuBLASLt GEMM]).
std::vector<Form> forms_for(const PlanKey& key) {
  const bool mixed = key.a_dtype != key.b_dtype;
  const bool pack_a = mixed && key.a_dtype == DType::kBF16, pack_b = mixed && key.b_dtype == DType::kBF16;
  const bool has_bias = key.align_bias != 0, bias = has_bias && key.align_bias >= kBiasEpilogueAlignment;
  // cuBLASLt's GELU follows its bias: with a bias it cannot read, the GELU
  // runs as a kernel too, after bias_rows_kernel. Its DGELU never runs
  // (GemmEpilogue::kDGelu says why).
  const bool fused = key.epilogue == GemmEpilogue::kGelu && !key.gelu_by_kernel && (bias || !has_bias);
  std::vector<Form> forms;
  for (const Form f : {Form{pack_a, pack_b, bias, true}, Form{pack_a, pack_b, bias, false},
                       Form{pack_a, pack_b, false, false}, Form{true, true, false, false}}) {
    if (f.library_gelu && !fused) continue;
    if (std::find(forms.begin(), forms.end(), f) == forms.end()) forms.push_back(f);
  }
  return forms;
}

// The epilogue cuBLASLt runs in `form`.
uint32_t library_epilogue(const Form& form, GemmEpilogue epilogue) {
  if (form.library_gelu && epilogue == GemmEpilogue::kGelu) {
    return form.library_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  }
  return form.library_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

// What `form` leaves to kernels, after the matmul: the bias, then the GELU.
void kernel_epilogue(const Form& form, const GemmProblem& p, const GemmCudaOptions& o, cudaStream_t stream) {
  if (p.bias != nullptr && !form.library_bias) add_bias_rows(p, /*keep_c=*/true, stream);
  if (o.epilogue != GemmEpilogue::kNone && !form.library_gelu) apply_gelu_epilogue(p, o, stream);
}

// Statuses by which cublasLtMatmul says that it cannot run this
// configuration (cublasLt.h: not supported on this device, not for this
// architecture, parameters in conflict or impossible), as opposed to
// failing while it runs (CUBLAS_STATUS_EXECUTION_FAILED). A configuration is
// judged before anything of it runs, so such a call can run again in
// another form: C, even when accumulated into, is still untouched.
bool refused(cublasStatus_t status) {
  return status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_ARCH_MISMATCH ||
         status == CUBLAS_STATUS_INVALID_VALUE;
}

// ---- plans --------------------------------------------------------------------------

// One form of one key, ready to run: its descriptors and algorithm.
struct Plan {
  const CublasLt* api;
  size_t form_index;  // in forms_for(key)
  Form form;
  cublasLtMatmulDesc_t desc = nullptr;
  // cuBLASLt's A is our B and its B our A (Note [cuBLASLt GEMM]); C is also D.
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};

  Plan(const CublasLt& lt, size_t index, Form f) : api(&lt), form_index(index), form(f) {}
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

// Points the plan's descriptor at this call's bias and aux, as far as its
// epilogue reads them. Before the heuristic too: routines that do not
// dereference them, cublasLtMatmulAlgoGetHeuristic included, take the
// alignment they may assume from these pointers (cublasLt.h,
// CUBLASLT_MATMUL_DESC_BIAS_POINTER and _EPILOGUE_AUX_POINTER).
void set_epilogue_pointers(const Plan& plan, const GemmProblem& p, const GemmCudaOptions& o) {
  const CublasLt& api = *plan.api;
  if (plan.form.library_bias) {
    MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)), p);
  }
  if (plan.form.library_gelu) {
    void* aux = o.aux;
    MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)), p);
  }
}

// The plan's matmul descriptor: compute type, transposes, the epilogue
// cuBLASLt runs, and that epilogue's aux ld and pointers.
void create_descriptor(Plan& plan, const PlanKey& key, const GemmProblem& p, const GemmCudaOptions& o) {
  const CublasLt& api = *plan.api;
  // TF32 only where asked and both inputs really are fp32 values.
  const bool tf32 = key.tf32 && key.a_dtype == DType::kF32 && key.b_dtype == DType::kF32;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  MP_CHECK_CUBLAS_FOR(api.desc_create(&plan.desc, compute, CUDA_R_32F), p);
  const int32_t trans_a = key.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t trans_b = key.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint32_t epilogue = library_epilogue(plan.form, key.epilogue);
  MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)), p);
  MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)), p);
  MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), p);
  if (plan.form.library_gelu) {
    // The aux matrix has D's column-major shape [n, m]: its ld counts rows of n.
    const int64_t aux_ld = key.aux_ld;
    MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)), p);
  }
  set_epilogue_pointers(plan, p, o);
}

// The plan's column-major layouts: our B stored [rows, cols] is cuBLASLt's A
// [cols, rows], and so on; a packed operand has ld = its stored columns.
void create_layouts(Plan& plan, const PlanKey& key, const GemmProblem& p) {
  const CublasLt& api = *plan.api;
  const Stored sa = key.a_transposed ? Stored{key.k, key.m} : Stored{key.m, key.k};
  const Stored sb = key.b_transposed ? Stored{key.n, key.k} : Stored{key.k, key.n};
  const DType a_type = plan.form.pack_a ? DType::kF32 : key.a_dtype;
  const DType b_type = plan.form.pack_b ? DType::kF32 : key.b_dtype;
  const int64_t lda = plan.form.pack_a ? std::max<int64_t>(sa.cols, 1) : key.lda;
  const int64_t ldb = plan.form.pack_b ? std::max<int64_t>(sb.cols, 1) : key.ldb;
  MP_CHECK_CUBLAS_FOR(api.layout_create(&plan.layout_a, cuda_type(b_type), static_cast<uint64_t>(sb.cols),
                                        static_cast<uint64_t>(sb.rows), ldb),
                      p);
  MP_CHECK_CUBLAS_FOR(api.layout_create(&plan.layout_b, cuda_type(a_type), static_cast<uint64_t>(sa.cols),
                                        static_cast<uint64_t>(sa.rows), lda),
                      p);
  MP_CHECK_CUBLAS_FOR(api.layout_create(&plan.layout_c, CUDA_R_32F, static_cast<uint64_t>(key.n),
                                        static_cast<uint64_t>(key.m), key.ldc),
                      p);
}

// Asks the heuristic for the plan's algorithm under the alignment of its
// pointers: A, B, C and D through the preference (a packed operand's is
// kPackedAlignment), bias and aux through the descriptor. Returns
// CUBLAS_STATUS_SUCCESS when it gave one, else the reason it did not.
cublasStatus_t choose_algorithm(Plan& plan, cublasLtHandle_t handle, const PlanKey& key, int64_t workspace_bytes,
                                const GemmProblem& p) {
  const CublasLt& api = *plan.api;
  Preference pref{&api};
  MP_CHECK_CUBLAS_FOR(api.pref_create(&pref.pref), p);
  const auto ws = static_cast<uint64_t>(workspace_bytes);
  MP_CHECK_CUBLAS_FOR(api.pref_set(pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), p);
  const uint32_t align_a = plan.form.pack_a ? kPackedAlignment : key.align_a;
  const uint32_t align_b = plan.form.pack_b ? kPackedAlignment : key.align_b;
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
  for (const auto& [attr, bytes] : aligns) {
    MP_CHECK_CUBLAS_FOR(api.pref_set(pref.pref, attr, &bytes, sizeof(bytes)), p);
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = api.heuristic(handle, plan.desc, plan.layout_a, plan.layout_b, plan.layout_c,
                                              plan.layout_c, pref.pref, 1, &result, &found);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  // A result's fields are valid only when its state is success (cublasLt.h).
  if (found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (result.state != CUBLAS_STATUS_SUCCESS) return result.state;
  plan.algo = result.algo;
  return CUBLAS_STATUS_SUCCESS;
}

// The plan of the first form of `key`, from forms_for(key)[first] on, that
// the heuristic has an algorithm for. Throws CudaError naming the shape when
// none has.
std::unique_ptr<Plan> make_plan(const CublasLt& api, cublasLtHandle_t handle, const PlanKey& key, size_t first,
                                int64_t workspace_bytes, const GemmProblem& p, const GemmCudaOptions& o) {
  const std::vector<Form> forms = forms_for(key);
  cublasStatus_t why = CUBLAS_STATUS_NOT_SUPPORTED;
  for (size_t i = first; i < forms.size(); ++i) {
    auto plan = std::make_unique<Plan>(api, i, forms[i]);
    create_descriptor(*plan, key, p, o);
    create_layouts(*plan, key, p);
    why = choose_algorithm(*plan, handle, key, workspace_bytes, p);
    if (why == CUBLAS_STATUS_SUCCESS) return plan;
  }
  MP_THROW(CudaError, "cuBLASLt has no algorithm for a ", describe(p),
           ", not even with both operands packed to fp32 and the epilogue by kernels (last heuristic status ",
           static_cast<int>(why), ")");
}

// ---- problems -----------------------------------------------------------------------

// Throws EnforceError for a problem outside the GemmProblem contract, or an
// epilogue outside GemmCudaOptions'. `p` has m, n > 0.
void check_problem(const GemmProblem& p, const GemmCudaOptions& o) {
  MP_ENFORCE(p.c != nullptr && p.ldc >= p.n, "gemm output: ldc ", p.ldc, " for ", p.n, " columns");
  if (p.k > 0) {
    check_input(p.a, "A", p.m, p.k);
    check_input(p.b, "B", p.k, p.n);
  }
  const GemmEpilogue ep = o.epilogue;
  if (ep == GemmEpilogue::kNone) return;
  MP_ENFORCE(o.aux != nullptr && o.aux_ld >= p.n && o.aux_ld % 8 == 0 && alignment(o.aux) >= 16 && !p.accumulate &&
                 (ep == GemmEpilogue::kGelu || p.bias == nullptr),
             "gemm GELU epilogue: aux ", static_cast<const void*>(o.aux), " with ld ", o.aux_ld, " for ", describe(p),
             " (ld a multiple of 8 and >= n, 16-byte aligned, no accumulate, no bias with dgelu)");
}

// The k = 0 product: C = bias (or zeros), added to C when accumulating,
// then the GELU epilogue.
void run_without_product(const GemmProblem& p, const GemmCudaOptions& o, cudaStream_t stream) {
  add_bias_rows(p, /*keep_c=*/p.accumulate, stream);
  if (o.epilogue != GemmEpilogue::kNone) apply_gelu_epilogue(p, o, stream);
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

  // The matmul of `p` in the form of its key's plan (made on first use);
  // where cuBLASLt refuses the plan's algorithm, the plan is replaced by the
  // next form that has one, which runs instead, now and later. Returns the
  // form that ran.
  Form matmul(const PlanKey& key, const GemmProblem& p, const GemmCudaOptions& o, cudaStream_t stream);
  // Packs what the plan packs, points its descriptor at this call's bias and
  // aux, and enqueues the matmul; returns cuBLASLt's status.
  cublasStatus_t enqueue(const Plan& plan, const GemmProblem& p, const GemmCudaOptions& o, cudaStream_t stream);
};

Form GemmCuda::Impl::matmul(const PlanKey& key, const GemmProblem& p, const GemmCudaOptions& o, cudaStream_t stream) {
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_plan(*api, handle, key, 0, workspace_bytes, p, o)).first;
  std::unique_ptr<Plan>& plan = it->second;
  for (;;) {
    const cublasStatus_t status = enqueue(*plan, p, o, stream);
    if (status == CUBLAS_STATUS_SUCCESS) return plan->form;
    if (!refused(status) || plan->form_index + 1 == forms_for(key).size()) {
      detail::throw_cublas_error(str("cublasLtMatmul for a ", describe(p)).c_str(), static_cast<int>(status),
                                 __FILE__, __LINE__);
    }
    plan = make_plan(*api, handle, key, plan->form_index + 1, workspace_bytes, p, o);
  }
}

cublasStatus_t GemmCuda::Impl::enqueue(const Plan& plan, const GemmProblem& p, const GemmCudaOptions& o,
                                       cudaStream_t stream) {
  StreamScratch scratch_a, scratch_b;
  const void* a = plan.form.pack_a ? pack(p.a, stored(p.a, p.m, p.k), scratch_a, stream) : p.a.data;
  const void* b = plan.form.pack_b ? pack(p.b, stored(p.b, p.k, p.n), scratch_b, stream) : p.b.data;
  // This call's pointers: of the alignment class the plan was chosen for (the key).
  set_epilogue_pointers(plan, p, o);
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  return api->matmul(handle, plan.desc, &alpha, b, plan.layout_a, a, plan.layout_b, &beta, p.c, plan.layout_c, p.c,
                     plan.layout_c, &plan.algo, workspace, static_cast<size_t>(workspace_bytes), stream);
}

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
  check_problem(p, options);
  int current = -1;
  MP_CHECK_CUDA(cudaGetDevice(&current));
  MP_ENFORCE_EQ(current, impl_->device, "the current device must be the GemmCuda's");
  if (p.k == 0) {
    run_without_product(p, options, stream);
    return;
  }
  const Form ran = impl_->matmul(plan_key(p, options), p, options, stream);
  kernel_epilogue(ran, p, options, stream);
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
