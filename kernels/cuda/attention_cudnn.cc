// kernels/cuda/attention_cudnn.cc: the cuDNN attention (Note [cuDNN
// attention] in attention_cudnn.h): cuDNN opened at run time, the forward and
// backward SDPA graphs built through the cuDNN frontend on the tensors of
// sdpa_layout(), their cache, and their execution. Host code only (no
// kernels); the one translation unit that includes the frontend, whose
// templates take most of a minute to compile.
#include "kernels/cuda/attention_cudnn.h"

#include <cudnn_frontend.h>
#include <dlfcn.h>
#include <link.h>

#include <cmath>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/error_cuda.h"

#if !defined(MP_CUDNN_SONAME) || !defined(MP_CUDNN_PATH) || !defined(MP_CUDART_PATH)
#error "kernels/CMakeLists.txt defines MP_CUDNN_SONAME, MP_CUDNN_PATH and MP_CUDART_PATH for this file"
#endif
#ifndef NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#error "the cuDNN frontend must reach cuDNN through dlopen (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)"
#endif

// core/error_cuda.cc names cuDNN statuses by these categories without cuDNN's headers.
static_assert(CUDNN_STATUS_NOT_INITIALIZED / 1000 == 1 && CUDNN_STATUS_BAD_PARAM / 1000 == 2 &&
                  CUDNN_STATUS_NOT_SUPPORTED / 1000 == 3 && CUDNN_STATUS_INTERNAL_ERROR / 1000 == 4 &&
                  CUDNN_STATUS_EXECUTION_FAILED / 1000 == 5,
              "cuDNN's status categories changed: update cudnn_status_category in core/error_cuda.cc");

// The frontend reaches cuDNN through this handle (cudnn_frontend_shim.h);
// cudnn_library() sets it before any frontend call.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace mp {
namespace {

namespace fe = cudnn_frontend;
using detail::str;

// ---- cuDNN, opened at run time -------------------------------------------------------

struct CudnnLibrary {
  std::string path;    // the library that was opened
  size_t version = 0;  // cudnnGetVersion(), e.g. 91900
  std::string error;   // why it could not be loaded; empty when it was
};

CudnnLibrary open_cudnn() {
  CudnnLibrary lib;
  // The frontend's own CUDA runtime calls (device properties, the memsets of
  // its workspace) go through libcudart.so.<major>, which it opens by soname:
  // the toolkit's, opened here by path first, answers that name even where
  // the toolkit's folder is not on the loader's path. Best effort: if it
  // fails, the frontend's own search decides and its error is reported.
  if (MP_CUDART_PATH[0] != '\0' && dlopen(MP_CUDART_PATH, RTLD_NOW | RTLD_LOCAL) == nullptr) dlerror();
  void* handle = nullptr;
  std::string tried;
  // The soname first (LD_LIBRARY_PATH, ld.so.conf), then the file CMake found.
  for (const char* name : {MP_CUDNN_SONAME, MP_CUDNN_PATH}) {
    if (name[0] == '\0') continue;
    handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      lib.path = name;
      break;
    }
    const char* why = dlerror();
    tried += str(tried.empty() ? "" : "; ", why != nullptr ? why : name);
  }
  if (handle == nullptr) {
    lib.error = str("cannot load cuDNN (", MP_CUDNN_SONAME, "): ", tried,
                    "; put the folder that holds it on LD_LIBRARY_PATH (e.g. PyTorch's nvidia/cudnn/lib)");
    return lib;
  }
  // The file the loader resolved the name to, for the run log.
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && *map->l_name) {
    lib.path = map->l_name;
  }
  // Never closed: graphs and handles live as long as the process.
  fe::cudnn_dlhandle = handle;
  try {
    lib.version = fe::detail::get_backend_version();
  } catch (const std::exception& e) {
    lib.error = str(lib.path, " is not cuDNN: ", e.what());
    return lib;
  }
  if (lib.version / 10000 != CUDNN_MAJOR) {
    lib.error = str(lib.path, " is cuDNN ", lib.version, ", built against major version ", CUDNN_MAJOR);
  }
  return lib;
}

// cuDNN, loaded on the first call (its error set when it cannot be).
const CudnnLibrary& cudnn_library_state() {
  static const CudnnLibrary lib = open_cudnn();  // thread-safe, once
  return lib;
}

