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

#include "core/device.h"
#include "core/error.h"
#include "core/stream.h"
#include "kernels/ops.h"
#include "mp/config.h"

#if MP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_stream.h"
#include "core/error_cuda.h"
#endif

namespace mp {

// What host functions still in flight share with their communicator (and
// may outlive it): the first failure of a collective's host part.
struct StagedMpiCommunicator::State {
  std::mutex mu;
  std::exception_ptr error;

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = std::move(e);
  }
  std::exception_ptr first_error() {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
};

// The argument of one host function: the inner collective it waits for.
struct StagedMpiCommunicator::HostPart {
  WorkPtr inner;
  std::shared_ptr<State> state;
};

namespace {

// The staging buffer is at least this big, in multiples of it: the
// Allocator gives such buffers pages of their own (2 MiB aligned and
// rounded), so cudaHostRegister never pins a page that another buffer
// shares, and small collectives never grow it.
constexpr size_t kStagingGranule = size_t{2} << 20;

size_t round_up(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

// Where a second region of the staging buffer starts after `first` bytes.
size_t second_region(size_t first) { return round_up(first, 64); }

// Note [Staged collectives], "Host functions": the collective issued last by
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
                                                                     Device device, size_t staging_bytes) {
#if !MP_WITH_CUDA
  (void)inner;
  (void)staging_bytes;
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
  std::unique_ptr<StagedMpiCommunicator> c(new StagedMpiCommunicator(std::move(inner), device));
  if (staging_bytes > 0) c->staging(staging_bytes);
  return c;
#endif
}

StagedMpiCommunicator::StagedMpiCommunicator(std::unique_ptr<MpiCommunicator> inner, Device device)
    : Communicator(inner->name(), inner->options()),
      inner_(std::move(inner)),
      device_(device),
      allocator_(Device::cpu()),
      state_(std::make_shared<State>()),
      stream_(Stream::create(device, "staged:" + name())) {
  // The inner communication thread waits for CUDA events (step 2 of Note
  // [Staged collectives]): the device must be current there.
  auto* inner_thread = dynamic_cast<CpuStream*>(&inner_->stream());
  MP_ENFORCE(inner_thread != nullptr, "the inner communicator '", name(), "' has no communication thread");
  inner_thread->submit([device] { set_current_device(device); });
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
    // Copies and host functions may still be queued on the stream, and an
    // abandoned MPI call may still write the staging buffer: keep both
    // (the process is about to end, core/stream.h abandon_cpu_streams) rather
    // than free memory in use or wait for the stream without a bound.
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
  if (std::exception_ptr e = state_->first_error()) std::rethrow_exception(e);
}

// ---- issue: Note [Staged collectives] ----------------------------------------------

void StagedMpiCommunicator::finish_host_part(void* arg) noexcept {
  // Runs on a CUDA thread, which must not call CUDA: it only waits, on the
  // host, for the inner collective (bounded by the inner timeout).
  std::unique_ptr<HostPart> part(static_cast<HostPart*>(arg));
  try {
    part->inner->wait();
  } catch (...) {
    part->state->fail(std::current_exception());
  }
}

WorkPtr StagedMpiCommunicator::stage(const std::vector<Copy>& down, const std::function<WorkPtr()>& run_inner,
                                     const std::vector<Copy>& up) {
  rethrow_failure();
#if MP_WITH_CUDA
  LastIssue& last = last_issue();
  std::lock_guard<std::mutex> lock(last.mu);
  if (last.owner != this && last.work) last.work->wait();  // at most one communicator in flight
  CudaDeviceGuard current(device_);
  // 1. Device -> host, in stream order after what the caller put on stream().
  for (const Copy& c : down) {
    if (c.bytes > 0) ops::copy_bytes(c.dst, Device::cpu(), c.src, device_, static_cast<int64_t>(c.bytes), *stream_);
  }
  // 2. The inner collective on the host buffers, once they hold the input.
  inner_->stream().wait(stream_->record());
  WorkPtr inner = run_inner();
  // 3. The stream waits for the inner collective ...
  auto part = std::make_unique<HostPart>(HostPart{inner, state_});
  MP_CHECK_CUDA(cudaLaunchHostFunc(cuda_handle(stream_.get()), &StagedMpiCommunicator::finish_host_part, part.get()));
  (void)part.release();  // the host function owns it now
  // 4. ... and then copies the result host -> device.
  for (const Copy& c : up) {
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
  (void)down;
  (void)run_inner;
  (void)up;
  MP_THROW(ConfigError, "staged collective on ", device_, ": mp was built without CUDA");
#endif
}

// ---- the collectives: the inner collective on host views of the staging buffer ------

WorkPtr StagedMpiCommunicator::do_all_gather(const Tensor& input, const Tensor& output, bool in_place) {
  const int64_t n = input.numel();
  // In place, the input is rank r's slice of the output on the host too.
  const size_t at = second_region(output.size_bytes());
  char* base = staging(in_place ? output.size_bytes() : at + input.size_bytes());
  const Tensor out = host_view(base, 0, output.dtype(), output.numel());
  const Tensor in = in_place ? out.flat(rank() * n, n) : host_view(base, at, input.dtype(), n);
  return stage({{in.data(), input.data(), input.size_bytes()}}, [&] { return inner_->all_gather(in, out); },
               {{output.data(), out.data(), output.size_bytes()}});
}

WorkPtr StagedMpiCommunicator::do_reduce_scatter(const Tensor& input, const Tensor& output, const ReduceOptions& o,
                                                 bool in_place) {
  const int64_t n = output.numel();
  const size_t at = second_region(input.size_bytes());
  char* base = staging(in_place ? input.size_bytes() : at + output.size_bytes());
  const Tensor in = host_view(base, 0, input.dtype(), input.numel());
  const Tensor out = in_place ? in.flat(rank() * n, n) : host_view(base, at, output.dtype(), n);
  return stage({{in.data(), input.data(), input.size_bytes()}},
               [&] { return inner_->reduce_scatter(in, out, o); }, {{output.data(), out.data(), output.size_bytes()}});
}

WorkPtr StagedMpiCommunicator::do_all_reduce(const Tensor& input, const Tensor& output, const ReduceOptions& o,
                                             bool in_place) {
  const int64_t n = input.numel();
  const size_t at = second_region(input.size_bytes());
  char* base = staging(in_place ? input.size_bytes() : at + output.size_bytes());
  const Tensor in = host_view(base, 0, input.dtype(), n);
  const Tensor out = in_place ? in : host_view(base, at, output.dtype(), n);
  return stage({{in.data(), input.data(), input.size_bytes()}}, [&] { return inner_->all_reduce(in, out, o); },
               {{output.data(), out.data(), output.size_bytes()}});
}

WorkPtr StagedMpiCommunicator::do_broadcast(const Tensor& tensor, int root) {
  char* base = staging(tensor.size_bytes());
  const Tensor host = host_view(base, 0, tensor.dtype(), tensor.numel());
  // Only the root's data travels down, and the root's tensor does not change.
  std::vector<Copy> down, up;
  if (rank() == root) {
    down.push_back({host.data(), tensor.data(), tensor.size_bytes()});
  } else {
    up.push_back({tensor.data(), host.data(), tensor.size_bytes()});
  }
  return stage(down, [&] { return inner_->broadcast(host, root); }, up);
}

WorkPtr StagedMpiCommunicator::do_all_to_all(const Tensor& input, const Tensor& output, bool in_place) {
  const size_t at = second_region(input.size_bytes());
  char* base = staging(in_place ? input.size_bytes() : at + output.size_bytes());
  const Tensor in = host_view(base, 0, input.dtype(), input.numel());
  const Tensor out = in_place ? in : host_view(base, at, output.dtype(), output.numel());
  return stage({{in.data(), input.data(), input.size_bytes()}}, [&] { return inner_->all_to_all(in, out); },
               {{output.data(), out.data(), output.size_bytes()}});
}

WorkPtr StagedMpiCommunicator::barrier() {
  // Issued behind everything on stream(), like NCCL's barrier kernel.
  return stage({}, [&] { return inner_->barrier(); }, {});
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
  return create(std::unique_ptr<MpiCommunicator>(mpi), device_);
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
