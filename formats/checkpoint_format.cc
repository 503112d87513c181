#include "formats/checkpoint_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

#include "core/crc32c.h"
#include "core/error.h"

namespace mp {

namespace fs = std::filesystem;

namespace {

constexpr char kManifestMagic[8] = {'M', 'P', 'C', 'K', 'M', 'A', 'N', 'I'};
constexpr char kShardMagic[8] = {'M', 'P', 'C', 'K', 'S', 'H', 'R', 'D'};
constexpr int64_t kMaxManifestBytes = int64_t{1} << 30;
constexpr int64_t kMaxBlockBytes = int64_t{1} << 30;

static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian; add byte swaps");
void put_u32(char* p, uint32_t v) { std::memcpy(p, &v, sizeof v); }
void put_u64(char* p, uint64_t v) { std::memcpy(p, &v, sizeof v); }
uint32_t get_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
uint64_t get_u64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
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

}  // namespace

std::string checkpoint_step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string checkpoint_shard_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard_%05d.bin", rank);
  return buf;
}

int64_t checkpoint_element_bytes(const std::string& dtype) {
  if (dtype == "fp32") return 4;
  if (dtype == "bf16" || dtype == "fp16" || dtype == "int16") return 2;
  return 0;
}

// ---- the manifest ------------------------------------------------------------------

std::string encode_checkpoint_manifest(const proto::CheckpointManifest& m) {
  std::string payload;
  MP_ENFORCE(m.SerializeToString(&payload), "cannot serialize the checkpoint manifest");
  return checkpoint_manifest_file(payload);
}

std::string checkpoint_manifest_file(std::string_view payload) {
  std::string out(kCheckpointManifestHeaderBytes, '\0');
  std::memcpy(out.data(), kManifestMagic, 8);
  put_u32(out.data() + 8, kCheckpointFormatVersion);
  put_u32(out.data() + 12, crc32c(payload));
  put_u64(out.data() + 16, payload.size());
  return out.append(payload);
}

proto::CheckpointManifest decode_checkpoint_manifest(std::string_view bytes, const std::string& path) {
  if (static_cast<int64_t>(bytes.size()) < kCheckpointManifestHeaderBytes ||
      std::memcmp(bytes.data(), kManifestMagic, 8) != 0) {
    MP_THROW(ConfigError, "checkpoint manifest '", path, "': bad magic (not an mp checkpoint manifest)");
  }
  const uint32_t version = get_u32(bytes.data() + 8);
  if (version != kCheckpointFormatVersion) {
    MP_THROW(ConfigError, "checkpoint manifest '", path, "': format version ", version, ", this build reads ",
             kCheckpointFormatVersion);
  }
  const uint64_t size = get_u64(bytes.data() + 16);
  if (size != bytes.size() - kCheckpointManifestHeaderBytes) {
    MP_THROW(ConfigError, "checkpoint manifest '", path, "': header says ", size, " payload bytes, the file has ",
             bytes.size() - kCheckpointManifestHeaderBytes, " (truncated or appended to)");
  }
  const std::string_view payload = bytes.substr(kCheckpointManifestHeaderBytes);
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
  check_checkpoint_manifest(m, path);
  return m;
}