// The same; throws CudaError when cuDNN cannot be loaded.
const CudnnLibrary& cudnn_library() {
  const CudnnLibrary& lib = cudnn_library_state();
  if (!lib.error.empty()) MP_THROW(CudaError, lib.error);
  return lib;
}

// ---- graphs --------------------------------------------------------------------------

// The tensors' ids in the graphs and their variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

using Graph = fe::graph::Graph;
using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

std::vector<int64_t> vec(const std::array<int64_t, 4>& a) { return {a.begin(), a.end()}; }

// A tensor of `g` (bf16 unless the graph's io type is overridden) over `t`.
Tensor input(Graph& g, const char* name, Uid uid, const SdpaTensorLayout& t) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(vec(t.dims)).set_stride(vec(t.strides)));
}
void set_output(const Tensor& tensor, Uid uid, const SdpaTensorLayout& t) {
  tensor->set_output(true).set_uid(uid).set_dim(vec(t.dims)).set_stride(vec(t.strides));
}

std::shared_ptr<Graph> new_graph() {
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

float attention_scale(const SdpaShape& s) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
}

std::shared_ptr<Graph> forward_graph(const SdpaShape& s) {
  const SdpaLayout l = sdpa_layout(s);
  auto g = new_graph();
  const Tensor q = input(*g, "q", kQ, l.q), k = input(*g, "k", kK, l.k), v = input(*g, "v", kV, l.v);
  auto options = fe::graph::SDPA_attributes()
                     .set_name("causal_attention")
                     .set_generate_stats(true)
                     .set_causal_mask(true)
                     .set_attn_scale(attention_scale(s));
  auto [o, stats] = g->sdpa(q, k, v, options);
  set_output(o, kO, l.o);
  set_output(stats, kStats, l.stats);
  stats->set_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<Graph> backward_graph(const SdpaShape& s) {
  const SdpaLayout l = sdpa_layout(s);
  auto g = new_graph();
  const Tensor q = input(*g, "q", kQ, l.q), k = input(*g, "k", kK, l.k), v = input(*g, "v", kV, l.v);
  const Tensor o = input(*g, "o", kO, l.o), d_o = input(*g, "d_o", kDO, l.d_o);
  const Tensor stats = input(*g, "stats", kStats, l.stats);
  stats->set_data_type(fe::DataType_t::FLOAT);
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("causal_attention_backward")
                     .set_causal_mask(true)
                     .set_attn_scale(attention_scale(s))
                     .set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
  set_output(dq, kDQ, l.dq);
  set_output(dk, kDK, l.dk);
  set_output(dv, kDV, l.dv);
  return g;
}

const char* code_name(fe::error_code_t code) {
  switch (code) {
    case fe::error_code_t::OK:
      return "OK";
    case fe::error_code_t::ATTRIBUTE_NOT_SET:
      return "ATTRIBUTE_NOT_SET";
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED:
      return "SHAPE_DEDUCTION_FAILED";
    case fe::error_code_t::INVALID_TENSOR_NAME:
      return "INVALID_TENSOR_NAME";
    case fe::error_code_t::INVALID_VARIANT_PACK:
      return "INVALID_VARIANT_PACK";
    case fe::error_code_t::GRAPH_NOT_SUPPORTED:
      return "GRAPH_NOT_SUPPORTED";
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
      return "GRAPH_EXECUTION_PLAN_CREATION_FAILED";
    case fe::error_code_t::GRAPH_EXECUTION_FAILED:
      return "GRAPH_EXECUTION_FAILED";
    case fe::error_code_t::HEURISTIC_QUERY_FAILED:
      return "HEURISTIC_QUERY_FAILED";
    case fe::error_code_t::UNSUPPORTED_GRAPH_FORMAT:
      return "UNSUPPORTED_GRAPH_FORMAT";
    case fe::error_code_t::CUDA_API_FAILED:
      return "CUDA_API_FAILED";
    case fe::error_code_t::CUDNN_BACKEND_API_FAILED:
      return "CUDNN_BACKEND_API_FAILED";
    case fe::error_code_t::INVALID_CUDA_DEVICE:
      return "INVALID_CUDA_DEVICE";
    case fe::error_code_t::HANDLE_ERROR:
      return "HANDLE_ERROR";
    case fe::error_code_t::INVALID_VALUE:
      return "INVALID_VALUE";
    case fe::error_code_t::NVRTC_COMPILATION_FAILED:
      return "NVRTC_COMPILATION_FAILED";
  }
  return "unknown frontend error";
}

// "STEP failed (CODE): message".
std::string failure(const char* step, const fe::error_t& e) {
  return str(step, " failed (", code_name(e.code), "): ", e.err_msg);
}

// Validates, lowers and builds `g`; empty on success, else the failed step
// and the frontend's message.
std::string build(Graph& g, cudnnHandle_t handle) {
  try {
    if (auto e = g.validate(); e.is_bad()) return failure("validate", e);
    if (auto e = g.build_operation_graph(handle); e.is_bad()) return failure("build_operation_graph", e);
    if (auto e = g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}); e.is_bad()) {
      return failure("create_execution_plans", e);
    }
    if (auto e = g.check_support(); e.is_bad()) return failure("check_support (no engine)", e);
    if (auto e = g.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE); e.is_bad()) {
      return failure("build_plans", e);
    }
  } catch (const std::exception& e) {
    return str("the frontend threw: ", e.what());
  }
  return {};
}

