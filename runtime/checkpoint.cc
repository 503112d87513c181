#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "mp/config.h"
#include "runtime/crc32c.h"
#include "runtime/engine_impl.h"
#include "runtime/error.h"
#include "runtime/fault.h"
#include "runtime/file_io.h"

namespace mp {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kManifestMagic[8] = {'M', 'P', 'C', 'K', 'M', 'A', 'N', 'I'};
constexpr char kShardMagic[8] = {'M', 'P', 'C', 'K', 'S', 'H', 'R', 'D'};
constexpr int64_t kManifestHeaderBytes = 32;
constexpr int64_t kShardHeaderBytes = 64;
constexpr int64_t kChunkAlign = 64;
constexpr int64_t kMaxManifestBytes = int64_t{1} << 30;
constexpr char kManifestName[] = "manifest.pb";

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string shard_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard_%05d.bin", rank);
  return buf;
}

void put_u32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFFu);
}
void put_u64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFFu);
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// ---- files ----------------------------------------------------------------------

void fsync_or_throw(int fd, const std::string& path) {
  if (::fsync(fd) != 0) MP_THROW(IoError, "checkpoint '", path, "': fsync failed: ", std::strerror(errno));
}

void fsync_dir(const std::string& dir) {
  if (!fsync_directory(dir)) MP_THROW(IoError, "checkpoint directory '", dir, "': fsync failed: ", std::strerror(errno));
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    MP_THROW(IoError, "checkpoint: cannot rename '", from, "' to '", to, "': ", std::strerror(errno));
  }
}

std::string read_small_file(const std::string& path, int64_t limit, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) MP_THROW(IoError, what, " '", path, "': cannot open: ", std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || size > limit) MP_THROW(ConfigError, what, " '", path, "': ", size, " bytes, more than ", limit);
  in.seekg(0);
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), size);
  if (!in) MP_THROW(IoError, what, " '", path, "': cannot read ", size, " bytes");
  return bytes;
}

// ---- cross-rank agreement ---------------------------------------------------------

// Every rank's string, in rank order. Collective over `c`.
std::vector<std::string> all_gather_strings(Communicator& c, const std::string& mine) {
  const int W = c.size();
  // Lengths as two exact float halves (16 bits each).
  float len[2] = {static_cast<float>(mine.size() >> 16), static_cast<float>(mine.size() & 0xFFFFu)};
  std::vector<float> lens(2 * static_cast<size_t>(W));
  c.all_gather(Tensor::wrap(len, Device::cpu(), DType::kF32, {2}),
               Tensor::wrap(lens.data(), Device::cpu(), DType::kF32, {2 * static_cast<int64_t>(W)}))
      ->wait();
  std::vector<size_t> sizes(static_cast<size_t>(W));
  size_t longest = 1;
  for (int r = 0; r < W; ++r) {
    sizes[static_cast<size_t>(r)] = (static_cast<size_t>(lens[2 * static_cast<size_t>(r)]) << 16) +
                                    static_cast<size_t>(lens[2 * static_cast<size_t>(r) + 1]);
    longest = std::max(longest, sizes[static_cast<size_t>(r)]);
  }
  // The bytes, padded to the longest; a 1-byte dtype moves them unchanged.
  std::string padded = mine;
  padded.resize(longest, '\0');
  std::string all(longest * static_cast<size_t>(W), '\0');
  c.all_gather(Tensor::wrap(padded.data(), Device::cpu(), DType::kF8E4M3, {static_cast<int64_t>(longest)}),
               Tensor::wrap(all.data(), Device::cpu(), DType::kF8E4M3, {static_cast<int64_t>(all.size())}))
      ->wait();
  std::vector<std::string> out(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) out[static_cast<size_t>(r)] = all.substr(static_cast<size_t>(r) * longest, sizes[static_cast<size_t>(r)]);
  return out;
}

// A failure on one rank as a string: a type letter, then the message.
std::string describe_failure(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const ConfigError& x) {
    return std::string("C") + x.what();
  } catch (const IoError& x) {
    return std::string("I") + x.what();
  } catch (const std::exception& x) {
    return std::string("E") + x.what();
  }
}