void check_checkpoint_manifest(const proto::CheckpointManifest& m, const std::string& path) {
  auto bad = [&](const auto&... parts) { MP_THROW(ConfigError, "checkpoint manifest '", path, "': ", parts...); };
  if (m.world_size() < 1) bad("world_size ", m.world_size(), " < 1");
  if (m.step() < 0) bad("step ", m.step(), " < 0");
  if (m.block_bytes() < 1 || m.block_bytes() > kMaxBlockBytes) bad("block_bytes ", m.block_bytes(), " out of range");
  if (m.units_size() < 1) bad("no units");
  for (int u = 0; u < m.units_size(); ++u) {
    const proto::CheckpointUnit& cu = m.units(u);
    if (cu.numel() < 0 || cu.padded_numel() < cu.numel()) {
      bad("unit ", u, " (", cu.name(), "): numel ", cu.numel(), ", padded ", cu.padded_numel());
    }
    for (const proto::CheckpointParam& p : cu.params()) {
      if (p.offset() < 0 || p.numel() < 0 || p.offset() > cu.numel() - p.numel()) {
        bad("parameter ", p.name(), " [", p.offset(), ", +", p.numel(), ") outside unit ", cu.name(), " of ", cu.numel());
      }
    }
    for (const proto::CheckpointField& f : cu.fields()) {
      if (checkpoint_element_bytes(f.dtype()) == 0) {
        bad("unit ", cu.name(), " field ", f.name(), ": unknown dtype '", f.dtype(), "'");
      }
    }
  }
  std::set<std::string> names;
  for (const proto::CheckpointFile& f : m.files()) {
    if (f.name().empty() || f.name().find('/') != std::string::npos || f.name() == "." || f.name() == "..") {
      bad("file name '", f.name(), "' is not a plain file name");
    }
    if (!names.insert(f.name()).second) bad("file ", f.name(), " listed twice");
    if (f.rank() < 0 || f.rank() >= m.world_size()) bad("file ", f.name(), ": rank ", f.rank(), " of ", m.world_size());
    if (f.size_bytes() < kCheckpointShardHeaderBytes) bad("file ", f.name(), ": size ", f.size_bytes(), " < the header");
    const int64_t blocks = (f.size_bytes() - 1) / m.block_bytes() + 1;
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
      const int64_t eb = checkpoint_element_bytes(cu.fields(c.field()).dtype());
      if (c.file_offset() < kCheckpointShardHeaderBytes || c.file_offset() > f.size_bytes() ||
          (c.end() - c.begin()) > (f.size_bytes() - c.file_offset()) / eb) {
        bad("file ", f.name(), ": chunk of unit ", cu.name(), " at byte ", c.file_offset(), " with ", c.end() - c.begin(),
            " elements overruns the file's ", f.size_bytes(), " bytes");
      }
    }
  }
}

std::string encode_checkpoint_shard_header(int rank, int world_size, int64_t step) {
  std::string header(kCheckpointShardHeaderBytes, '\0');
  std::memcpy(header.data(), kShardMagic, 8);
  put_u32(header.data() + 8, kCheckpointFormatVersion);
  put_u32(header.data() + 12, static_cast<uint32_t>(rank));
  put_u32(header.data() + 16, static_cast<uint32_t>(world_size));
  put_u64(header.data() + 24, static_cast<uint64_t>(step));
  return header;
}

// ---- shard files: writing -------------------------------------------------------------

CheckpointBlockWriter::CheckpointBlockWriter(std::string path, int64_t block_bytes)
    : path_(std::move(path)), block_(block_bytes) {
  fd_ = Fd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd_.get() < 0) MP_THROW(IoError, "checkpoint file '", path_, "': cannot create: ", std::strerror(errno));
}

void CheckpointBlockWriter::write(const void* data, int64_t size) {
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

void CheckpointBlockWriter::pad_to(int64_t align) {
  static const char zeros[kCheckpointChunkAlign] = {};
  MP_ENFORCE(align >= 1 && align <= kCheckpointChunkAlign, "pad_to(", align, ")");
  const int64_t pad = (align - offset_ % align) % align;
  if (pad > 0) write(zeros, pad);
}

std::vector<uint32_t> CheckpointBlockWriter::finish() {
  if (in_block_ > 0) crcs_.push_back(crc_);
  in_block_ = 0;
  if (::fsync(fd_.get()) != 0) MP_THROW(IoError, "checkpoint '", path_, "': fsync failed: ", std::strerror(errno));
  return crcs_;
}

int64_t checkpoint_image_bytes(const std::vector<int64_t>& chunk_bytes) {
  auto up = [](int64_t n, int64_t a) { return (n + a - 1) / a * a; };
  int64_t bytes = kCheckpointShardHeaderBytes;
  for (const int64_t b : chunk_bytes) bytes += up(b, kCheckpointChunkAlign);
  return up(bytes, kCheckpointImageAlign);
}

std::vector<uint32_t> write_checkpoint_image(const std::string& path, const char* image, int64_t size,
                                             int64_t block_bytes, const std::function<void()>& after_first_piece) {
  const bool aligned_image = reinterpret_cast<uintptr_t>(image) % kCheckpointImageAlign == 0;
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  Fd fd(aligned_image ? ::open(path.c_str(), kFlags | O_DIRECT, 0644) : -1);
  bool direct = fd.get() >= 0;  // else EINVAL: a file system without O_DIRECT (tmpfs)
  if (!direct) fd = Fd(::open(path.c_str(), kFlags, 0644));
  if (fd.get() < 0) MP_THROW(IoError, "checkpoint file '", path, "': cannot create: ", std::strerror(errno));
  auto buffered = [&] {  // from here on
    const int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_DIRECT) != 0) {
      MP_THROW(IoError, "checkpoint file '", path, "': cannot leave O_DIRECT: ", std::strerror(errno));
    }
    direct = false;
  };
  // Bytes [at, at + n), n a multiple of the alignment while direct.
  auto put = [&](int64_t at, int64_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd.get(), image + at, static_cast<size_t>(n));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EINVAL && direct) {  // an alignment the device refuses
        buffered();
        continue;
      }
      if (w <= 0) MP_THROW(IoError, "checkpoint file '", path, "': write failed: ", std::strerror(errno));
      at += w;
      n -= w;
    }
  };
  const int64_t piece = std::max<int64_t>(1, (int64_t{8} << 20) / block_bytes) * block_bytes;
  std::vector<uint32_t> crcs;
  for (int64_t at = 0; at < size;) {
    const int64_t n = std::min(piece, size - at);
    for (int64_t b = at; b < at + n; b += block_bytes) {
      crcs.push_back(crc32c_extend(0, image + b, static_cast<size_t>(std::min(block_bytes, size - b))));
    }
    const int64_t aligned = direct ? n / kCheckpointImageAlign * kCheckpointImageAlign : n;
    put(at, aligned);
    if (aligned < n) {  // the file's unaligned tail
      buffered();
      put(at + aligned, n - aligned);
    }
    if (at == 0 && after_first_piece) after_first_piece();
    at += n;
  }
  if (size == 0 && after_first_piece) after_first_piece();
  if (::fsync(fd.get()) != 0) MP_THROW(IoError, "checkpoint '", path, "': fsync failed: ", std::strerror(errno));
  return crcs;
}

