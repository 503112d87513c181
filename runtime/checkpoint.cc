#include "runtime/checkpoint.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"
#include "core/tensor.h"
#include "mp/config.h"
#include "runtime/fault.h"
#include "runtime/shard_state.h"

namespace mp {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- files ----------------------------------------------------------------------

void fsync_dir(const std::string& dir) {
  if (!fsync_directory(dir)) MP_THROW(IoError, "checkpoint directory '", dir, "': fsync failed: ", std::strerror(errno));
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    MP_THROW(IoError, "checkpoint: cannot rename '", from, "' to '", to, "': ", std::strerror(errno));
  }
}

// ---- the engine's state (runtime/shard_state.h) --------------------------------------

// This rank's part of unit u's shard: replicas split it evenly.
std::pair<int64_t, int64_t> my_write_range(const ShardStateView& state, int u) {
  const int R = state.replicate_size(), j = state.replicate_rank();
  const int64_t n = state.shard_numel(u), begin = state.shard_begin(u);
  const int64_t per = n / R, extra = n % R;
  const int64_t b = j * per + std::min<int64_t>(j, extra);
  const int64_t len = per + (j < extra ? 1 : 0);
  return {begin + b, begin + b + len};
}

// One chunk of this rank's shard file: field `field` of unit `unit` over
// global elements [begin, end), `bytes` bytes.
struct ChunkPlan {
  int unit = 0, field = 0;
  int64_t begin = 0, end = 0, bytes = 0;
};

// This rank's chunks, in file order.
std::vector<ChunkPlan> plan_chunks(const ShardStateView& state) {
  std::vector<ChunkPlan> chunks;
  for (int u = 0; u < state.layout().num_units(); ++u) {
    const auto [b, end] = my_write_range(state, u);
    if (b >= end) continue;
    const std::vector<ShardField> fields = state.fields(u);
    for (size_t f = 0; f < fields.size(); ++f) {
      chunks.push_back(ChunkPlan{u, static_cast<int>(f), b, end, (end - b) * fields[f].element_bytes});
    }
  }
  return chunks;
}

// This rank's shard file described (Note [Checkpoint format]): its name and
// rank, and each chunk at its offset, the first after the header, each at a
// multiple of kCheckpointChunkAlign; returns the bytes up to the last
// chunk's end (what the file holds but for the sizes and checksums).
int64_t describe_shard_file(const std::vector<ChunkPlan>& chunks, int rank, proto::CheckpointFile& file) {
  file.set_name(checkpoint_shard_file_name(rank));
  file.set_rank(rank);
  int64_t pos = kCheckpointShardHeaderBytes;
  for (const ChunkPlan& k : chunks) {
    pos = (pos + kCheckpointChunkAlign - 1) / kCheckpointChunkAlign * kCheckpointChunkAlign;
    proto::CheckpointChunk* c = file.add_chunks();
    c->set_unit(k.unit);
    c->set_field(k.field);
    c->set_begin(k.begin);
    c->set_end(k.end);
    c->set_file_offset(pos);
    pos += k.bytes;
  }
  return pos;
}

// MP_FAULT write_fail (tests): the write of DIR/NAME fails as on a full disk.
void inject_write_fail(const std::string& dir, const std::string& name, int64_t step, int rank) {
  if (find_fault(FaultKind::kWriteFail, step, rank) != nullptr) {
    MP_THROW(IoError, "checkpoint file '", dir, "/", name,
             "': write failed: No space left on device (injected by MP_FAULT write_fail)");
  }
}