// Runs `body` on every rank; if it threw on any rank, every rank throws:
// the first failed rank's error type and message (its own exception where
// a rank failed itself). Collective over `c`.
template <class F>
void agree(Communicator& c, const char* what, F body) {
  std::exception_ptr local;
  try {
    body();
  } catch (...) {
    local = std::current_exception();
  }
  const std::vector<std::string> all = all_gather_strings(c, local ? describe_failure(local) : std::string());
  if (local) std::rethrow_exception(local);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    const std::string msg = detail::str(what, " failed on rank ", r, ": ", all[r].substr(1));
    if (all[r][0] == 'C') MP_THROW(ConfigError, msg);
    if (all[r][0] == 'I') MP_THROW(IoError, msg);
    MP_THROW(IoError, msg);
  }
}

// ---- the engine's state -------------------------------------------------------------

struct FieldRef {
  std::string name;
  std::string dtype;
  int64_t element_bytes = 0;
  char* data = nullptr;  // this rank's shard of the field: unit.n elements
};

std::string dtype_label(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
    default: return std::string(dtype_name(t));
  }
}

}  // namespace

// Access to the engine's internals (a friend of Engine).
class CheckpointIo {
 public:
  static Engine::Impl& of(Engine& e) { return *e.impl_; }
};

namespace {

std::vector<FieldRef> unit_fields(Engine::Impl& e, int u) {
  EngineUnit& unit = e.units[static_cast<size_t>(u)];
  std::vector<FieldRef> f;
  auto add = [&](const char* name, const Tensor& t) {
    if (!t.defined()) return;
    f.push_back(FieldRef{name, dtype_label(t.dtype()), static_cast<int64_t>(dtype_size(t.dtype())),
                         static_cast<char*>(t.data())});
  };
  add("master", unit.master);
  add("param", unit.param_shard);
  if (unit.remainder.data() != nullptr) {
    f.push_back(FieldRef{"remainder", "int16", 2, static_cast<char*>(unit.remainder.data())});
  }
  add("state0", unit.state0);
  add("state1", unit.state1);
  return f;
}

int64_t element_bytes_of(const std::string& dtype) {
  if (dtype == "fp32") return 4;
  if (dtype == "bf16" || dtype == "fp16" || dtype == "int16") return 2;
  return 0;
}

// ---- shard files: writing -------------------------------------------------------------

// Streams bytes into a file, computing the CRC32C of every block.
class BlockWriter {
 public:
  BlockWriter(std::string path, int64_t block) : path_(std::move(path)), block_(block) {
    fd_ = Fd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd_.get() < 0) MP_THROW(IoError, "checkpoint file '", path_, "': cannot create: ", std::strerror(errno));
  }
  void write(const void* data, int64_t size) {
    const char* p = static_cast<const char*>(data);
    write_all(fd_.get(), p, static_cast<size_t>(size), "checkpoint file", path_);
    while (size > 0) {
      const int64_t take = std::min(size, block_ - in_block_);
      crc_ = crc32c_extend(crc_, p, static_cast<size_t>(take));
      in_block_ += take;
      p += take;
      size -= take;
      offset_ += take;
      if (in_block_ == block_) {
        crcs_.push_back(crc_);
        crc_ = 0;
        in_block_ = 0;
      }
    }
  }
  void pad_to(int64_t align) {
    static const char zeros[kChunkAlign] = {};
    const int64_t pad = (align - offset_ % align) % align;
    if (pad > 0) write(zeros, pad);
  }
  int64_t offset() const { return offset_; }
  // Flushes the last block's CRC, fsyncs; returns the block CRCs.
  std::vector<uint32_t> finish() {
    if (in_block_ > 0) crcs_.push_back(crc_);
    in_block_ = 0;
    fsync_or_throw(fd_.get(), path_);
    return crcs_;
  }

 private:
  std::string path_;
  int64_t block_;
  Fd fd_;
  int64_t offset_ = 0, in_block_ = 0;
  uint32_t crc_ = 0;
  std::vector<uint32_t> crcs_;
};

// This rank's part of unit u's shard: replicas split it evenly.
std::pair<int64_t, int64_t> my_write_range(const Engine::Impl& e, int u) {
  const EngineUnit& unit = e.units[static_cast<size_t>(u)];
  const int R = e.mesh.replicate->size(), j = e.mesh.replicate->rank();
  const int64_t per = unit.n / R, extra = unit.n % R;
  const int64_t b = j * per + std::min<int64_t>(j, extra);
  const int64_t len = per + (j < extra ? 1 : 0);
  return {unit.offset + b, unit.offset + b + len};
}

