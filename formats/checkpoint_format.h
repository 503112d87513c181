// formats/checkpoint_format.h: the files of a checkpoint (Note [Checkpoint
// format] in runtime/checkpoint.h) without an engine: the manifest's
// encoding and checks, shard files written and read block by block with a
// CRC32C per block, and element ranges assembled from the chunks of any
// number of shard files. runtime/checkpoint.cc saves and loads an engine's
// state with these; mp_worker --verify-checkpoint and the fuzzers
// (tests/fuzz/README.md) use them directly. Any process, no MPI.
//
// Files are untrusted: every size, offset and checksum is checked before it
// is used, and each failure throws ConfigError (IoError for a file that
// cannot be opened or read) naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/file_io.h"
#include "proto/mp.pb.h"

namespace mp {

inline constexpr uint32_t kCheckpointFormatVersion = 1;
inline constexpr int64_t kCheckpointBlockBytes = int64_t{1} << 20;
inline constexpr int64_t kCheckpointManifestHeaderBytes = 32;
inline constexpr int64_t kCheckpointShardHeaderBytes = 64;
inline constexpr int64_t kCheckpointChunkAlign = 64;
inline constexpr char kCheckpointManifestName[] = "manifest.pb";

std::string checkpoint_step_dir_name(int64_t step);  // step_00000100
std::string checkpoint_shard_file_name(int rank);    // shard_00003.bin

// Bytes per element of a field dtype as the manifest names it ("fp32",
// "bf16", "fp16", "int16"); 0 for any other name.
int64_t checkpoint_element_bytes(const std::string& dtype);

// manifest.pb: the 32-byte header (magic, version, CRC32C, payload bytes)
// and the binary proto.
std::string encode_checkpoint_manifest(const proto::CheckpointManifest& m);
// The same file around payload bytes as they are (the fuzz target's raw
// payloads, which need not parse).
std::string checkpoint_manifest_file(std::string_view payload);

// Checks header, checksum, proto and structure of manifest.pb's bytes;
// errors name `path`.
proto::CheckpointManifest decode_checkpoint_manifest(std::string_view bytes, const std::string& path);

// Structural checks: everything a reader indexes with is in range (units,
// parameters, field dtypes, file names, sizes, block checksum counts,
// chunks inside their unit and their file).
void check_checkpoint_manifest(const proto::CheckpointManifest& m, const std::string& path);

// The 64-byte header of a shard file: magic, version, rank, world, step.
std::string encode_checkpoint_shard_header(int rank, int world_size, int64_t step);

// Streams bytes into a new file, computing the CRC32C of every block.
class CheckpointBlockWriter {
 public:
  CheckpointBlockWriter(std::string path, int64_t block_bytes);
  void write(const void* data, int64_t size);
  void pad_to(int64_t align);  // zeros up to a multiple of `align`
  int64_t offset() const { return offset_; }
  // Records the last block's CRC and fsyncs; returns every block's CRC.
  std::vector<uint32_t> finish();

 private:
  std::string path_;
  int64_t block_;
  Fd fd_;
  int64_t offset_ = 0, in_block_ = 0;
  uint32_t crc_ = 0;
  std::vector<uint32_t> crcs_;
};

// A whole shard file from memory: writes `image`'s `size` bytes as a new
// file `path` and fsyncs it; returns the CRC32C of every block of
// `block_bytes` (as CheckpointBlockWriter::finish). Where `image` is
// kCheckpointImageAlign-aligned (readable up to `size` rounded up to that)
// the file is written with O_DIRECT where the file system takes it (else as
// usual), which bypasses the page cache: a small
// fraction of the kernel CPU time of a buffered write and its writeback
// (0.15 s against 2.1 s for 768 MiB on a 2-core VM), and no copy. For the
// background writer of asynchronous saves, whose CPU time is taken from
// training. `after_first_piece` (may be empty) runs once, after the first
// 8 MiB (or less) is written: MP_FAULT's hooks.
inline constexpr int64_t kCheckpointImageAlign = 4096;
// The bytes of a shard file's image with chunks of these sizes: the header
// and each chunk padded to kCheckpointChunkAlign (the file's layout),
// rounded up to kCheckpointImageAlign.
int64_t checkpoint_image_bytes(const std::vector<int64_t>& chunk_bytes);
std::vector<uint32_t> write_checkpoint_image(const std::string& path, const char* image, int64_t size,
                                             int64_t block_bytes,
                                             const std::function<void()>& after_first_piece = {});

// Reads byte ranges of one shard file of checkpoint `dir`, checking its
// size and header against the manifest and every block it touches against
// the manifest's CRC (each block once while it stays cached).
class CheckpointBlockReader {
 public:
  CheckpointBlockReader(const std::string& dir, const proto::CheckpointFile& f, int64_t block_bytes,
                        int64_t world_size);
  // Copies bytes [offset, offset + size) into out. The range must lie in
  // the file (check_checkpoint_manifest guarantees it for chunks).
  void read_checked(int64_t offset, int64_t size, char* out);
  int64_t bytes_read() const { return bytes_read_; }

 private:
  const std::string& block(int64_t b);

  std::string path_;
  const proto::CheckpointFile& file_;
  int64_t block_;
  Fd fd_;
  std::string buf_;
  int64_t cached_ = -1;
  int64_t bytes_read_ = 0;
};

// Element ranges of a checkpoint's fields, from whichever shard files hold
// them (Note [Resharding]): the loader of any world size asks for its own
// shard's range. `m` must have passed check_checkpoint_manifest and must
// outlive the reader.
class CheckpointReader {
 public:
  CheckpointReader(std::string dir, const proto::CheckpointManifest& m);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  // Fills `out` with elements [lo, hi) of field `field` of unit `unit`
  // ((hi - lo) * the field's element bytes). Elements below `need_hi` that
  // no chunk holds, and elements two chunks hold, are errors; elements from
  // need_hi on that no chunk holds are zero (padding the saving run did not
  // have). Throws ConfigError naming the unit, field and elements.
  void read(int unit, int field, int64_t lo, int64_t hi, int64_t need_hi, char* out);
  int64_t bytes_read() const;

 private:
  struct Piece {
    int file;
    const proto::CheckpointChunk* chunk;
  };
  CheckpointBlockReader& reader(int file);

  std::string dir_;
  const proto::CheckpointManifest& m_;
  std::vector<std::vector<std::vector<Piece>>> pieces_;  // [unit][field]
  std::vector<std::unique_ptr<CheckpointBlockReader>> readers_;  // [file], opened on first use
};

// The checkpoint a path names: the path itself when it holds manifest.pb,
// else ROOT/<the name in ROOT/latest>. Empty when `allow_missing` and the
// path has neither (a fresh start); otherwise IoError.
std::string resolve_checkpoint(const std::string& path, bool allow_missing = false);

// Reads and checks manifest.pb of a checkpoint directory (its header,
// checksum and internal consistency).
proto::CheckpointManifest read_checkpoint_manifest(const std::string& checkpoint_dir);

// Checks every file of a checkpoint: sizes, headers, every block's checksum,
// and that the chunks hold every element of every field exactly once.
// Returns the bytes checked.
int64_t verify_checkpoint(const std::string& checkpoint_dir);

}  // namespace mp