// Writes and fsyncs DIR/shard_RANK.bin, this rank's chunks of the engine's
// state: the header, then each chunk's bytes as state.read stages them.
proto::CheckpointFile write_shard_file(const ShardStateView& state, const std::string& dir, int64_t step) {
  const int rank = state.world().rank();
  const std::vector<ChunkPlan> chunks = plan_chunks(state);
  proto::CheckpointFile file;
  describe_shard_file(chunks, rank, file);
  CheckpointBlockWriter w(dir + "/" + file.name(), kCheckpointBlockBytes);
  const std::string header = encode_checkpoint_shard_header(rank, state.world().size(), step);
  w.write(header.data(), static_cast<int64_t>(header.size()));
  inject_write_fail(dir, file.name(), step, rank);
  std::vector<char> staging;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkPlan& k = chunks[i];
    if (i == 1) inject_save_kill(step, rank);  // MP_FAULT save_kill (tests): the file is half written
    w.pad_to(kCheckpointChunkAlign);
    MP_ENFORCE_EQ(w.offset(), file.chunks(static_cast<int>(i)).file_offset());
    w.write(state.read(k.unit, k.field, k.begin - state.shard_begin(k.unit), k.end - k.begin, staging), k.bytes);
  }
  file.set_size_bytes(w.offset());
  for (const uint32_t crc : w.finish()) file.add_block_crc32c(crc);
  return file;
}

// The checkpoint must describe this model and keep the fields this
// policy needs.
void check_compatible(const ShardStateView& state, const proto::CheckpointManifest& m, const std::string& dir) {
  const FlatLayout& L = state.layout();
  if (m.units_size() != L.num_units()) {
    MP_THROW(ConfigError, "checkpoint '", dir, "' has ", m.units_size(), " units, the model has ", L.num_units());
  }
  for (int u = 0; u < L.num_units(); ++u) {
    const UnitLayout& ul = L.unit(u);
    const proto::CheckpointUnit& cu = m.units(u);
    if (cu.name() != ul.name || cu.params_size() != static_cast<int>(ul.params.size())) {
      MP_THROW(ConfigError, "checkpoint '", dir, "': unit ", u, " is '", cu.name(), "' with ", cu.params_size(),
               " parameters and ", cu.numel(), " elements; the model's is '", ul.name, "' with ", ul.params.size(),
               " and ", ul.numel);
    }
    for (size_t k = 0; k < ul.params.size(); ++k) {
      const ParamPlacement& pp = ul.params[k];
      const proto::CheckpointParam& cp = cu.params(static_cast<int>(k));
      const Shape shape(cp.shape().begin(), cp.shape().end());
      if (cp.name() != pp.name || shape != pp.shape || cp.offset() != pp.offset || cp.numel() != pp.numel) {
        MP_THROW(ConfigError, "checkpoint '", dir, "': parameter ", k, " of unit ", ul.name, " is ", cp.name(), " ",
                 shape_string(shape), " at ", cp.offset(), "; the model has ", pp.name, " ", shape_string(pp.shape),
                 " at ", pp.offset);
      }
    }
    if (cu.numel() != ul.numel) {
      MP_THROW(ConfigError, "checkpoint '", dir, "': unit ", ul.name, " has ", cu.numel(), " elements, the model's ",
               ul.numel);
    }
    const std::vector<ShardField> fields = state.fields(u);
    bool same = cu.fields_size() == static_cast<int>(fields.size());
    for (size_t f = 0; same && f < fields.size(); ++f) {
      same = cu.fields(static_cast<int>(f)).name() == fields[f].name && cu.fields(static_cast<int>(f)).dtype() == fields[f].dtype;
    }
    if (!same) {
      std::string have, want;
      for (const proto::CheckpointField& f : cu.fields()) have += " " + f.name() + ":" + f.dtype();
      for (const ShardField& f : fields) want += " " + f.name + ":" + f.dtype;
      MP_THROW(ConfigError, "checkpoint '", dir, "' (precision ", m.precision(), ") stores", have,
               "; this run's precision policy (", state.options().precision.describe(), ") keeps", want,
               ": load with the checkpoint's precision settings");
    }
  }
}

// Rank 0, before a save: creates the root and an empty temporary directory;
// true (and nothing created) when `latest` already names this step's.
bool prepare_save(const std::string& root, const std::string& final_dir, const std::string& tmp_dir) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) MP_THROW(IoError, "checkpoint root '", root, "': cannot create: ", ec.message());
  if (fs::exists(final_dir + "/" + kCheckpointManifestName) && resolve_checkpoint(root, true) == final_dir) return true;
  fs::remove_all(tmp_dir, ec);
  if (!fs::create_directory(tmp_dir, ec) || ec) {
    MP_THROW(IoError, "checkpoint directory '", tmp_dir, "': cannot create: ", ec.message());
  }
  return false;
}