proto::CheckpointFile write_shard_file(Engine::Impl& e, const std::string& dir, int64_t step) {
  const int rank = e.world.rank();
  proto::CheckpointFile file;
  file.set_name(shard_file_name(rank));
  file.set_rank(rank);
  BlockWriter w(dir + "/" + file.name(), kCheckpointBlockBytes);
  char header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, 8);
  put_u32(header + 8, kCheckpointFormatVersion);
  put_u32(header + 12, static_cast<uint32_t>(rank));
  put_u32(header + 16, static_cast<uint32_t>(e.world.size()));
  put_u64(header + 24, static_cast<uint64_t>(step));
  w.write(header, kShardHeaderBytes);
  if (find_fault(FaultKind::kWriteFail, step, rank) != nullptr) {  // MP_FAULT (tests)
    MP_THROW(IoError, "checkpoint file '", dir, "/", file.name(),
             "': write failed: No space left on device (injected by MP_FAULT write_fail)");
  }
  for (int u = 0; u < e.layout.num_units(); ++u) {
    const EngineUnit& unit = e.units[static_cast<size_t>(u)];
    const auto [b, end] = my_write_range(e, u);
    if (b >= end) continue;
    const std::vector<FieldRef> fields = unit_fields(e, u);
    for (size_t f = 0; f < fields.size(); ++f) {
      w.pad_to(kChunkAlign);
      proto::CheckpointChunk* c = file.add_chunks();
      c->set_unit(u);
      c->set_field(static_cast<int32_t>(f));
      c->set_begin(b);
      c->set_end(end);
      c->set_file_offset(w.offset());
      w.write(fields[f].data + (b - unit.offset) * fields[f].element_bytes, (end - b) * fields[f].element_bytes);
    }
  }
  file.set_size_bytes(w.offset());
  for (const uint32_t crc : w.finish()) file.add_block_crc32c(crc);
  return file;
}

// ---- the manifest ------------------------------------------------------------------

std::string encode_manifest(const proto::CheckpointManifest& m) {
  std::string payload;
  MP_ENFORCE(m.SerializeToString(&payload), "cannot serialize the checkpoint manifest");
  std::string out(kManifestHeaderBytes, '\0');
  std::memcpy(out.data(), kManifestMagic, 8);
  put_u32(out.data() + 8, kCheckpointFormatVersion);
  put_u32(out.data() + 12, crc32c(payload));
  put_u64(out.data() + 16, payload.size());
  return out + payload;
}