// ---- the cache -----------------------------------------------------------------------

struct Entry {
  std::shared_ptr<Graph> forward, backward;
  int64_t workspace_bytes = 0;
  std::string refusal;  // non-empty: cuDNN has no plan for the shape
};

// Every device's handle and every shape's graphs, for the life of the
// process (never destroyed: graphs may be used until exit, and destroying
// cuDNN state after the CUDA runtime has shut down is unsafe).
struct Cache {
  std::mutex mutex;
  std::map<int, cudnnHandle_t> handles;
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t>, Entry> entries;
};
Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}

// The calling thread's current device.
int current_device() {
  int device = -1;
  MP_CHECK_CUDA(cudaGetDevice(&device));
  return device;
}

// The handle of `device` (the current one); the cache's mutex is held.
cudnnHandle_t handle_for(Cache& c, int device) {
  auto it = c.handles.find(device);
  if (it != c.handles.end()) return it->second;
  cudnnHandle_t handle = nullptr;
  MP_CHECK_CUDNN(fe::detail::create_handle(&handle));
  c.handles.emplace(device, handle);
  return handle;
}

// The entry of `s` on the current device, built on first use; the cache's
// mutex is held. Throws CudaError when cuDNN cannot be loaded.
const Entry& entry_for(Cache& c, const SdpaShape& s) {
  (void)sdpa_layout(s);  // checks the shape
  const int device = current_device();
  const auto key = std::make_tuple(device, s.batch, s.heads, s.seq, s.head_dim);
  auto it = c.entries.find(key);
  if (it != c.entries.end()) return it->second;
  cudnn_library();
  cudnnHandle_t handle = handle_for(c, device);
  Entry e;
  std::string why;
  try {
    e.forward = forward_graph(s);
    e.backward = backward_graph(s);
  } catch (const std::exception& x) {
    why = str("the graph could not be described: ", x.what());
  }
  if (why.empty() && !(why = build(*e.forward, handle)).empty()) why = str("forward: ", why);
  if (why.empty() && !(why = build(*e.backward, handle)).empty()) why = str("backward: ", why);
  if (why.empty()) {
    int64_t fwd = 0, bwd = 0;
    if (auto x = e.forward->get_workspace_size(fwd); x.is_bad()) why = failure("forward get_workspace_size", x);
    if (auto x = e.backward->get_workspace_size(bwd); why.empty() && x.is_bad()) {
      why = failure("backward get_workspace_size", x);
    }
    e.workspace_bytes = std::max(fwd, bwd);
  }
  if (!why.empty()) {
    e = Entry{};
    e.refusal = str("cuDNN refused causal attention for ", sdpa_shape_name(s), " on device ", device, ": ", why);
  }
  return c.entries.emplace(key, std::move(e)).first->second;
}

const Entry& supported_entry(Cache& c, const SdpaShape& s) {
  const Entry& e = entry_for(c, s);
  if (!e.refusal.empty()) MP_THROW(CudnnUnsupportedError, e.refusal);
  return e;
}

// ---- execution -----------------------------------------------------------------------

void check_pointers(const SdpaShape& s, std::initializer_list<std::pair<const void*, const char*>> pointers) {
  for (const auto& [p, name] : pointers) {
    MP_ENFORCE(p != nullptr, "cuDNN attention ", sdpa_shape_name(s), ": ", name, " is null");
    MP_ENFORCE(reinterpret_cast<uintptr_t>(p) % 16 == 0, "cuDNN attention ", sdpa_shape_name(s), ": ", name, " at ",
               p, " is not 16-byte aligned");
  }
}

