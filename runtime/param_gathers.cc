#include "runtime/param_gathers.h"

#include <algorithm>
#include <string>

#include "kernels/convert.h"
#include "kernels/cpu/quant.h"
#include "runtime/shard_sizes.h"

namespace mp {

ParamGathers::ParamGathers(const EngineOptions& o, const FlatLayout& layout, std::vector<UnitState>& units,
                           Communicator& shard, Stream& shard_stream, CommWatch& comm, Allocator& alloc)
    : o_(o),
      units_(units),
      shard_(shard),
      shard_stream_(shard_stream),
      comm_(comm),
      ring_(layout, o.gather_slots(layout.num_shared_units()), o.prefetch_depth, o.precision.param_dtype, alloc, comm,
            shard_stream, [this](int u, const Tensor& dst) { return issue_gather(u, dst); }),
      full_(units.size()),
      updated_(units.size()) {
  if (o.precision.param_cast == ParamCast::kAtGather) {
    const int64_t n = o.shard_size > 1 ? layout.max_shard_numel() : o.cast_staging_slots() * layout.max_padded_numel();
    cast_staging_ = Tensor::zeros(alloc, o.precision.param_dtype, {n}, MemCategory::kCommScratch);
    if (o.shard_size == 1) staged_.resize(static_cast<size_t>(o.cast_staging_slots()));
  }
  if (o.int8_param_gather && o.gathers_per_unit()) {
    if (!alloc.device().is_cpu()) {
      MP_THROW(ConfigError, "sharding.int8_param_gather runs on CPU engines only for now; this engine is on ",
               alloc.device());
    }
    const int64_t nq = int8_gather_elements(layout.max_shard_numel());
    const auto span = static_cast<int64_t>(int8_span_bytes(nq));
    int8_send_ = Tensor::zeros(alloc, kByteCarrier, {span}, MemCategory::kCommScratch);
    int8_recv_ = Tensor::zeros(alloc, kByteCarrier, {o.shard_size * span}, MemCategory::kCommScratch);
    int8_f32_ = Tensor::zeros(alloc, DType::kF32, {nq}, MemCategory::kCommScratch);
  }
}


// The all-gather's source: this rank's shard in param dtype, once unit u's
// latest update is done.
Tensor ParamGathers::gather_source(int u) {
  const UnitState& unit = units_[static_cast<size_t>(u)];
  shard_stream_.wait(updated_[static_cast<size_t>(u)]);
  if (unit.param_shard().defined()) return unit.param_shard();
  if (o_.precision.param_cast != ParamCast::kAtGather) return unit.master();  // fp32 params
  Tensor staging = cast_staging_.flat(0, unit.n());
  convert(unit.master(), staging, {}, &shard_stream_);  // on the communication thread, before the gather
  cast_elements_ += unit.n();
  return staging;
}

WorkPtr ParamGathers::issue_gather(int u, const Tensor& dst) {
  if (int8_send_.defined()) return issue_int8_gather(u, dst);
  WorkPtr w = shard_.all_gather(gather_source(u), dst);
  comm_.track(w);
  return w;
}

// qwZ: this rank's shard quantized (Note [Int8 blocks]), the codes and
// scales all-gathered, each rank's part decoded into dst, all on the
// communication stream; the Work returned completes after the decoding.
WorkPtr ParamGathers::issue_int8_gather(int u, const Tensor& dst) {
  const Tensor src = gather_source(u);
  const int64_t n = units_[static_cast<size_t>(u)].n(), nq = int8_gather_elements(n);
  const auto span = static_cast<int64_t>(int8_span_bytes(nq));
  const int S = o_.shard_size;
  const Tensor send = int8_send_.flat(0, span), recv = int8_recv_.flat(0, S * span), f32 = int8_f32_;
  shard_stream_.host_task([src, send, f32, n, nq] {
    convert(src, f32.flat(0, n), {});
    std::fill(f32.data_as<float>() + n, f32.data_as<float>() + nq, 0.0f);
    quantize_int8(f32.data_as<float>(), nq, send.data());
  });
  comm_.track(shard_.all_gather(send, recv));
  shard_stream_.host_task([recv, dst, f32, n, nq, span, S] {
    for (int j = 0; j < S; ++j) {
      dequantize_int8(static_cast<const char*>(recv.data()) + j * span, nq, f32.data_as<float>(), false);
      convert(f32.flat(0, n), dst.flat(j * n, n), {});
    }
  });
  WorkPtr w = shard_.fence("int8 gather of unit " + std::to_string(u));
  comm_.track(w);
  return w;
}

void ParamGathers::issue_full_gather(int u) {
  FullCopy& f = full_[static_cast<size_t>(u)];
  f.stale = false;
  shard_stream_.wait(f.released);  // the compute that read the old copy
  f.released = Event();
  f.gather = shard_.all_gather(gather_source(u), units_[static_cast<size_t>(u)].full_params());
  comm_.track(f.gather);
}

Tensor ParamGathers::params_for(int u, int direction, Stream& compute) {
  const UnitState& unit = units_[static_cast<size_t>(u)];
  if (o_.keeps_full_params()) {
    FullCopy& f = full_[static_cast<size_t>(u)];
    if (f.stale) issue_full_gather(u);  // prefetch off: gathered when needed
    comm_.wait_on(compute, f.gather);
    f.gather.reset();
    return unit.full_params();
  }
  if (!o_.gathers_per_unit()) {  // one rank per shard group: the shard is the unit
    compute.wait(updated_[static_cast<size_t>(u)]);  // an update on another stream (optimizer in backward)
    if (o_.precision.param_cast != ParamCast::kAtGather) {
      return unit.param_shard().defined() ? unit.param_shard() : unit.master();
    }
    return stage(u, compute);
  }
  return ring_.acquire(u, direction, compute);
}

// One rank, CAST_AT_GATHER: unit u's master cast into the least recently
// used staging buffer that no held unit is in, on the compute stream (in
// compute order: the buffer's previous reader is done).
Tensor ParamGathers::stage(int u, Stream& compute) {
  Staged* best = nullptr;
  for (Staged& s : staged_) {
    if (!s.held && (!best || s.last_use < best->last_use)) best = &s;
  }
  if (best == nullptr) {
    MP_THROW(ConfigError, "unit ", u, ": every one of the ", staged_.size(),
             " cast staging buffers (precision.param_cast CAST_AT_GATHER on one rank) holds an unsharded unit: "
             "reshard one first, or raise sharding.held_units");
  }
  const UnitState& unit = units_[static_cast<size_t>(u)];
  const int64_t slot = best - staged_.data(), max = cast_staging_.numel() / static_cast<int64_t>(staged_.size());
  Tensor staging = cast_staging_.flat(slot * max, unit.full());
  convert(unit.master(), staging, {}, &compute);
  cast_elements_ += unit.full();
  *best = Staged{u, true, ++tick_};
  return staging;
}

bool ParamGathers::persistent() const {
  return o_.keeps_full_params() || (!o_.gathers_per_unit() && o_.precision.param_cast != ParamCast::kAtGather);
}

void ParamGathers::prefetch(int u, int direction) {
  if (o_.gathers_per_unit()) ring_.prefetch(u, direction);
}

void ParamGathers::release(int u, Event readers_done) {
  if (o_.keeps_full_params()) {
    full_[static_cast<size_t>(u)].released = std::move(readers_done);
  } else if (o_.gathers_per_unit()) {
    ring_.release(u, std::move(readers_done));
  } else {
    for (Staged& st : staged_) {
      if (st.unit == u) st.held = false;
    }
  }
}

void ParamGathers::updated(int u, Event update_done) {
  updated_[static_cast<size_t>(u)] = std::move(update_done);
  if (!o_.keeps_full_params()) return;
  if (o_.prefetch_depth == 0) {
    // Gathered on demand by the next forward (after the update: gather_source waits for it).
    full_[static_cast<size_t>(u)].stale = true;
    return;
  }
  issue_full_gather(u);
}

void ParamGathers::drop_ring() { ring_.drop(); }

void ParamGathers::prefetch_next_step(int u) {
  if (o_.gathers_per_unit() && o_.prefetch_depth > 0 && u < ring_.size()) ring_.prefetch_into(u);
}

void ParamGathers::replaced() {
  ring_.drop();  // gathered from the old state
  for (size_t u = 0; u < full_.size(); ++u) {
    comm_.wait(full_[u].gather);
    full_[u].gather.reset();
    updated_[u] = Event();
    if (o_.keeps_full_params()) issue_full_gather(static_cast<int>(u));
  }
}

}  // namespace mp