// Structural checks: everything the loader indexes with is in range.
void check_manifest(const proto::CheckpointManifest& m, const std::string& path) {
  auto bad = [&](const auto&... parts) { MP_THROW(ConfigError, "checkpoint manifest '", path, "': ", parts...); };
  if (m.world_size() < 1) bad("world_size ", m.world_size(), " < 1");
  if (m.step() < 0) bad("step ", m.step(), " < 0");
  if (m.block_bytes() < 1 || m.block_bytes() > (int64_t{1} << 30)) bad("block_bytes ", m.block_bytes(), " out of range");
  if (m.units_size() < 1) bad("no units");
  for (int u = 0; u < m.units_size(); ++u) {
    const proto::CheckpointUnit& cu = m.units(u);
    if (cu.numel() < 0 || cu.padded_numel() < cu.numel()) {
      bad("unit ", u, " (", cu.name(), "): numel ", cu.numel(), ", padded ", cu.padded_numel());
    }
    for (const proto::CheckpointParam& p : cu.params()) {
      if (p.offset() < 0 || p.numel() < 0 || p.offset() + p.numel() > cu.numel()) {
        bad("parameter ", p.name(), " [", p.offset(), ", +", p.numel(), ") outside unit ", cu.name(), " of ", cu.numel());
      }
    }
    for (const proto::CheckpointField& f : cu.fields()) {
      if (element_bytes_of(f.dtype()) == 0) bad("unit ", cu.name(), " field ", f.name(), ": unknown dtype '", f.dtype(), "'");
    }
  }
  std::set<std::string> names;
  for (const proto::CheckpointFile& f : m.files()) {
    if (f.name().empty() || f.name().find('/') != std::string::npos || f.name() == "." || f.name() == "..") {
      bad("file name '", f.name(), "' is not a plain file name");
    }
    if (!names.insert(f.name()).second) bad("file ", f.name(), " listed twice");
    if (f.size_bytes() < kShardHeaderBytes) bad("file ", f.name(), ": size ", f.size_bytes(), " < the header");
    const int64_t blocks = (f.size_bytes() + m.block_bytes() - 1) / m.block_bytes();
    if (f.block_crc32c_size() != blocks) {
      bad("file ", f.name(), ": ", f.block_crc32c_size(), " block checksums for ", blocks, " blocks");
    }
    for (const proto::CheckpointChunk& c : f.chunks()) {
      if (c.unit() < 0 || c.unit() >= m.units_size()) bad("file ", f.name(), ": chunk of unit ", c.unit(), " (no such unit)");
      const proto::CheckpointUnit& cu = m.units(c.unit());
      if (c.field() < 0 || c.field() >= cu.fields_size()) {
        bad("file ", f.name(), ": chunk of field ", c.field(), " of unit ", cu.name(), " (no such field)");
      }
      if (c.begin() < 0 || c.end() < c.begin() || c.end() > cu.padded_numel()) {
        bad("file ", f.name(), ": chunk [", c.begin(), ", ", c.end(), ") outside unit ", cu.name(), " of ",
            cu.padded_numel());
      }
      const int64_t eb = element_bytes_of(cu.fields(c.field()).dtype());
      if (c.file_offset() < kShardHeaderBytes || c.file_offset() > f.size_bytes() ||
          (c.end() - c.begin()) > (f.size_bytes() - c.file_offset()) / eb) {
        bad("file ", f.name(), ": chunk of unit ", cu.name(), " at byte ", c.file_offset(), " with ", c.end() - c.begin(),
            " elements overruns the file's ", f.size_bytes(), " bytes");
      }
    }
  }
}

// ---- shard files: reading -----------------------------------------------------------

// Reads byte ranges of one shard file, checking each 1 MiB block it touches
// against the manifest's CRC (each block once per reader).
class BlockReader {
 public:
  BlockReader(const std::string& dir, const proto::CheckpointFile& f, int64_t block, int64_t world)
      : path_(dir + "/" + f.name()), file_(f), block_(block) {
    fd_ = Fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd_.get() < 0) MP_THROW(IoError, "checkpoint file '", path_, "': cannot open: ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) MP_THROW(IoError, "checkpoint file '", path_, "': ", std::strerror(errno));
    if (st.st_size != f.size_bytes()) {
      MP_THROW(ConfigError, "checkpoint file '", path_, "': ", st.st_size, " bytes, the manifest says ", f.size_bytes(),
               st.st_size < f.size_bytes() ? " (truncated)" : "");
    }
    char header[kShardHeaderBytes];
    read_checked(0, kShardHeaderBytes, header);
    if (std::memcmp(header, kShardMagic, 8) != 0) MP_THROW(ConfigError, "checkpoint file '", path_, "': bad magic");
    if (get_u32(header + 8) != kCheckpointFormatVersion) {
      MP_THROW(ConfigError, "checkpoint file '", path_, "': format version ", get_u32(header + 8), ", this build reads ",
               kCheckpointFormatVersion);
    }
    if (static_cast<int64_t>(get_u32(header + 12)) != f.rank() || static_cast<int64_t>(get_u32(header + 16)) != world) {
      MP_THROW(ConfigError, "checkpoint file '", path_, "': written by rank ", get_u32(header + 12), " of ",
               get_u32(header + 16), ", the manifest says rank ", f.rank(), " of ", world);
    }
  }

  // Copies bytes [offset, offset + size) into out, checking every block.
  void read_checked(int64_t offset, int64_t size, char* out) {
    int64_t pos = offset;
    while (pos < offset + size) {
      const int64_t b = pos / block_;
      const std::string& blk = block(b);
      const int64_t in = pos - b * block_;
      const int64_t take = std::min<int64_t>(offset + size - pos, static_cast<int64_t>(blk.size()) - in);
      std::memcpy(out + (pos - offset), blk.data() + in, static_cast<size_t>(take));
      pos += take;
    }
  }
  int64_t bytes_read() const { return bytes_read_; }