void describe_optimizer(const Optimizer& opt, proto::OptimizerCheckpoint* oc) {
  oc->set_kind(opt.kind().name());
  oc->set_steps_done(opt.steps_done());
  oc->set_steps_skipped(opt.steps_skipped());
  if (const LossScaler* s = opt.loss_scaler()) {
    const LossScaler::State st = s->state();
    oc->set_has_loss_scaler(true);
    oc->set_loss_scale(st.scale);
    oc->set_growth_tracker(st.growth_tracker);
    oc->set_hysteresis_left(st.hysteresis_left);
    oc->set_scaler_skipped(st.skipped);
  }
}

void describe_unit(const UnitLayout& ul, const std::vector<ShardField>& fields, proto::CheckpointUnit* cu) {
  cu->set_name(ul.name);
  cu->set_numel(ul.numel);
  cu->set_padded_numel(ul.padded_numel);
  for (const ParamPlacement& pp : ul.params) {
    proto::CheckpointParam* cp = cu->add_params();
    cp->set_name(pp.name);
    for (const int64_t d : pp.shape) cp->add_shape(d);
    cp->set_offset(pp.offset);
    cp->set_numel(pp.numel);
  }
  for (const ShardField& f : fields) {
    proto::CheckpointField* cf = cu->add_fields();
    cf->set_name(f.name);
    cf->set_dtype(f.dtype);
  }
}

// The manifest of the engine's state at `step`, but for its files.
proto::CheckpointManifest make_manifest(const ShardStateView& state, int64_t step, const std::string& config_text) {
  const EngineOptions& o = state.options();
  proto::CheckpointManifest m;
  m.set_format_version(kCheckpointFormatVersion);
  m.set_mp_version(MP_VERSION);
  m.set_step(step);
  m.set_world_size(state.world().size());
  m.set_shard_size(o.shard_size);
  m.set_strategy(o.strategy);
  m.set_precision(o.precision.describe());
  m.set_seed(o.seed);
  m.set_data_step(step);
  describe_optimizer(state.optimizer(), m.mutable_optimizer());
  for (int u = 0; u < state.layout().num_units(); ++u) {
    describe_unit(state.layout().unit(u), state.fields(u), m.add_units());
  }
  m.set_block_bytes(kCheckpointBlockBytes);
  m.set_config(config_text);
  m.set_created_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count());
  return m;
}

// The files the ranks wrote (serialized proto::CheckpointFile, in rank order).
void add_files(proto::CheckpointManifest& m, const std::vector<std::string>& files) {
  for (const std::string& f : files) {
    if (!m.add_files()->ParseFromString(f)) MP_THROW(IoError, "checkpoint save: a rank's file description is corrupt");
  }
}

// Rank 0, after `latest` moved to `name`: only the newest keep_last complete
// checkpoints stay, and no temporaries. Removing a checkpoint of GPT-2 124M
// takes 0.2 s here: asynchronous saves do it in the background.
void prune(const std::string& root, const std::string& name, int keep_last) {
  std::error_code ec;
  std::vector<std::pair<std::string, std::string>> steps;  // (name, path)
  for (const fs::directory_entry& d : fs::directory_iterator(root, ec)) {
    const std::string n = d.path().filename().string();
    if (n.rfind(".tmp-", 0) == 0) fs::remove_all(d.path(), ec);
    if (n.rfind("step_", 0) == 0 && d.is_directory()) steps.emplace_back(n, d.path().string());
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < steps.size(); ++i) {
    if (steps[i].first != name) fs::remove_all(steps[i].second, ec);
  }
}