// ---- shard files: reading -----------------------------------------------------------

CheckpointBlockReader::CheckpointBlockReader(const std::string& dir, const proto::CheckpointFile& f,
                                             int64_t block_bytes, int64_t world_size)
    : path_(dir + "/" + f.name()), file_(f), block_(block_bytes) {
  fd_ = Fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd_.get() < 0) MP_THROW(IoError, "checkpoint file '", path_, "': cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) MP_THROW(IoError, "checkpoint file '", path_, "': ", std::strerror(errno));
  if (st.st_size != f.size_bytes()) {
    MP_THROW(ConfigError, "checkpoint file '", path_, "': ", st.st_size, " bytes, the manifest says ", f.size_bytes(),
             st.st_size < f.size_bytes() ? " (truncated)" : "");
  }
  char header[kCheckpointShardHeaderBytes];
  read_checked(0, kCheckpointShardHeaderBytes, header);
  if (std::memcmp(header, kShardMagic, 8) != 0) MP_THROW(ConfigError, "checkpoint file '", path_, "': bad magic");
  if (get_u32(header + 8) != kCheckpointFormatVersion) {
    MP_THROW(ConfigError, "checkpoint file '", path_, "': format version ", get_u32(header + 8), ", this build reads ",
             kCheckpointFormatVersion);
  }
  if (static_cast<int64_t>(get_u32(header + 12)) != f.rank() || static_cast<int64_t>(get_u32(header + 16)) != world_size) {
    MP_THROW(ConfigError, "checkpoint file '", path_, "': written by rank ", get_u32(header + 12), " of ",
             get_u32(header + 16), ", the manifest says rank ", f.rank(), " of ", world_size);
  }
}