 private:
  const std::string& block(int64_t b) {
    if (cached_ == b) return buf_;
    const int64_t begin = b * block_, len = std::min(block_, file_.size_bytes() - begin);
    buf_.resize(static_cast<size_t>(len));
    errno = 0;
    if (!pread_all(fd_.get(), buf_.data(), static_cast<size_t>(len), static_cast<uint64_t>(begin))) {
      MP_THROW(IoError, "checkpoint file '", path_, "': cannot read bytes [", begin, ", ", begin + len, "): ",
               errno != 0 ? std::strerror(errno) : "unexpected end of file");
    }
    bytes_read_ += len;
    const uint32_t crc = crc32c(buf_);
    if (crc != file_.block_crc32c(static_cast<int>(b))) {
      MP_THROW(ConfigError, "checkpoint file '", path_, "': checksum mismatch in bytes [", begin, ", ", begin + len,
               ") (block ", b, "): the data is corrupt");
    }
    cached_ = b;
    return buf_;
  }

  std::string path_;
  const proto::CheckpointFile& file_;
  int64_t block_;
  Fd fd_;
  std::string buf_;
  int64_t cached_ = -1;
  int64_t bytes_read_ = 0;
};

std::string shape_text(const google::protobuf::RepeatedField<int64_t>& s) {
  std::string t = "[";
  for (int i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

std::string shape_text(const Shape& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The checkpoint must describe this model and keep the fields this
// policy needs.
void check_compatible(Engine::Impl& e, const proto::CheckpointManifest& m, const std::string& dir) {
  const FlatLayout& L = e.layout;
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
      const bool same_shape = cp.shape_size() == static_cast<int>(pp.shape.size()) &&
                              std::equal(pp.shape.begin(), pp.shape.end(), cp.shape().begin());
      if (cp.name() != pp.name || !same_shape || cp.offset() != pp.offset || cp.numel() != pp.numel) {
        MP_THROW(ConfigError, "checkpoint '", dir, "': parameter ", k, " of unit ", ul.name, " is ", cp.name(), " ",
                 shape_text(cp.shape()), " at ", cp.offset(), "; the model has ", pp.name, " ", shape_text(pp.shape),
                 " at ", pp.offset);
      }
    }
    if (cu.numel() != ul.numel) {
      MP_THROW(ConfigError, "checkpoint '", dir, "': unit ", ul.name, " has ", cu.numel(), " elements, the model's ",
               ul.numel);
    }
    const std::vector<FieldRef> fields = unit_fields(e, u);
    bool same = cu.fields_size() == static_cast<int>(fields.size());
    for (size_t f = 0; same && f < fields.size(); ++f) {
      same = cu.fields(static_cast<int>(f)).name() == fields[f].name && cu.fields(static_cast<int>(f)).dtype() == fields[f].dtype;
    }
    if (!same) {
      std::string have, want;
      for (const proto::CheckpointField& f : cu.fields()) have += " " + f.name() + ":" + f.dtype();
      for (const FieldRef& f : fields) want += " " + f.name + ":" + f.dtype;
      MP_THROW(ConfigError, "checkpoint '", dir, "' (precision ", m.precision(), ") stores", have,
               "; this run's precision policy (", e.o.precision.describe(), ") keeps", want,
               ": load with the checkpoint's precision settings");
    }
  }
}

}  // namespace

// ---- public ---------------------------------------------------------------------

