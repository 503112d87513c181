// kernels/cuda/gemm_cublaslt.cu: the cuBLASLt GEMM (Note [cuBLASLt GEMM] in
// gemm_cublaslt.h): keys and forms, plans with their timed algorithm, the
// report of new plans, and GemmCuda.
#include "kernels/cuda/gemm_cublaslt.h"

#include <algorithm>
#include <chrono>
#include <compare>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/cuda/cublaslt_api.h"
#include "kernels/cuda/gemm_kernels_cuda.h"
#include "kernels/gemm_choice.h"

namespace mp {
namespace {

using detail::str;

// ---- problem description -----------------------------------------------------------

std::string describe(const GemmProblem& p) {
  std::string s = str(p.m, " x ", p.n, " x ", p.k, ", ", dtype_name(p.a.dtype), p.a.transposed ? "^T" : "", " x ",
                       dtype_name(p.b.dtype), p.b.transposed ? "^T" : "", " -> ",
                       p.bf16_output() ? (p.c_dtype == DType::kBF16 ? "bf16" : "bf16 in fp32") : "fp32");
  if (p.bias != nullptr) s += ", bias";
  if (p.addend != nullptr) s += ", addend";
  if (p.accumulate) s += ", accumulate";
  if (p.epilogue == GemmEpilogue::kGelu) s += ", gelu";
  if (p.epilogue == GemmEpilogue::kDGelu) s += ", dgelu";
  if (p.bias_grad != nullptr) s += ", bias gradient";
  return s;
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

// Throws EnforceError for a problem outside the GemmProblem contract. m, n > 0.
void check_problem(const GemmProblem& p) {
  MP_ENFORCE(p.m == 0 || (p.c != nullptr && p.ldc >= p.n), "gemm output: ldc ", p.ldc, " for ", p.n, " columns");
  MP_ENFORCE(p.c_dtype == DType::kF32 || p.c_dtype == DType::kBF16, "gemm output in ", dtype_name(p.c_dtype));
  if (p.k > 0) {
    check_input(p.a, "A", p.m, p.k);
    check_input(p.b, "B", p.k, p.n);
  }
  const bool f32_c = p.c_dtype == DType::kF32 && !p.c_bf16;
  MP_ENFORCE(!p.accumulate || (f32_c && p.epilogue == GemmEpilogue::kNone && p.addend == nullptr),
             "gemm accumulate: only into an fp32 C without an epilogue or addend (", describe(p), ")");
  MP_ENFORCE(p.addend == nullptr || f32_c, "gemm addend: only with an fp32 C (", describe(p), ")");
  if (p.epilogue != GemmEpilogue::kNone) {
    MP_ENFORCE(p.aux != nullptr && p.aux_ld >= p.n, "gemm GELU epilogue: aux with ld ", p.aux_ld, " for ", p.n,
               " columns");
    MP_ENFORCE(p.epilogue == GemmEpilogue::kGelu || (p.bias == nullptr && p.addend == nullptr),
               "gemm DGELU epilogue: takes no bias and no addend");
  }
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

// ---- keys and forms -----------------------------------------------------------------

// Everything a plan depends on, the alignment class of every pointer an
// algorithm may assume aligned included (0 when absent).
struct PlanKey {
  int64_t m, n, k, lda, ldb, ldc, aux_ld;
  DType a_dtype, b_dtype, c_dtype;
  bool c_bf16, a_transposed, b_transposed, accumulate, tf32, by_kernel;
  GemmEpilogue epilogue;
  uint32_t align_a, align_b, align_c, align_bias, align_addend, align_aux, align_bias_grad;
  auto operator<=>(const PlanKey&) const = default;
};

PlanKey plan_key(const GemmProblem& p, const GemmCudaOptions& o) {
  const bool gelu = p.epilogue != GemmEpilogue::kNone;
  return PlanKey{p.m,
                 p.n,
                 p.k,
                 p.a.ld,
                 p.b.ld,
                 p.ldc,
                 gelu ? p.aux_ld : 0,
                 p.a.dtype,
                 p.b.dtype,
                 p.c_dtype,
                 p.c_bf16 && p.c_dtype == DType::kF32,
                 p.a.transposed,
                 p.b.transposed,
                 p.accumulate,
                 o.allow_tf32,
                 o.epilogue_by_kernel,
                 p.epilogue,
                 alignment(p.a.data),
                 alignment(p.b.data),
                 alignment(p.c),
                 alignment(p.bias),
                 alignment(p.addend),
                 gelu ? alignment(p.aux) : 0,
                 alignment(p.bias_grad)};
}

enum class FormKind : uint8_t { kFused, kKernels, kPacked };

// How a plan computes its problem: the operands packed to fp32 first, and
// whether cuBLASLt runs the epilogue (Note [cuBLASLt GEMM], forms).
struct Form {
  FormKind kind;
  bool pack_a, pack_b;
  bool operator==(const Form&) const = default;
};

std::string form_name(const Form& f) {
  const std::string packed = f.pack_a || f.pack_b ? str("packed to fp32 (", f.pack_a ? "A" : "",
                                                        f.pack_a && f.pack_b ? ", " : "", f.pack_b ? "B" : "", "), ")
                                                  : "";
  return packed + (f.kind == FormKind::kFused ? "fused in cuBLASLt's epilogue" : "product, then kernels");
}

// The forms a plan for `key` may take, best first (Note [cuBLASLt GEMM]).
std::vector<Form> forms_for(const PlanKey& key) {
  const bool mixed = key.a_dtype != key.b_dtype;
  const bool pack_a = mixed && key.a_dtype == DType::kBF16, pack_b = mixed && key.b_dtype == DType::kBF16;
  // cuBLASLt's DGELU is about 5e-5 relative off the float64 gradient (its
  // GELU derivative, measured on an H200): never fused. Its epilogue
  // vectors must be 16-byte aligned (a misaligned bias is a sticky fault).
  const auto aligned = [](uint32_t a) { return a == 0 || a >= 16; };
  const bool fusable = key.epilogue != GemmEpilogue::kDGelu && aligned(key.align_bias) &&
                       aligned(key.align_bias_grad) && aligned(key.align_aux);
  std::vector<Form> forms;
  if (!key.by_kernel && !key.c_bf16 && fusable) forms.push_back(Form{FormKind::kFused, pack_a, pack_b});
  forms.push_back(Form{FormKind::kKernels, pack_a, pack_b});
  // The last resort, for a layout or alignment no algorithm takes: the same
  // values as an fp32 product, slower; the plan's report names the form.
  if (!(pack_a && pack_b)) forms.push_back(Form{FormKind::kPacked, true, true});
  return forms;
}

// The epilogue cuBLASLt runs in the fused form.
uint32_t fused_epilogue(const PlanKey& key) {
  const bool bias = key.align_bias != 0;
  switch (key.epilogue) {
    case GemmEpilogue::kGelu: return bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmEpilogue::kDGelu:  // never fused (forms_for)
    case GemmEpilogue::kNone: break;
  }
  if (key.align_bias_grad != 0) return CUBLASLT_EPILOGUE_BGRADA;  // our op(B) is cuBLASLt's A
  return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
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
  // cuBLASLt's A is our B and its B our A (Note [cuBLASLt GEMM]); its C is
  // the addend (fused, with one) or our C, its D our C (fused) or the
  // product's fp32 scratch (the other forms).
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr, layout_d = nullptr;
  std::vector<cublasLtMatmulAlgo_t> candidates;
  cublasLtMatmulAlgo_t algo{};
  GemmPlanReport report;

  Plan(const CublasLt& lt, size_t index, Form f) : api(&lt), form_index(index), form(f) {}
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    for (cublasLtMatrixLayout_t l : {layout_d, layout_c, layout_b, layout_a}) {
      if (l != nullptr) api->layout_destroy(l);
    }
    if (desc != nullptr) api->desc_destroy(desc);
  }
  bool fused() const { return form.kind == FormKind::kFused; }
};

struct Preference {
  const CublasLt* api;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Preference() {
    if (pref != nullptr) api->pref_destroy(pref);
  }
};

cudaDataType_t cuda_type(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Points the plan's descriptor at this call's bias, aux and bias gradient,
// as far as its epilogue reads or writes them. Before the heuristic too:
// routines that do not dereference them, cublasLtMatmulAlgoGetHeuristic
// included, take the alignment they may assume from these pointers.
void set_epilogue_pointers(const Plan& plan, const GemmProblem& p) {
  if (!plan.fused()) return;
  const CublasLt& api = *plan.api;
  const void* bias = p.bias_grad != nullptr ? static_cast<const void*>(p.bias_grad) : p.bias;
  if (bias != nullptr) {
    MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), p);
  }
  if (p.epilogue != GemmEpilogue::kNone) {
    void* aux = p.aux;
    MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)), p);
  }
}