void CheckpointBlockReader::read_checked(int64_t offset, int64_t size, char* out) {
  MP_ENFORCE(offset >= 0 && size >= 0 && offset <= file_.size_bytes() - size, "checkpoint file '", path_,
             "': bytes [", offset, ", +", size, ") outside its ", file_.size_bytes());
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

const std::string& CheckpointBlockReader::block(int64_t b) {
  if (cached_ == b) return buf_;
  const int64_t begin = b * block_, len = std::min(block_, file_.size_bytes() - begin);
  buf_.resize(static_cast<size_t>(len));
  errno = 0;
  if (!pread_all(fd_.get(), buf_.data(), static_cast<size_t>(len), static_cast<uint64_t>(begin))) {
    MP_THROW(IoError, "checkpoint file '", path_, "': cannot read bytes [", begin, ", ", begin + len, "): ",
             errno != 0 ? std::strerror(errno) : "unexpected end of file");
  }
  bytes_read_ += len;
  if (crc32c(buf_) != file_.block_crc32c(static_cast<int>(b))) {
    cached_ = -1;
    MP_THROW(ConfigError, "checkpoint file '", path_, "': checksum mismatch in bytes [", begin, ", ", begin + len,
             ") (block ", b, "): the data is corrupt");
  }
  cached_ = b;
  return buf_;
}

// ---- element ranges -------------------------------------------------------------------

CheckpointReader::CheckpointReader(std::string dir, const proto::CheckpointManifest& m)
    : dir_(std::move(dir)), m_(m), readers_(static_cast<size_t>(m.files_size())) {
  pieces_.resize(static_cast<size_t>(m.units_size()));
  for (int u = 0; u < m.units_size(); ++u) pieces_[static_cast<size_t>(u)].resize(static_cast<size_t>(m.units(u).fields_size()));
  for (int fi = 0; fi < m.files_size(); ++fi) {
    for (const proto::CheckpointChunk& c : m.files(fi).chunks()) {
      pieces_[static_cast<size_t>(c.unit())][static_cast<size_t>(c.field())].push_back(Piece{fi, &c});
    }
  }
}

CheckpointReader::~CheckpointReader() = default;

CheckpointBlockReader& CheckpointReader::reader(int file) {
  auto& r = readers_[static_cast<size_t>(file)];
  if (!r) r = std::make_unique<CheckpointBlockReader>(dir_, m_.files(file), m_.block_bytes(), m_.world_size());
  return *r;
}

void CheckpointReader::read(int unit, int field, int64_t lo, int64_t hi, int64_t need_hi, char* out) {
  MP_ENFORCE(unit >= 0 && unit < m_.units_size() && field >= 0 && field < m_.units(unit).fields_size(),
             "checkpoint '", dir_, "': no field ", field, " of unit ", unit);
  const proto::CheckpointUnit& cu = m_.units(unit);
  const std::string& field_name = cu.fields(field).name();
  const int64_t eb = checkpoint_element_bytes(cu.fields(field).dtype());
  std::memset(out, 0, static_cast<size_t>((hi - lo) * eb));
  std::vector<std::pair<int64_t, int64_t>> covered;
  for (const Piece& p : pieces_[static_cast<size_t>(unit)][static_cast<size_t>(field)]) {
    const int64_t b = std::max(lo, p.chunk->begin()), en = std::min(hi, p.chunk->end());
    if (b >= en) continue;
    reader(p.file).read_checked(p.chunk->file_offset() + (b - p.chunk->begin()) * eb, (en - b) * eb,
                                out + (b - lo) * eb);
    covered.emplace_back(b, en);
  }
  std::sort(covered.begin(), covered.end());
  int64_t at = lo;
  for (const auto& [b, en] : covered) {
    if (b > at && at < need_hi) break;
    if (b < at) {
      MP_THROW(ConfigError, "checkpoint '", dir_, "': unit ", cu.name(), " field ", field_name, ": elements [", b, ", ",
               std::min(at, en), ") are in two chunks");
    }
    at = en;
  }
  if (at < need_hi) {
    MP_THROW(ConfigError, "checkpoint '", dir_, "': unit ", cu.name(), " field ", field_name,
             ": no file holds elements from ", at, " (this rank needs [", lo, ", ", need_hi, "))");
  }
}

int64_t CheckpointReader::bytes_read() const {
  int64_t n = 0;
  for (const auto& r : readers_) n += r ? r->bytes_read() : 0;
  return n;
}

// ---- whole checkpoints ----------------------------------------------------------------

std::string resolve_checkpoint(const std::string& path, bool allow_missing) {
  if (fs::exists(path + "/" + kCheckpointManifestName)) return path;
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
  MP_THROW(IoError, "checkpoint '", path, "': neither a checkpoint (", kCheckpointManifestName,
           ") nor a checkpoint root (latest)");
}

proto::CheckpointManifest read_checkpoint_manifest(const std::string& dir) {
  const std::string path = dir + "/" + kCheckpointManifestName;
  if (!fs::exists(path)) {
    MP_THROW(IoError, "checkpoint '", dir, "': no ", kCheckpointManifestName,
             " (not a checkpoint, or a save that did not finish)");
  }
  const std::string bytes =
      read_small_file(path, kMaxManifestBytes + kCheckpointManifestHeaderBytes, "checkpoint manifest");
  return decode_checkpoint_manifest(bytes, path);
}

int64_t verify_checkpoint(const std::string& dir) {
  const proto::CheckpointManifest m = read_checkpoint_manifest(dir);
  int64_t total = 0;
  for (const proto::CheckpointFile& f : m.files()) {
    CheckpointBlockReader r(dir, f, m.block_bytes(), m.world_size());
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
          if (c.unit() == u && c.field() == f && c.end() > c.begin()) ranges.emplace_back(c.begin(), c.end());
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
