// Host words that CUDA streams wait for: Note [Device waits on host words]
// in core/cuda_host_word.h.
#include "core/cuda_host_word.h"

#include <cudaTypedefs.h>

#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <vector>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "core/error_cuda.h"

namespace mp {
namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "the device reads a host word as a plain 32-bit value");

// cuStreamWaitValue32 of the v2 stream memory operations (CUDA 11.7).
constexpr unsigned int kEntryPointVersion = 11070;

// The driver's cuStreamWaitValue32, or null with the reason.
struct WaitEntry {
  PFN_cuStreamWaitValue32_v11070 fn = nullptr;
  std::string why;
};

const WaitEntry& wait_entry() {
  static const WaitEntry entry = [] {
    WaitEntry e;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, kEntryPointVersion, cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
      (void)cudaGetLastError();
      e.why = std::string("the driver has no cuStreamWaitValue32 of CUDA 11.7 or later (") +
              (err != cudaSuccess                                 ? cudaGetErrorName(err)
               : found == cudaDriverEntryPointVersionNotSufficent ? "version not sufficient"
                                                                  : "symbol not found") +
              ")";
      return e;
    }
    e.fn = reinterpret_cast<PFN_cuStreamWaitValue32_v11070>(fn);
    return e;
  }();
  return entry;
}

// The pool of words (Note [Device waits on host words]): pages that are
// never freed, a word per 64-byte line.
constexpr size_t kPageBytes = 4096;
constexpr size_t kWordStride = 64;

struct Slot {
  std::atomic<uint32_t>* host = nullptr;
  uintptr_t device = 0;
};

struct Pool {
  std::mutex mu;
  std::vector<Slot> free;

  Slot take() {
    std::lock_guard<std::mutex> lock(mu);
    if (free.empty()) {
      void* page = nullptr;
      MP_CHECK_CUDA(cudaHostAlloc(&page, kPageBytes, cudaHostAllocPortable | cudaHostAllocMapped));
      void* mapped = nullptr;
      MP_CHECK_CUDA(cudaHostGetDevicePointer(&mapped, page, 0));
      for (size_t at = kPageBytes; at >= kWordStride; at -= kWordStride) {
        const size_t offset = at - kWordStride;
        auto* word = new (static_cast<char*>(page) + offset) std::atomic<uint32_t>(0);
        free.push_back(Slot{word, reinterpret_cast<uintptr_t>(mapped) + offset});
      }
    }
    const Slot s = free.back();
    free.pop_back();
    return s;
  }
  void give_back(Slot s) noexcept {
    try {
      std::lock_guard<std::mutex> lock(mu);
      free.push_back(s);
    } catch (...) {
      // Out of memory for the free list: the word stays unused.
    }
  }
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: streams may read its words until the process ends
  return *p;
}

// Whether a stream of `device` sees a host word change: a wait already
// satisfied passes, a wait for 1 on a word at 0 holds until the host writes
// 1 and then passes within kProbeDeadline. Some virtualised drivers never
// show the device a later host write: every staged collective would wait
// out its timeout there. On failure the word and the stream are left (the
// stream may wait on the word for good).
std::string probe(Device device) {
  constexpr std::chrono::seconds kProbeDeadline{1};
  std::string why;
  std::optional<HostWord> word;
  cudaStream_t stream = nullptr;
  try {
    word.emplace(device);
    int previous = 0;
    MP_CHECK_CUDA(cudaGetDevice(&previous));
    MP_CHECK_CUDA(cudaSetDevice(device.index));
    const cudaError_t created = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    MP_CHECK_CUDA(cudaSetDevice(previous));
    MP_CHECK_CUDA(created);
    word->wait_on(stream, 0);
    synchronize_stream(stream, kProbeDeadline, "a satisfied wait on a host word");
    word->wait_on(stream, 1);
    if (cudaStreamQuery(stream) == cudaSuccess) {
      MP_THROW(CudaError, "a wait for a host word to reach 1 passed while it was 0");
    }
    word->value().store(1, std::memory_order_release);
    synchronize_stream(stream, kProbeDeadline, "a wait on a host word the host raised from 0 to 1");
    MP_CHECK_CUDA(cudaStreamDestroy(stream));
  } catch (const std::exception& e) {
    why = e.what();
    if (word) word->leak();  // `stream` is left: it may wait on the word for good
  }
  return why;
}

}  // namespace

bool HostWord::supported(Device device, std::string* why) noexcept {
  static std::mutex mu;
  static std::map<int, std::string> known;  // device index -> why not ("" if it can)
  try {
    if (!device.is_cuda()) {
      if (why != nullptr) *why = to_string(device) + " is not a CUDA device";
      return false;
    }
    std::lock_guard<std::mutex> lock(mu);
    auto it = known.find(device.index);
    if (it == known.end()) {
      std::string reason = wait_entry().why;
      int maps = 0;
      if (reason.empty() &&
          (cudaDeviceGetAttribute(&maps, cudaDevAttrCanMapHostMemory, device.index) != cudaSuccess || maps == 0)) {
        (void)cudaGetLastError();
        reason = to_string(device) + " cannot map host memory";
      }
      if (reason.empty()) reason = probe(device);
      it = known.emplace(device.index, reason).first;
    }
    if (why != nullptr) *why = it->second;
    return it->second.empty();
  } catch (...) {
    if (why != nullptr) *why = "out of memory while checking";
    return false;
  }
}

HostWord::HostWord(Device device) : device_(device) {
  MP_ENFORCE(device.is_cuda(), "a host word for CUDA streams, on ", device);
  if (wait_entry().fn == nullptr) {
    MP_THROW(CudaError, "streams of ", device, " cannot wait on host words: ", wait_entry().why);
  }
  CudaDeviceGuard guard(device);
  const Slot s = pool().take();
  value_ = s.host;
  device_address_ = s.device;
  value_->store(0, std::memory_order_release);
}

HostWord::~HostWord() {
  if (value_ == nullptr || leaked_) return;
  pool().give_back(Slot{value_, device_address_});
}

void HostWord::wait_on(cudaStream_t stream, uint32_t at_least) const {
  const CUresult rc =
      wait_entry().fn(stream, static_cast<CUdeviceptr>(device_address_), at_least, CU_STREAM_WAIT_VALUE_GEQ);
  if (rc != CUDA_SUCCESS) {
    MP_THROW(CudaError, "Call to cuStreamWaitValue32 (a stream of ", device_, " waits for a host word to reach ",
             at_least, ") failed: CUresult ", static_cast<int>(rc),
             rc == CUDA_ERROR_NOT_SUPPORTED ? " (CUDA_ERROR_NOT_SUPPORTED)" : "");
  }
}

}  // namespace mp