// The plan's matmul descriptor: compute type, transposes, and in the fused
// form the epilogue, its bias type (fp32), aux ld and pointers.
void create_descriptor(Plan& plan, const PlanKey& key, const GemmProblem& p) {
  const CublasLt& api = *plan.api;
  // TF32 only where asked and both inputs really are fp32 values.
  const bool tf32 = key.tf32 && key.a_dtype == DType::kF32 && key.b_dtype == DType::kF32;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  MP_CHECK_CUBLAS_FOR(api.desc_create(&plan.desc, compute, CUDA_R_32F), p);
  const int32_t trans_a = key.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t trans_b = key.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)), p);
  MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)), p);
  const uint32_t epilogue = plan.fused() ? fused_epilogue(key) : static_cast<uint32_t>(CUBLASLT_EPILOGUE_DEFAULT);
  MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), p);
  if (plan.fused() && (key.align_bias != 0 || key.align_bias_grad != 0)) {
    const int32_t bias_type = CUDA_R_32F;
    MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
                        p);
  }
  if (plan.fused() && key.epilogue != GemmEpilogue::kNone) {
    // The aux matrix has D's column-major shape [n, m]: its ld counts rows of n.
    const int64_t aux_ld = key.aux_ld;
    MP_CHECK_CUBLAS_FOR(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)), p);
  }
  set_epilogue_pointers(plan, p);
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
  const auto n = static_cast<uint64_t>(key.n), m = static_cast<uint64_t>(key.m);
  MP_CHECK_CUBLAS_FOR(api.layout_create(&plan.layout_a, cuda_type(b_type), static_cast<uint64_t>(sb.cols),
                                        static_cast<uint64_t>(sb.rows), ldb),
                      p);
  MP_CHECK_CUBLAS_FOR(api.layout_create(&plan.layout_b, cuda_type(a_type), static_cast<uint64_t>(sa.cols),
                                        static_cast<uint64_t>(sa.rows), lda),
                      p);
  // Fused: C and D in C's dtype with ldc (the addend has ldc too). Else the
  // product's dense fp32 scratch.
  const DType d_type = plan.fused() ? key.c_dtype : DType::kF32;
  const int64_t ld = plan.fused() ? key.ldc : key.n;
  MP_CHECK_CUBLAS_FOR(api.layout_create(&plan.layout_c, cuda_type(d_type), n, m, ld), p);
  MP_CHECK_CUBLAS_FOR(api.layout_create(&plan.layout_d, cuda_type(d_type), n, m, ld), p);
}