// Rank 0, the last steps of a save (Note [Atomic saves]): the manifest into
// the temporary directory, which becomes ROOT/name, then `latest`.
void publish(const proto::CheckpointManifest& m, const std::string& root, const std::string& name,
             const std::string& tmp_dir) {
  const std::string final_dir = root + "/" + name;
  check_checkpoint_manifest(m, tmp_dir + "/" + kCheckpointManifestName);
  write_file_atomic(tmp_dir + "/" + kCheckpointManifestName, encode_checkpoint_manifest(m), "checkpoint manifest");
  fsync_dir(tmp_dir);
  std::error_code ec;
  if (fs::exists(final_dir)) fs::remove_all(final_dir, ec);  // not `latest` (checked before): a leftover
  rename_or_throw(tmp_dir, final_dir);
  fsync_dir(root);
  write_file_atomic(root + "/latest", name + "\n", "checkpoint pointer");
}

// Rank 0 prepares the temporary directory (agreed); true on every rank when
// `latest` already names this step's checkpoint.
bool begin_save(Communicator& world, const std::string& root, const std::string& final_dir,
                const std::string& tmp_dir) {
  bool already = false;
  world.agree("checkpoint save", [&] {
    if (world.rank() == 0) already = prepare_save(root, final_dir, tmp_dir);
  });
  return world.broadcast_bytes(already ? "1" : "0", 0) == "1";
}

// Every rank's file is complete (`mine`, this rank's): gathers their
// descriptions and rank 0 publishes `manifest()` with them (agreed), then
// prunes unless keep_last is 0 (the caller's). Returns the bytes of all
// shard files.
template <class ManifestFn>
int64_t finish_save(Communicator& world, const proto::CheckpointFile& mine, const ManifestFn& manifest,
                    const std::string& root, const std::string& name, const std::string& tmp_dir, int keep_last) {
  std::string mine_bytes;
  mine.SerializeToString(&mine_bytes);
  const std::vector<std::string> files = world.all_gather_bytes(mine_bytes);
  world.agree("checkpoint save", [&] {
    if (world.rank() != 0) return;
    proto::CheckpointManifest m = manifest();
    add_files(m, files);
    publish(m, root, name, tmp_dir);
    if (keep_last > 0) prune(root, name, keep_last);
  });
  int64_t bytes = 0;
  for (const std::string& f : files) {
    proto::CheckpointFile cf;
    cf.ParseFromString(f);
    bytes += cf.size_bytes();
  }
  return bytes;
}

// The background writer yields the cores to the training threads on a busy
// host (Linux: a thread's own nice value).
void lower_thread_priority() { (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10); }

}  // namespace

// ---- public ---------------------------------------------------------------------

CheckpointInfo save_checkpoint(Engine& engine, const std::string& root, const CheckpointSaveOptions& options) {
  const ShardStateView state = engine.shard_state();
  const auto t0 = Clock::now();
  MP_ENFORCE_GE(options.keep_last, 1);
  Communicator& world = state.world();
  const int64_t step = state.steps_run();
  const std::string name = checkpoint_step_dir_name(step);
  const std::string final_dir = root + "/" + name, tmp_dir = root + "/.tmp-" + name;
  CheckpointInfo info{.path = final_dir, .step = step};
  if (begin_save(world, root, final_dir, tmp_dir)) {
    info.seconds = since(t0);
    return info;
  }
  proto::CheckpointFile mine;
  world.agree("checkpoint save", [&] { mine = write_shard_file(state, tmp_dir, step); });
  info.bytes = finish_save(world, mine, [&] { return make_manifest(state, step, options.config_text); }, root, name,
                           tmp_dir, options.keep_last);
  info.seconds = since(t0);
  return info;
}

// ---- CheckpointWriter (Note [Asynchronous saves]) --------------------------------------

struct CheckpointWriter::Pending {
  int64_t step = 0;
  std::string name, final_dir, tmp_dir;
  proto::CheckpointManifest manifest;  // but for the files
  proto::CheckpointFile file;          // but for its size and checksums (the thread's)
  int64_t file_bytes = 0;              // the file: the snapshot's first bytes
  double snapshot_seconds = 0;
  std::thread thread;
  // Written by the thread before `done`; read after it or after join().
  std::atomic<bool> done{false};
  std::exception_ptr error;
  double write_seconds = 0;
};