proto::CheckpointManifest read_checkpoint_manifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifestName;
  if (!fs::exists(path)) {
    MP_THROW(IoError, "checkpoint '", dir, "': no ", kManifestName, " (not a checkpoint, or a save that did not finish)");
  }
  const std::string bytes = read_small_file(path, kMaxManifestBytes + kManifestHeaderBytes, "checkpoint manifest");
  if (static_cast<int64_t>(bytes.size()) < kManifestHeaderBytes || std::memcmp(bytes.data(), kManifestMagic, 8) != 0) {
    MP_THROW(ConfigError, "checkpoint manifest '", path, "': bad magic (not an mp checkpoint manifest)");
  }
  const uint32_t version = get_u32(bytes.data() + 8);
  if (version != kCheckpointFormatVersion) {
    MP_THROW(ConfigError, "checkpoint manifest '", path, "': format version ", version, ", this build reads ",
             kCheckpointFormatVersion);
  }
  const uint64_t size = get_u64(bytes.data() + 16);
  if (size != bytes.size() - kManifestHeaderBytes) {
    MP_THROW(ConfigError, "checkpoint manifest '", path, "': header says ", size, " payload bytes, the file has ",
             bytes.size() - kManifestHeaderBytes, " (truncated or appended to)");
  }
  const std::string_view payload(bytes.data() + kManifestHeaderBytes, size);
  if (crc32c(payload) != get_u32(bytes.data() + 12)) {
    MP_THROW(ConfigError, "checkpoint manifest '", path, "': checksum mismatch (the manifest was edited or is corrupt)");
  }
  proto::CheckpointManifest m;
  if (!m.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    MP_THROW(ConfigError, "checkpoint manifest '", path, "': not a valid CheckpointManifest");
  }
  if (m.format_version() != kCheckpointFormatVersion) {
    MP_THROW(ConfigError, "checkpoint manifest '", path, "': format_version ", m.format_version());
  }
  check_manifest(m, path);
  return m;
}

std::string resolve_checkpoint(const std::string& path, bool allow_missing) {
  if (fs::exists(path + "/" + kManifestName)) return path;
  const std::string latest = path + "/latest";
  if (fs::exists(latest)) {
    std::string name = read_small_file(latest, 4096, "checkpoint pointer");
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (name.empty() || name.find('/') != std::string::npos) {
      MP_THROW(ConfigError, "checkpoint pointer '", latest, "': '", name, "' is not a checkpoint directory name");
    }
    return path + "/" + name;
  }
  if (allow_missing) return "";
  MP_THROW(IoError, "checkpoint '", path, "': neither a checkpoint (", kManifestName, ") nor a checkpoint root (latest)");
}