// The alignment a plan assumes of packed operands and of the product's
// scratch: fresh device memory from any allocation routine is at least
// 256-byte aligned (CUDA C++ Programming Guide, device memory accesses).
constexpr uint32_t kFreshAlignment = 256;

// Asks the heuristic for up to kGemmCandidates algorithms under the
// alignment of the plan's pointers. Returns CUBLAS_STATUS_SUCCESS when it
// gave at least one, else the reason it did not.
cublasStatus_t find_candidates(Plan& plan, cublasLtHandle_t handle, const PlanKey& key, int64_t workspace_bytes,
                               const GemmProblem& p) {
  const CublasLt& api = *plan.api;
  Preference pref{&api};
  MP_CHECK_CUBLAS_FOR(api.pref_create(&pref.pref), p);
  const auto ws = static_cast<uint64_t>(workspace_bytes);
  MP_CHECK_CUBLAS_FOR(api.pref_set(pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), p);
  const uint32_t align_a = plan.form.pack_a ? kFreshAlignment : key.align_a;
  const uint32_t align_b = plan.form.pack_b ? kFreshAlignment : key.align_b;
  const uint32_t align_d = plan.fused() ? key.align_c : kFreshAlignment;
  const uint32_t align_c = plan.fused() && key.align_addend != 0 ? key.align_addend : align_d;
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
  for (const auto& [attr, bytes] : aligns) {
    MP_CHECK_CUBLAS_FOR(api.pref_set(pref.pref, attr, &bytes, sizeof(bytes)), p);
  }
  cublasLtMatmulHeuristicResult_t results[kGemmCandidates] = {};
  int found = 0;
  const cublasStatus_t status = api.heuristic(handle, plan.desc, plan.layout_a, plan.layout_b, plan.layout_c,
                                              plan.layout_d, pref.pref, kGemmCandidates, results, &found);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  // A result's fields are valid only when its state is success (cublasLt.h).
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan.candidates.push_back(results[i].algo);
  }
  if (plan.candidates.empty()) return found == 0 ? CUBLAS_STATUS_NOT_SUPPORTED : results[0].state;
  plan.algo = plan.candidates.front();
  return CUBLAS_STATUS_SUCCESS;
}