CheckpointWriter::CheckpointWriter(Engine& engine, std::string root, CheckpointSaveOptions options)
    : engine_(engine), root_(std::move(root)), options_(std::move(options)) {
  MP_ENFORCE_GE(options_.keep_last, 1);
}

CheckpointWriter::~CheckpointWriter() {
  join();
  join_prune();
}

void CheckpointWriter::join() {
  if (pending_ != nullptr && pending_->thread.joinable()) pending_->thread.join();
}

void CheckpointWriter::join_prune() {
  if (prune_.joinable()) prune_.join();
}

bool CheckpointWriter::written() const {
  return pending_ == nullptr || pending_->done.load(std::memory_order_acquire);
}

size_t CheckpointWriter::snapshot_bytes() const { return snapshot_.size_bytes(); }

CheckpointInfo CheckpointWriter::save_async() {
  wait();  // at most one save in flight; its commit precedes this prepare
  join_prune();  // which removes stale .tmp-* directories: never this save's
  const ShardStateView state = engine_.shard_state();
  const auto t0 = Clock::now();
  Communicator& world = state.world();
  auto p = std::make_unique<Pending>();
  p->step = state.steps_run();
  p->name = checkpoint_step_dir_name(p->step);
  p->final_dir = root_ + "/" + p->name;
  p->tmp_dir = root_ + "/.tmp-" + p->name;
  CheckpointInfo info{.path = p->final_dir, .step = p->step};
  if (begin_save(world, root_, p->final_dir, p->tmp_dir)) {
    info.seconds = since(t0);
    return info;
  }
  const int rank = world.rank(), world_size = world.size();
  world.agree("checkpoint save", [&] {
    // The snapshot is the shard file's image (Note [Checkpoint format]):
    // the header, then each chunk at its 64-byte aligned offset; the
    // padding stays zero (the buffer starts zeroed, chunks never cover it).
    const std::vector<ChunkPlan> chunks = plan_chunks(state);
    p->file_bytes = describe_shard_file(chunks, rank, p->file);
    std::vector<int64_t> chunk_bytes;
    for (const ChunkPlan& k : chunks) chunk_bytes.push_back(k.bytes);
    const auto image_bytes = static_cast<size_t>(checkpoint_image_bytes(chunk_bytes));
    if (snapshot_.size_bytes() != image_bytes || snapshot_.device() != state.device()) {
      snapshot_ = PinnedBuffer();  // the old one first: never both at once
      snapshot_ = PinnedBuffer(state.device(), image_bytes);
    }
    const std::string header = encode_checkpoint_shard_header(rank, world_size, p->step);
    std::memcpy(snapshot_.data(), header.data(), header.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      const ChunkPlan& k = chunks[i];
      state.read_into(k.unit, k.field, k.begin - state.shard_begin(k.unit), k.end - k.begin, snapshot_,
                      p->file.chunks(static_cast<int>(i)).file_offset());
    }
    if (world.rank() == 0) p->manifest = make_manifest(state, p->step, options_.config_text);
  });
  p->snapshot_seconds = since(t0);
  const char* image = static_cast<const char*>(snapshot_.data());
  Pending* q = p.get();
  p->thread = std::thread([q, image, rank] {
    lower_thread_priority();
    const auto w0 = Clock::now();
    try {
      const std::vector<uint32_t> crcs =
          write_checkpoint_image(q->tmp_dir + "/" + q->file.name(), image, q->file_bytes, kCheckpointBlockBytes, [&] {
            inject_write_fail(q->tmp_dir, q->file.name(), q->step, rank);  // MP_FAULT (tests)
            inject_save_kill(q->step, rank);  // MP_FAULT save_kill (tests): the file is partly written
          });
      q->file.set_size_bytes(q->file_bytes);
      for (const uint32_t crc : crcs) q->file.add_block_crc32c(crc);
    } catch (...) {
      q->error = std::current_exception();
    }
    q->write_seconds = since(w0);
    q->done.store(true, std::memory_order_release);
  });
  pending_ = std::move(p);
  info.seconds = pending_->snapshot_seconds;
  return info;
}

