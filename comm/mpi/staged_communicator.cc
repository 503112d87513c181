// The MPI communicator for CUDA memory, staged through pinned host buffers:
// Note [Staged collectives] in comm/mpi/staged_communicator.h.
#include "comm/mpi/staged_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

#include "comm/mpi/staged_completion.h"
#include "core/device.h"
#include "core/error.h"
#include "core/stream.h"
#include "kernels/ops.h"
#include "mp/config.h"

#if MP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_host_word.h"
#include "core/cuda_stream.h"
#include "core/error_cuda.h"
#endif

namespace mp {

namespace {

// The staging buffer is at least this big, in multiples of it: the
// Allocator gives such buffers pages of their own (2 MiB aligned and
// rounded), so cudaHostRegister never pins a page that another buffer
// shares, and small collectives never grow it.
constexpr size_t kStagingGranule = size_t{2} << 20;

size_t round_up(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

// Where a second region of the staging buffer starts after `first` bytes.
size_t second_region(size_t first) { return round_up(first, 64); }

// Note [Staged collectives], "One communicator in flight": the collective issued last by
// any staged communicator of this process, and by which. Its mutex is held
// while a collective is issued, so issues of different staged communicators
// are ordered too.
struct LastIssue {
  std::mutex mu;
  const void* owner = nullptr;
  WorkPtr work;
};

LastIssue& last_issue() {
  static LastIssue last;
  return last;
}

std::string message_of(const std::exception& e) {
  if (const auto* err = dynamic_cast<const Error*>(&e)) return err->message();
  return e.what();
}

// A timed-out Work's diagnosis: where its inner (MPI) collective is. The
// inner Work's own diagnosis asks the peers over the side channel (Note
// [Peer monitor]).
Work::Diagnose diagnose_through(WorkPtr inner) {
  return [inner = std::move(inner)](const CollectiveInfo&) -> std::string {
    if (!inner) return "Nothing was staged on it yet.";
    try {
      inner->wait(std::chrono::milliseconds(0));
    } catch (const std::exception& e) {
      return inner->is_completed() ? "Its MPI part failed: " + message_of(e) : "Its MPI part: " + message_of(e);
    }
    return "Its MPI part has completed, the copy back to the device has not: the device, or work before it "
           "on the stream, is behind.";
  };
}


}  // namespace

// ---- construction ------------------------------------------------------------------

std::unique_ptr<StagedMpiCommunicator> StagedMpiCommunicator::create(std::unique_ptr<MpiCommunicator> inner,
                                                                     Device device, size_t staging_bytes,
                                                                     StagedWait wait) {
#if !MP_WITH_CUDA
  (void)inner;
  (void)staging_bytes;
  (void)wait;
  MP_THROW(ConfigError, "the staged MPI communicator moves CUDA tensors (", device,
           ") through host memory, but mp was built without CUDA (MP_CUDA=OFF or nvcc not found)");
#else
  if (!device.is_cuda()) {
    MP_THROW(ConfigError, "the staged MPI communicator is for CUDA memory, got ", device,
             "; CPU tensors go through MpiCommunicator itself");
  }
  const CudaInfo info = cuda_info();
  if (device.index < 0 || device.index >= info.device_count) {
    MP_THROW(ConfigError, "the staged MPI communicator needs ", device, ", but ",
             info.device_count == 0 ? "no CUDA device is usable: " + info.unavailable_reason
                                    : std::to_string(info.device_count) + " CUDA device(s) exist");
  }
  MP_ENFORCE(inner != nullptr, "the staged MPI communicator needs an inner MpiCommunicator, got none");
  std::string why;
  if (wait == StagedWait::kDevice && !HostWord::supported(device, &why)) {
    MP_THROW(ConfigError, "the staged MPI communicator '", inner->name(), "' was asked to wait on ", device,
             " for its MPI parts, but streams there cannot wait on host words: ", why);
  }
  std::unique_ptr<StagedMpiCommunicator> c(new StagedMpiCommunicator(std::move(inner), device, wait));
  if (staging_bytes > 0) c->staging(staging_bytes);
  return c;
#endif
}

StagedMpiCommunicator::StagedMpiCommunicator(std::unique_ptr<MpiCommunicator> inner, Device device, StagedWait wait)
    : Communicator(inner->name(), inner->options()),
      inner_(std::move(inner)),
      device_(device),
      wait_(wait),
      allocator_(Device::cpu()),
      failure_(std::make_shared<FirstFailure>()),
      stream_(Stream::create(device, "staged:" + name(), StreamOptions{.wait_timeout = options().timeout})) {
  // The communication thread polls CUDA events (step 2 of Note [Staged
  // collectives]): the device must be current there.
  inner_thread_ = dynamic_cast<CpuStream*>(&inner_->stream());
  MP_ENFORCE(inner_thread_ != nullptr, "the inner communicator '", name(), "' has no communication thread");
  inner_thread_->submit([device] { set_current_device(device); });
#if MP_WITH_CUDA
  if (wait_ != StagedWait::kHost && HostWord::supported(device)) word_ = std::make_shared<HostWord>(device);
#endif
}

StagedMpiCommunicator::~StagedMpiCommunicator() {
  {
    LastIssue& last = last_issue();
    std::lock_guard<std::mutex> lock(last.mu);
    if (last.owner == this) {
      last.owner = nullptr;
      last.work.reset();
    }
  }
  bool drained = !cpu_streams_abandoned();
  if (drained) {
    try {
      drain();
    } catch (...) {
      drained = false;  // reported through the Work that carried it
    }
  }
  if (!drained) {
    // Note [Staged collectives], "Failures": the communication thread may
    // never finish its collectives, so the word is raised past all of
    // them, and nothing on the device waits on it for ever. The copies
    // still queued on the stream then read the staging buffer, and an
    // abandoned MPI call may still write it: keep both, and the word (the
    // process is about to end, core/stream.h abandon_cpu_streams), rather
    // than free memory in use or wait for the stream without a bound.
#if MP_WITH_CUDA
    if (word_) {
      raise_host_word(word_->value(), issued_);
      word_->leak();
    }
#endif
    (void)stream_.release();
    (void)new Buffer(std::move(staging_));
    return;
  }
  unpin_staging();
}

// ---- staging -------------------------------------------------------------------------

void StagedMpiCommunicator::unpin_staging() noexcept {
#if MP_WITH_CUDA
  if (staging_.data() != nullptr) (void)cudaHostUnregister(staging_.data());
#endif
}

char* StagedMpiCommunicator::staging(size_t bytes) {
  if (bytes > staging_.size_bytes()) {
    drain();  // collectives in flight still read or write the old buffer
    unpin_staging();
    staging_ = Buffer();  // release first: at most one staging buffer at a time
    staging_ = allocator_.allocate(round_up(bytes, kStagingGranule), MemCategory::kCommScratch);
#if MP_WITH_CUDA
    // Pinned, so the copies are DMA from and to this buffer and asynchronous.
    try {
      MP_CHECK_CUDA(cudaHostRegister(staging_.data(), staging_.size_bytes(), cudaHostRegisterDefault));
    } catch (...) {
      staging_ = Buffer();
      throw;
    }
#endif
  }
  return static_cast<char*>(staging_.data());
}

Tensor StagedMpiCommunicator::host_view(char* base, size_t offset, DType dtype, int64_t n) const {
  return Tensor::wrap(n == 0 ? nullptr : base + offset, Device::cpu(), dtype, {n});
}

void StagedMpiCommunicator::drain() {
  if (last_work_) last_work_->wait();
}

void StagedMpiCommunicator::rethrow_failure() const {
  if (std::exception_ptr e = failure_->get()) std::rethrow_exception(e);
}

// ---- issue: Note [Staged collectives] ----------------------------------------------

WorkPtr StagedMpiCommunicator::stage(const char* op, size_t staging_bytes, const std::function<Plan(char*)>& plan) {
  rethrow_failure();
#if MP_WITH_CUDA
  LastIssue& last = last_issue();
  std::lock_guard<std::mutex> lock(last.mu);
  if (last.owner != this && last.work) last.work->wait();  // one communicator in flight
  CudaDeviceGuard current(device_);
  const Plan p = plan(staging(staging_bytes));  // grows only with nothing staged in flight (above)
  const uint32_t number = issued_ + 1;
  // 1. Device -> host, in stream order after what the caller put on stream().
  for (const Copy& c : p.down) {
    if (c.bytes > 0) ops::copy_bytes(c.dst, Device::cpu(), c.src, device_, static_cast<int64_t>(c.bytes), *stream_);
  }
  // 2. The communication thread: the copies, the inner collective, its end.
  std::string what = detail::str(op, " (staged collective #", number, ") on communicator '", name(), "'");
  inner_thread_->submit([staged = stream_->record(), timeout = options().timeout,
                         what = std::move(what)] { wait_until_staged(staged, timeout, what); },
                        TaskName{"wait for the copies to host memory"});
  WorkPtr inner = p.run_inner();
  issued_ = number;
  if (word_) {
    inner_thread_->submit_always(
        [inner, failure = failure_, word = word_, number] { finish_staged(*inner, *failure, word->value(), number); },
        TaskName{"signal the end of a staged collective"});
    // 3. The stream waits on the device until the MPI part is over ...
    word_->wait_on(cuda_handle(stream_.get()), number);
  } else {
    // 3. ... or, without device waits, this thread does (bounded).
    try {
      inner->wait();
    } catch (...) {
      failure_->fail(std::current_exception());
    }
  }
  // 4. ... and then copies the result host -> device.
  for (const Copy& c : p.up) {
    if (c.bytes > 0) ops::copy_bytes(c.dst, device_, c.src, Device::cpu(), static_cast<int64_t>(c.bytes), *stream_);
  }
  auto work = std::make_shared<Work>(inner->info(), stream_->record(), name(), options().timeout,
                                     diagnose_through(inner));
  last_work_ = work;
  last_inner_ = inner;
  last.owner = this;
  last.work = work;
  return work;
#else
  (void)op;
  (void)staging_bytes;
  (void)plan;
  MP_THROW(ConfigError, "staged collective on ", device_, ": mp was built without CUDA");
#endif
}

// ---- the collectives: the inner collective on host views of the staging buffer ------

// The input and the output on the staging buffer, `whole` (the one that
// holds the other when in place) first and the other after it or, in place,
// inside it where it is on the device: the inner backend sees the same
// aliasing.
WorkPtr StagedMpiCommunicator::stage_pair(const char* op, const Tensor& input, const Tensor& output, bool in_place,
                                          const std::function<WorkPtr(const Tensor&, const Tensor&)>& run,
                                          bool output_whole) {
  const Tensor& whole = output_whole ? output : input;
  const Tensor& part = output_whole ? input : output;
  const size_t at = in_place ? static_cast<size_t>(static_cast<const char*>(part.data()) -
                                                   static_cast<const char*>(whole.data()))
                             : second_region(whole.size_bytes());
  return stage(op, in_place ? whole.size_bytes() : at + part.size_bytes(), [&](char* base) {
    const Tensor w = host_view(base, 0, whole.dtype(), whole.numel());
    const Tensor p = host_view(base, at, part.dtype(), part.numel());
    const Tensor& in = output_whole ? p : w;
    const Tensor& out = output_whole ? w : p;
    return Plan{{{in.data(), input.data(), input.size_bytes()}},
                [run, in, out] { return run(in, out); },
                {{output.data(), out.data(), output.size_bytes()}}};
  });
}

WorkPtr StagedMpiCommunicator::do_all_gather(const Tensor& input, const Tensor& output, bool in_place) {
  return stage_pair("all_gather", input, output, in_place,
                    [this](const Tensor& in, const Tensor& out) { return inner_->all_gather(in, out); }, true);
}

WorkPtr StagedMpiCommunicator::do_reduce_scatter(const Tensor& input, const Tensor& output, const ReduceOptions& o,
                                                 bool in_place) {
  return stage_pair("reduce_scatter", input, output, in_place,
                    [this, o](const Tensor& in, const Tensor& out) { return inner_->reduce_scatter(in, out, o); });
}

WorkPtr StagedMpiCommunicator::do_all_reduce(const Tensor& input, const Tensor& output, const ReduceOptions& o,
                                             bool in_place) {
  return stage_pair("all_reduce", input, output, in_place,
                    [this, o](const Tensor& in, const Tensor& out) { return inner_->all_reduce(in, out, o); });
}

WorkPtr StagedMpiCommunicator::do_broadcast(const Tensor& tensor, int root) {
  return stage("broadcast", tensor.size_bytes(), [&](char* base) {
    const Tensor host = host_view(base, 0, tensor.dtype(), tensor.numel());
    // Only the root's data travels down, and the root's tensor does not change.
    Plan p{{}, [this, host, root] { return inner_->broadcast(host, root); }, {}};
    if (rank() == root) {
      p.down.push_back({host.data(), tensor.data(), tensor.size_bytes()});
    } else {
      p.up.push_back({tensor.data(), host.data(), tensor.size_bytes()});
    }
    return p;
  });
}

WorkPtr StagedMpiCommunicator::do_all_to_all(const Tensor& input, const Tensor& output, bool in_place) {
  return stage_pair("all_to_all", input, output, in_place,
                    [this](const Tensor& in, const Tensor& out) { return inner_->all_to_all(in, out); });
}

WorkPtr StagedMpiCommunicator::do_all_to_all_v(const Tensor& input, const std::vector<int64_t>& send_counts,
                                                const Tensor& output, const std::vector<int64_t>& recv_counts) {
  return stage_pair("all_to_all_v", input, output, false, [this, send_counts, recv_counts](const Tensor& in,
                                                                                        const Tensor& out) {
    return inner_->all_to_all_v(in, send_counts, out, recv_counts);
  });
}

WorkPtr StagedMpiCommunicator::barrier() {
  // Issued behind everything on stream(), like NCCL's barrier kernel.
  return stage("barrier", 0, [this](char*) { return Plan{{}, [this] { return inner_->barrier(); }, {}}; });
}

WorkPtr StagedMpiCommunicator::fence(const std::string& what) {
  rethrow_failure();
  // The inner fence names the inner sequence number issued last; the event
  // is this stream's, after every copy issued so far.
  const WorkPtr inner = inner_->fence(what);
  return std::make_shared<Work>(inner->info(), stream_->record(), name(), options().timeout,
                                diagnose_through(last_inner_));
}

std::unique_ptr<Communicator> StagedMpiCommunicator::split(int color, int key, const std::string& name) {
  rethrow_failure();
  std::unique_ptr<Communicator> child = inner_->split(color, key, name);
  if (!child) return nullptr;
  auto* mpi = dynamic_cast<MpiCommunicator*>(child.get());
  MP_ENFORCE(mpi != nullptr, "split of the inner communicator '", this->name(), "' is not an MpiCommunicator");
  (void)child.release();
  return create(std::unique_ptr<MpiCommunicator>(mpi), device_, 0, wait_);
}

void StagedMpiCommunicator::do_host_all_gather(const void* mine, size_t bytes, void* all) {
  rethrow_failure();
  // One inner exchange of the same bytes, through the inner's public
  // interface: whole int64 words, the last one padded with zeros.
  const size_t words = (bytes + sizeof(int64_t) - 1) / sizeof(int64_t);
  std::vector<int64_t> padded(words, 0);
  if (bytes > 0) std::memcpy(padded.data(), mine, bytes);
  const std::vector<int64_t> every = inner_->all_gather_int64(padded);
  for (int r = 0; r < size(); ++r) {
    std::memcpy(static_cast<char*>(all) + static_cast<size_t>(r) * bytes,
                every.data() + static_cast<size_t>(r) * words, bytes);
  }
}

}  // namespace mp