int algorithm_id(const CublasLt& api, const cublasLtMatmulAlgo_t& algo) {
  int32_t id = -1;
  size_t written = 0;
  if (api.algo_config_get(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written) != CUBLAS_STATUS_SUCCESS) {
    return -1;
  }
  return id;
}

// ---- the report of new plans ---------------------------------------------------------

std::mutex g_report_mu;
std::vector<GemmPlanReport> g_new_plans;

void report(const GemmPlanReport& r) {
  std::lock_guard<std::mutex> lock(g_report_mu);
  g_new_plans.push_back(r);
}

// Device memory of a GemmCuda for the forms that run kernels (packed
// operands, the fp32 product, the bias gradient's partials): kept between
// calls, grown in stream order (the calls of one GemmCuda are ordered).
class StreamScratch {
 public:
  StreamScratch() = default;
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    if (p_ != nullptr) cudaFreeAsync(p_, stream_);
  }
  // At least `bytes`, 256-byte aligned, valid for work enqueued on `stream` after this call.
  char* reserve(int64_t bytes, cudaStream_t stream) {
    if (bytes > bytes_ || p_ == nullptr) {
      if (p_ != nullptr) MP_CHECK_CUDA(cudaFreeAsync(p_, stream_));
      p_ = nullptr;
      MP_CHECK_CUDA(cudaMallocAsync(&p_, static_cast<size_t>(std::max<int64_t>(bytes, 256)), stream));
      MP_ENFORCE(alignment(p_) >= kFreshAlignment, "cudaMallocAsync gave ", p_, ", not ", kFreshAlignment,
                 "-byte aligned");
      bytes_ = std::max<int64_t>(bytes, 256);
    }
    stream_ = stream;
    return static_cast<char*>(p_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  int64_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

int64_t round256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// The scratch of one call in `form`: its packed operands, its fp32
// product and its bias gradient's partials, each 256-byte aligned.
struct ScratchLayout {
  int64_t pack_a = 0, pack_b = 0, product = 0, bias_grad = 0;
  int64_t total() const { return pack_a + pack_b + product + bias_grad; }
};
ScratchLayout scratch_layout(const Form& form, const GemmProblem& p) {
  ScratchLayout l;
  const auto floats = [](Stored s) { return round256(s.rows * s.cols * static_cast<int64_t>(sizeof(float))); };
  if (form.pack_a) l.pack_a = floats(stored(p.a, p.m, p.k));
  if (form.pack_b) l.pack_b = floats(stored(p.b, p.k, p.n));
  if (form.kind != FormKind::kFused) {
    l.product = round256(p.m * p.n * static_cast<int64_t>(sizeof(float)));
    if (p.bias_grad != nullptr) l.bias_grad = round256(gemm_bias_grad_cuda_workspace_bytes(p));
  }
  return l;
}

// A plan's key as text: the GEMM choice book's key (Note [GEMM algorithm choice]).
std::string key_text(const PlanKey& k) {
  return str(k.m, 'x', k.n, 'x', k.k, " ld ", k.lda, ',', k.ldb, ',', k.ldc, ',', k.aux_ld, ' ', dtype_name(k.a_dtype),
             k.a_transposed ? "^T" : "", ' ', dtype_name(k.b_dtype), k.b_transposed ? "^T" : "", ' ',
             dtype_name(k.c_dtype), k.c_bf16 ? "(bf16)" : "", k.accumulate ? " acc" : "", k.tf32 ? " tf32" : "",
             k.by_kernel ? " by-kernel" : "", " epilogue ", static_cast<int>(k.epilogue), " align ", k.align_a, ',',
             k.align_b, ',', k.align_c, ',', k.align_bias, ',', k.align_addend, ',', k.align_aux, ',',
             k.align_bias_grad);
}

}  // namespace

// ---- GemmCuda -----------------------------------------------------------------------

struct GemmCuda::Impl {
  const CublasLt* api = nullptr;
  int device = 0;
  std::string identity;  // device and library, for the GEMM choice book
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  StreamScratch scratch;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;

  // The plan of the first form of `key` from forms_for(key)[first] on that
  // the heuristic has algorithms for, its candidate chosen and reported.
  // Throws CudaError naming the shape when none has.
  std::unique_ptr<Plan> make_plan(const PlanKey& key, size_t first, const GemmProblem& p, const GemmCudaOptions& o,
                                  cudaStream_t stream);
  // Runs `p` in `plan`'s form with algorithm `algo`; returns cuBLASLt's status.
  cublasStatus_t enqueue(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const GemmProblem& p, cudaStream_t stream);
  // Keeps one candidate (Note [GEMM algorithm choice]): the book's, else
  // chosen; fills the report's algorithm and TFLOP/s.
  void choose(Plan& plan, const PlanKey& key, const GemmProblem& p, bool deterministic, cudaStream_t stream);
  // Milliseconds of one run of `algo`; negative when cuBLASLt refused it.
  double time_ms(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const GemmProblem& p, cudaStream_t stream);
};

std::unique_ptr<Plan> GemmCuda::Impl::make_plan(const PlanKey& key, size_t first, const GemmProblem& p,
                                                const GemmCudaOptions& o, cudaStream_t stream) {
  const std::vector<Form> forms = forms_for(key);
  cublasStatus_t why = CUBLAS_STATUS_NOT_SUPPORTED;
  for (size_t i = first; i < forms.size(); ++i) {
    auto plan = std::make_unique<Plan>(*api, i, forms[i]);
    create_descriptor(*plan, key, p);
    create_layouts(*plan, key, p);
    why = find_candidates(*plan, handle, key, workspace_bytes, p);
    if (why != CUBLAS_STATUS_SUCCESS) continue;
    plan->report = GemmPlanReport{device, describe(p), form_name(plan->form), -1,
                                  static_cast<int>(plan->candidates.size()), 0.0};
    choose(*plan, key, p, o.deterministic || p.accumulate, stream);
    if (plan->candidates.empty()) continue;  // cuBLASLt refused every candidate when they ran
    report(plan->report);
    return plan;
  }
  MP_THROW(CudaError, "cuBLASLt has no algorithm for a ", describe(p),
           ", not even with both operands packed to fp32 and the epilogue by kernels (last heuristic status ",
           static_cast<int>(why), ")");
}

double GemmCuda::Impl::time_ms(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const GemmProblem& p,
                               cudaStream_t stream) {
  cudaEvent_t start = nullptr, stop = nullptr;
  MP_CHECK_CUDA(cudaEventCreate(&start));
  MP_CHECK_CUDA(cudaEventCreate(&stop));
  MP_CHECK_CUDA(cudaEventRecord(start, stream));
  const cublasStatus_t status = enqueue(plan, algo, p, stream);
  MP_CHECK_CUDA(cudaEventRecord(stop, stream));
  float ms = -1.0f;
  try {
    synchronize_event(stop, std::chrono::seconds(60), "timing cuBLASLt's candidates for a " + describe(p));
    if (status == CUBLAS_STATUS_SUCCESS) MP_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  } catch (...) {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    throw;
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  if (!refused(status) && status != CUBLAS_STATUS_SUCCESS) {
    detail::throw_cublas_error(str("cublasLtMatmul for a ", describe(p)).c_str(), static_cast<int>(status), __FILE__,
                               __LINE__);
  }
  return status == CUBLAS_STATUS_SUCCESS ? std::max(static_cast<double>(ms), 0.0) : -1.0;
}

void GemmCuda::Impl::choose(Plan& plan, const PlanKey& key, const GemmProblem& p, bool deterministic,
                            cudaStream_t stream) {
  const std::string book_key = str(form_name(plan.form), ": ", key_text(key));
  const int n = static_cast<int>(plan.candidates.size());
  int kept = -1;
  const std::optional<GemmChoice> recorded = gemm_choice_book().find(identity, book_key);
  if (recorded && recorded->candidate < n &&
      algorithm_id(*api, plan.candidates[static_cast<size_t>(recorded->candidate)]) == recorded->algorithm) {
    kept = recorded->candidate;
  } else {
    kept = choose_gemm_candidate(
        n, deterministic, [&](int i) { return time_ms(plan, plan.candidates[static_cast<size_t>(i)], p, stream); });
  }
  if (kept < 0) {
    plan.candidates.clear();
    return;
  }
  plan.algo = plan.candidates[static_cast<size_t>(kept)];
  plan.candidates = {plan.algo};
  plan.report.algorithm = algorithm_id(*api, plan.algo);
  gemm_choice_book().record(identity, book_key, GemmChoice{kept, plan.report.algorithm});
  if (!deterministic && !recorded) {
    const double ms = time_ms(plan, plan.algo, p, stream);
    const double flops = 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
    if (ms > 0) plan.report.tflops = flops / (ms * 1e-3) / 1e12;
  }
}

cublasStatus_t GemmCuda::Impl::enqueue(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const GemmProblem& p,
                                       cudaStream_t stream) {
  const ScratchLayout l = scratch_layout(plan.form, p);
  char* base = l.total() > 0 ? scratch.reserve(l.total(), stream) : nullptr;
  // x as stored (op(x) is [rows, cols]) packed to fp32 at `at`, ld its stored columns.
  const auto pack = [&](const GemmInput& x, int64_t rows, int64_t cols, char* at) -> const void* {
    const Stored s = stored(x, rows, cols);
    gemm_pack_fp32_cuda(x.data, x.dtype, x.ld, s.rows, s.cols, reinterpret_cast<float*>(at), stream);
    return at;
  };
  const void* a = plan.form.pack_a ? pack(p.a, p.m, p.k, base) : p.a.data;
  const void* b = plan.form.pack_b ? pack(p.b, p.k, p.n, base + l.pack_a) : p.b.data;
  // This call's pointers: of the alignment class the plan was chosen for (the key).
  set_epilogue_pointers(plan, p);
  // Fused: D is C, and cuBLASLt's C the addend or C itself (beta 1 where
  // accumulated or added into). Else D and cuBLASLt's C are the fp32 product.
  auto* product = reinterpret_cast<float*>(base + l.pack_a + l.pack_b);
  void* d = plan.fused() ? p.c : product;
  const void* c = plan.fused() && p.addend != nullptr ? static_cast<const void*>(p.addend) : d;
  const float alpha = 1.0f, beta = plan.fused() && (p.accumulate || p.addend != nullptr) ? 1.0f : 0.0f;
  const cublasStatus_t status =
      api->matmul(handle, plan.desc, &alpha, b, plan.layout_a, a, plan.layout_b, &beta, c, plan.layout_c, d,
                  plan.layout_d, &algo, workspace, static_cast<size_t>(workspace_bytes), stream);
  if (status != CUBLAS_STATUS_SUCCESS || plan.fused()) return status;
  gemm_epilogue_cuda(p, product, stream);
  if (p.bias_grad != nullptr) gemm_bias_grad_cuda(p, base + l.pack_a + l.pack_b + l.product, stream);
  return CUBLAS_STATUS_SUCCESS;
}

GemmCuda::GemmCuda(int device, int64_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  MP_ENFORCE(workspace_bytes >= 0, "cuBLASLt workspace of ", workspace_bytes, " bytes");
  impl_->api = &cublaslt();
  impl_->device = device;
  impl_->workspace_bytes = workspace_bytes;
  const CudaDeviceGuard scope(Device::cuda(device));
  cudaDeviceProp prop{};
  MP_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  impl_->identity = str(prop.name, ", sm_", prop.major, prop.minor, ", ", prop.multiProcessorCount, " SMs, cuBLASLt ",
                        impl_->api->get_version());
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
  if (p.n == 0 || (p.m == 0 && p.bias_grad == nullptr)) return;  // nothing to do, nothing read
  check_problem(p);
  int current = -1;
  MP_CHECK_CUDA(cudaGetDevice(&current));
  MP_ENFORCE_EQ(current, impl_->device, "the current device must be the GemmCuda's");
  if (p.m == 0 || p.k == 0) {  // no product: the kernels alone
    if (p.bias_grad != nullptr) {
      gemm_bias_grad_cuda(p, impl_->scratch.reserve(gemm_bias_grad_cuda_workspace_bytes(p), stream), stream);
    }
    if (p.m > 0) gemm_epilogue_cuda(p, nullptr, stream);
    return;
  }
  const PlanKey key = plan_key(p, options);
  auto it = impl_->plans.find(key);
  if (it == impl_->plans.end()) it = impl_->plans.emplace(key, impl_->make_plan(key, 0, p, options, stream)).first;
  std::unique_ptr<Plan>& plan = it->second;
  for (;;) {
    const cublasStatus_t status = impl_->enqueue(*plan, plan->algo, p, stream);
    if (status == CUBLAS_STATUS_SUCCESS) return;
    if (!refused(status) || plan->form_index + 1 == forms_for(key).size()) {
      detail::throw_cublas_error(str("cublasLtMatmul for a ", describe(p)).c_str(), static_cast<int>(status),
                                 __FILE__, __LINE__);
    }
    plan = impl_->make_plan(key, plan->form_index + 1, p, options, stream);
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

std::vector<std::string> gemm_cuda_forms(const GemmProblem& problem, const GemmCudaOptions& options) {
  std::vector<std::string> names;
  for (const Form& f : forms_for(plan_key(problem, options))) names.push_back(form_name(f));
  return names;
}

std::vector<GemmPlanReport> gemm_cuda_new_plans() {
  std::lock_guard<std::mutex> lock(g_report_mu);
  std::vector<GemmPlanReport> out;
  out.swap(g_new_plans);
  return out;
}

std::string gemm_cuda_describe() {
  const CublasLt& api = cublaslt();
  return str("cuBLASLt ", api.get_version(), " (", api.path, ")");
}

}  // namespace mp