std::optional<CheckpointInfo> CheckpointWriter::wait() {
  if (pending_ == nullptr) return std::nullopt;
  join();
  const std::unique_ptr<Pending> p = std::move(pending_);  // gone whatever the outcome
  Communicator& world = engine_.shard_state().world();
  world.agree("checkpoint save", [&] {
    if (p->error) std::rethrow_exception(p->error);
  });
  CheckpointInfo info{.path = p->final_dir, .step = p->step};
  join_prune();
  info.bytes = finish_save(world, p->file, [&] { return p->manifest; }, root_, p->name, p->tmp_dir, 0);
  if (world.rank() == 0) {
    prune_ = std::thread([root = root_, name = p->name, keep_last = options_.keep_last] {
      lower_thread_priority();
      prune(root, name, keep_last);
    });
  }
  info.seconds = p->snapshot_seconds;
  info.write_seconds = p->write_seconds;
  return info;
}

proto::CheckpointManifest load_checkpoint(Engine& engine, const std::string& dir, CheckpointInfo* info) {
  ShardStateView state = engine.shard_state();
  Optimizer& opt = state.optimizer();
  const auto t0 = Clock::now();
  proto::CheckpointManifest m;
  int64_t bytes_read = 0;
  state.world().agree("checkpoint load", [&] {
    m = read_checkpoint_manifest(dir);
    if (const std::string& kind = m.optimizer().kind(); !kind.empty() && kind != opt.kind().name()) {
      MP_THROW(ConfigError, "checkpoint '", dir, "' was saved with optimizer.kind = ", kind, ", whose state this run's ",
               opt.kind().name(), " does not read: load with the checkpoint's optimizer kind");
    }
    check_compatible(state, m, dir);
    CheckpointReader reader(dir, m);
    for (int u = 0; u < state.layout().num_units(); ++u) {
      const int64_t lo = state.shard_begin(u), hi = lo + state.shard_numel(u);
      const int64_t need_hi = std::min(hi, state.layout().unit(u).numel);  // beyond: padding
      const size_t num_fields = state.fields(u).size();
      std::vector<char> staging;
      for (size_t f = 0; f < num_fields; ++f) {
        const int field = static_cast<int>(f);
        reader.read(u, field, lo, hi, need_hi, state.write_target(u, field, 0, hi - lo, staging));
        state.commit_write(u, field, 0, hi - lo, staging);
      }
    }
    bytes_read = reader.bytes_read();
    const proto::OptimizerCheckpoint& oc = m.optimizer();
    if (oc.steps_done() < 0 || oc.steps_skipped() < 0 || oc.steps_done() + oc.steps_skipped() > m.step()) {
      MP_THROW(ConfigError, "checkpoint '", dir, "': optimizer counters (", oc.steps_done(), " done, ",
               oc.steps_skipped(), " skipped) do not fit step ", m.step());
    }
    if (oc.has_loss_scaler() != (opt.loss_scaler() != nullptr)) {
      MP_THROW(ConfigError, "checkpoint '", dir, "' was saved ", oc.has_loss_scaler() ? "with" : "without",
               " dynamic loss scaling; this run is ", opt.loss_scaler() ? "with" : "without");
    }
    if (oc.has_loss_scaler()) {
      opt.restore_loss_scaler(LossScaler::State{oc.loss_scale(), oc.growth_tracker(), oc.hysteresis_left(),
                                                oc.scaler_skipped()});
    }
    opt.restore_counters(oc.steps_done(), oc.steps_skipped());
    state.set_steps_run(m.step());
  });
  state.replaced();
  if (info != nullptr) {
    info->path = dir;
    info->step = m.step();
    info->bytes = bytes_read;
    info->seconds = since(t0);
  }
  return m;
}

}  // namespace mp