CheckpointInfo save_checkpoint(Engine& engine, const std::string& root, const CheckpointSaveOptions& options) {
  Engine::Impl& e = CheckpointIo::of(engine);
  const auto t0 = Clock::now();
  MP_ENFORCE_GE(options.keep_last, 1);
  Communicator& world = e.world;
  const int64_t step = e.steps_run;
  const std::string name = step_dir_name(step);
  const std::string final_dir = root + "/" + name, tmp_dir = root + "/.tmp-" + name;
  CheckpointInfo info;
  info.path = final_dir;
  info.step = step;

  // Rank 0 prepares the temporary directory, or finds this step saved.
  bool already = false;
  agree(world, "checkpoint save", [&] {
    if (world.rank() != 0) return;
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) MP_THROW(IoError, "checkpoint root '", root, "': cannot create: ", ec.message());
    if (fs::exists(final_dir + "/" + kManifestName) && resolve_checkpoint(root, true) == final_dir) {
      already = true;
      return;
    }
    fs::remove_all(tmp_dir, ec);
    if (!fs::create_directory(tmp_dir, ec) || ec) {
      MP_THROW(IoError, "checkpoint directory '", tmp_dir, "': cannot create: ", ec.message());
    }
  });
  float flag = already ? 1.0f : 0.0f;
  world.broadcast(Tensor::wrap(&flag, Device::cpu(), DType::kF32, {1}), 0)->wait();
  if (flag != 0.0f) {
    info.seconds = since(t0);
    return info;
  }

  proto::CheckpointFile mine;
  agree(world, "checkpoint save", [&] { mine = write_shard_file(e, tmp_dir, step); });
  std::string mine_bytes;
  mine.SerializeToString(&mine_bytes);
  const std::vector<std::string> files = all_gather_strings(world, mine_bytes);

  agree(world, "checkpoint save", [&] {
    if (world.rank() != 0) return;
    proto::CheckpointManifest m;
    m.set_format_version(kCheckpointFormatVersion);
    m.set_mp_version(MP_VERSION);
    m.set_step(step);
    m.set_world_size(world.size());
    m.set_shard_size(e.o.shard_size);
    m.set_strategy(e.o.strategy);
    m.set_precision(e.o.precision.describe());
    m.set_seed(e.o.seed);
    m.set_data_step(step);
    proto::OptimizerCheckpoint* oc = m.mutable_optimizer();
    oc->set_steps_done(e.opt->steps_done());
    oc->set_steps_skipped(e.opt->steps_skipped());
    if (const LossScaler* s = e.opt->loss_scaler()) {
      const LossScaler::State st = s->state();
      oc->set_has_loss_scaler(true);
      oc->set_loss_scale(st.scale);
      oc->set_growth_tracker(st.growth_tracker);
      oc->set_hysteresis_left(st.hysteresis_left);
      oc->set_scaler_skipped(st.skipped);
    }
    for (int u = 0; u < e.layout.num_units(); ++u) {
      const UnitLayout& ul = e.layout.unit(u);
      proto::CheckpointUnit* cu = m.add_units();
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
      for (const FieldRef& f : unit_fields(e, u)) {
        proto::CheckpointField* cf = cu->add_fields();
        cf->set_name(f.name);
        cf->set_dtype(f.dtype);
      }
    }
    m.set_block_bytes(kCheckpointBlockBytes);
    for (const std::string& f : files) {
      if (!m.add_files()->ParseFromString(f)) MP_THROW(IoError, "checkpoint save: a rank's file description is corrupt");
    }
    m.set_config(options.config_text);
    m.set_created_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count());
    check_manifest(m, tmp_dir + "/" + kManifestName);
    write_file_atomic(tmp_dir + "/" + kManifestName, encode_manifest(m), "checkpoint manifest");
    fsync_dir(tmp_dir);
    std::error_code ec;
    if (fs::exists(final_dir)) fs::remove_all(final_dir, ec);  // not `latest` (checked above): a leftover
    rename_or_throw(tmp_dir, final_dir);
    fsync_dir(root);
    write_file_atomic(root + "/latest", name + "\n", "checkpoint pointer");
    // Keep the newest keep_last complete checkpoints; drop stale temporaries.
    std::vector<std::pair<std::string, std::string>> steps;  // (name, path)
    for (const fs::directory_entry& d : fs::directory_iterator(root, ec)) {
      const std::string n = d.path().filename().string();
      if (n.rfind(".tmp-", 0) == 0) fs::remove_all(d.path(), ec);
      if (n.rfind("step_", 0) == 0 && d.is_directory()) steps.emplace_back(n, d.path().string());
    }
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + static_cast<size_t>(options.keep_last) < steps.size(); ++i) {
      if (steps[i].first != name) fs::remove_all(steps[i].second, ec);
    }
  });
  for (const std::string& f : files) {
    proto::CheckpointFile cf;
    cf.ParseFromString(f);
    info.bytes += cf.size_bytes();
  }
  info.seconds = since(t0);
  return info;
}