// Runs the cached forward or backward graph of `s` on the tensors of `pack`,
// under the cache's mutex, after checking the workspace against the entry's.
void execute(const SdpaShape& s, bool backward, std::unordered_map<int64_t, void*>& pack, void* workspace,
             int64_t workspace_bytes, cudaStream_t stream) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  const Entry& entry = supported_entry(c, s);
  MP_ENFORCE(workspace_bytes >= entry.workspace_bytes, "cuDNN attention ", sdpa_shape_name(s), " needs ",
             entry.workspace_bytes, " bytes of workspace, got ", workspace_bytes);
  MP_ENFORCE(entry.workspace_bytes == 0 || workspace != nullptr, "cuDNN attention ", sdpa_shape_name(s),
             ": workspace is null");
  const cudnnHandle_t handle = c.handles.at(current_device());
  MP_CHECK_CUDNN(fe::detail::set_stream(handle, stream));
  std::string why;
  try {
    const Graph& g = backward ? *entry.backward : *entry.forward;
    if (const fe::error_t e = g.execute(handle, pack, workspace); e.is_bad()) why = failure("execute", e);
  } catch (const std::exception& x) {
    why = str("the frontend threw: ", x.what());
  }
  if (!why.empty()) {
    MP_THROW(CudaError, "cuDNN attention ", backward ? "backward" : "forward", " ", sdpa_shape_name(s), ": ", why);
  }
}

// p + n elements, as the variant pack's untyped pointer.
template <class T>
void* at(const T* p, int64_t n) {
  return const_cast<T*>(p + n);
}

}  // namespace

bool attention_cudnn_supported(const SdpaShape& shape, std::string* reason) {
  (void)sdpa_layout(shape);  // EnforceError for a bad shape
  std::string why = cudnn_library_state().error;
  if (why.empty()) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    why = entry_for(c, shape).refusal;
  }
  if (reason != nullptr) *reason = why;
  return why.empty();
}

int64_t attention_cudnn_workspace_bytes(const SdpaShape& shape) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return supported_entry(c, shape).workspace_bytes;
}

void attention_cudnn_forward(const SdpaShape& shape, const bf16* qkv, bf16* out, float* stats, void* workspace,
                             int64_t workspace_bytes, cudaStream_t stream) {
  check_pointers(shape, {{qkv, "qkv"}, {out, "out"}, {stats, "stats"}});
  const SdpaLayout l = sdpa_layout(shape);
  std::unordered_map<int64_t, void*> pack{{kQ, at(qkv, l.q.base)},
                                          {kK, at(qkv, l.k.base)},
                                          {kV, at(qkv, l.v.base)},
                                          {kO, at(out, l.o.base)},
                                          {kStats, at(stats, l.stats.base)}};
  execute(shape, false, pack, workspace, workspace_bytes, stream);
}

void attention_cudnn_backward(const SdpaShape& shape, const bf16* qkv, const bf16* out, const bf16* dout,
                              const float* stats, bf16* dqkv, void* workspace, int64_t workspace_bytes,
                              cudaStream_t stream) {
  check_pointers(shape, {{qkv, "qkv"}, {out, "out"}, {dout, "dout"}, {stats, "stats"}, {dqkv, "dqkv"}});
  const SdpaLayout l = sdpa_layout(shape);
  std::unordered_map<int64_t, void*> pack{
      {kQ, at(qkv, l.q.base)},    {kK, at(qkv, l.k.base)},     {kV, at(qkv, l.v.base)},
      {kO, at(out, l.o.base)},    {kDO, at(dout, l.d_o.base)}, {kStats, at(stats, l.stats.base)},
      {kDQ, at(dqkv, l.dq.base)}, {kDK, at(dqkv, l.dk.base)},  {kDV, at(dqkv, l.dv.base)}};
  execute(shape, true, pack, workspace, workspace_bytes, stream);
}

std::string attention_cudnn_describe() {
  const CudnnLibrary& lib = cudnn_library_state();
  if (!lib.error.empty()) return "not loaded: " + lib.error;
  return str("cuDNN ", lib.version, " at ", lib.path, ", frontend ", CUDNN_FRONTEND_MAJOR_VERSION, ".",
             CUDNN_FRONTEND_MINOR_VERSION, ".", CUDNN_FRONTEND_PATCH_VERSION);
}

}  // namespace mp