proto::CheckpointManifest load_checkpoint(Engine& engine, const std::string& dir, CheckpointInfo* info) {
  Engine::Impl& e = CheckpointIo::of(engine);
  const auto t0 = Clock::now();
  proto::CheckpointManifest m;
  int64_t bytes_read = 0;
  agree(e.world, "checkpoint load", [&] {
    m = read_checkpoint_manifest(dir);
    check_compatible(e, m, dir);
    // Which chunks each (unit, field) has, and in which file.
    struct Piece {
      int file;
      const proto::CheckpointChunk* chunk;
    };
    std::map<std::pair<int, int>, std::vector<Piece>> pieces;
    for (int fi = 0; fi < m.files_size(); ++fi) {
      for (const proto::CheckpointChunk& c : m.files(fi).chunks()) pieces[{c.unit(), c.field()}].push_back(Piece{fi, &c});
    }
    std::map<int, std::unique_ptr<BlockReader>> readers;  // opened on first use
    auto reader = [&](int fi) -> BlockReader& {
      auto& r = readers[fi];
      if (!r) r = std::make_unique<BlockReader>(dir, m.files(fi), m.block_bytes(), m.world_size());
      return *r;
    };
    for (int u = 0; u < e.layout.num_units(); ++u) {
      const EngineUnit& unit = e.units[static_cast<size_t>(u)];
      const int64_t lo = unit.offset, hi = unit.offset + unit.n;
      const int64_t need_hi = std::min(hi, e.layout.unit(u).numel);  // beyond: padding
      const std::vector<FieldRef> fields = unit_fields(e, u);
      for (size_t f = 0; f < fields.size(); ++f) {
        const FieldRef& fr = fields[f];
        std::memset(fr.data, 0, static_cast<size_t>(unit.n * fr.element_bytes));
        std::vector<std::pair<int64_t, int64_t>> covered;
        for (const Piece& p : pieces[{u, static_cast<int>(f)}]) {
          const int64_t b = std::max(lo, p.chunk->begin()), en = std::min(hi, p.chunk->end());
          if (b >= en) continue;
          reader(p.file).read_checked(p.chunk->file_offset() + (b - p.chunk->begin()) * fr.element_bytes,
                                      (en - b) * fr.element_bytes, fr.data + (b - lo) * fr.element_bytes);
          covered.emplace_back(b, en);
        }
        std::sort(covered.begin(), covered.end());
        int64_t at = lo;
        for (const auto& [b, en] : covered) {
          if (b > at && at < need_hi) break;
          if (b < at) {
            MP_THROW(ConfigError, "checkpoint '", dir, "': unit ", e.layout.unit(u).name, " field ", fr.name,
                     ": elements [", b, ", ", std::min(at, en), ") are in two chunks");
          }
          at = en;
        }
        if (at < need_hi) {
          MP_THROW(ConfigError, "checkpoint '", dir, "': unit ", e.layout.unit(u).name, " field ", fr.name,
                   ": no file holds elements from ", at, " (this rank needs [", lo, ", ", need_hi, "))");
        }
      }
    }
    for (const auto& [fi, r] : readers) bytes_read += r->bytes_read();
    const proto::OptimizerCheckpoint& oc = m.optimizer();
    if (oc.steps_done() < 0 || oc.steps_skipped() < 0 || oc.steps_done() + oc.steps_skipped() > m.step()) {
      MP_THROW(ConfigError, "checkpoint '", dir, "': optimizer counters (", oc.steps_done(), " done, ",
               oc.steps_skipped(), " skipped) do not fit step ", m.step());
    }
    if (oc.has_loss_scaler() != (e.opt->loss_scaler() != nullptr)) {
      MP_THROW(ConfigError, "checkpoint '", dir, "' was saved ", oc.has_loss_scaler() ? "with" : "without",
               " dynamic loss scaling; this run is ", e.opt->loss_scaler() ? "with" : "without");
    }
    if (oc.has_loss_scaler()) {
      e.opt->restore_loss_scaler(LossScaler::State{oc.loss_scale(), oc.growth_tracker(), oc.hysteresis_left(),
                                                   oc.scaler_skipped()});
    }
    e.opt->restore_counters(oc.steps_done(), oc.steps_skipped());
    e.steps_run = m.step();
  });
  e.state_replaced();
  if (info != nullptr) {
    info->path = dir;
    info->step = m.step();
    info->bytes = bytes_read;
    info->seconds = since(t0);
  }
  return m;
}

int64_t verify_checkpoint(const std::string& dir) {
  const proto::CheckpointManifest m = read_checkpoint_manifest(dir);
  int64_t total = 0;
  for (const proto::CheckpointFile& f : m.files()) {
    BlockReader r(dir, f, m.block_bytes(), m.world_size());
    std::string buf(static_cast<size_t>(std::min<int64_t>(f.size_bytes(), m.block_bytes())), '\0');
    for (int64_t at = 0; at < f.size_bytes(); at += m.block_bytes()) {
      r.read_checked(at, std::min<int64_t>(m.block_bytes(), f.size_bytes() - at), buf.data());
    }
    total += f.size_bytes();
  }
  // Every element of every field, once.
  for (int u = 0; u < m.units_size(); ++u) {
    for (int f = 0; f < m.units(u).fields_size(); ++f) {
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (const proto::CheckpointFile& file : m.files()) {
        for (const proto::CheckpointChunk& c : file.chunks()) {
          if (c.unit() == u && c.field() == f) ranges.emplace_back(c.begin(), c.end());
        }
      }
      std::sort(ranges.begin(), ranges.end());
      int64_t at = 0;
      for (const auto& [b, en] : ranges) {
        if (b != at) break;
        at = en;
      }
      if (at < m.units(u).numel()) {
        MP_THROW(ConfigError, "checkpoint '", dir, "': unit ", m.units(u).name(), " field ",
                 m.units(u).fields(f).name(), ": elements from ", at, " are missing or overlap");
      }
    }
  }
  return total;
}

}  // namespace mp
