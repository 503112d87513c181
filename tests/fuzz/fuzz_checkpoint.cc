// tests/fuzz/fuzz_checkpoint.cc: the checkpoint manifest and shard readers
// (formats/checkpoint_format.h) on untrusted files.
//
// Input layout:
//   byte 0       flags: 1 = the manifest part is the proto payload and the
//                harness writes a correct header (magic, version, CRC32C,
//                size) before it; 2 = also make the listed shard files'
//                size_bytes and block CRCs match the files written (so the
//                fuzzer gets past the checksums to the chunk logic);
//                4 = two shard files
//   u32 n        then n bytes: the manifest part
//   (flag 4)     u32 m, then m bytes: shard_00000.bin; the rest: shard_00001.bin
//   (otherwise)  the rest: shard_00000.bin
// Each input is written into a scratch directory, then read the way
// mp_worker --verify-checkpoint and a resuming run of 1 to 3 ranks read it.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "core/error.h"
#include "formats/checkpoint_format.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace mp;

constexpr int64_t kMaxReadBytes = int64_t{16} << 20;  // per range: the fuzzer's memory, not a format limit

// Sizes and block CRCs of the files the manifest lists, from the bytes written.
std::string fix_files(const std::string& payload, const std::vector<std::pair<std::string, std::string>>& files) {
  proto::CheckpointManifest m;
  if (!m.ParseFromString(payload)) return payload;
  const int64_t block = m.block_bytes();
  if (block < 1 || block > (int64_t{1} << 30)) return payload;
  for (proto::CheckpointFile& f : *m.mutable_files()) {
    for (const auto& [name, bytes] : files) {
      if (f.name() != name) continue;
      const int64_t size = static_cast<int64_t>(bytes.size());
      if (size > 0 && (size - 1) / block >= 4096) continue;
      f.set_size_bytes(size);
      f.clear_block_crc32c();
      for (int64_t at = 0; at < size; at += block) {
        f.add_block_crc32c(crc32c(std::string_view(bytes).substr(static_cast<size_t>(at), static_cast<size_t>(block))));
      }
    }
  }
  return m.SerializeAsString();
}

// What a run of `world` ranks reads: each rank its contiguous part of every
// unit's padded elements, every field.
void read_as_ranks(const std::string& dir, const proto::CheckpointManifest& m, int world) {
  CheckpointReader reader(dir, m);
  std::vector<char> buf;
  for (int u = 0; u < m.units_size(); ++u) {
    const proto::CheckpointUnit& cu = m.units(u);
    if (cu.padded_numel() > (int64_t{1} << 40)) continue;  // the harness's arithmetic below stays in range
    const int64_t per = (cu.padded_numel() + world - 1) / world;
    for (int f = 0; f < cu.fields_size(); ++f) {
      const int64_t eb = checkpoint_element_bytes(cu.fields(f).dtype());
      for (int r = 0; r < world; ++r) {
        const int64_t lo = std::min(cu.padded_numel(), r * per), hi = std::min(cu.padded_numel(), lo + per);
        if ((hi - lo) > kMaxReadBytes / eb) continue;
        buf.assign(static_cast<size_t>((hi - lo) * eb) + 1, '\0');
        reader.read(u, f, lo, hi, std::min(hi, cu.numel()), buf.data());
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t flags = in.u8();
  std::string manifest(in.bytes(in.u32()));
  std::vector<std::pair<std::string, std::string>> files;
  if (flags & 4) {
    const std::string first(in.bytes(in.u32()));
    files.emplace_back(checkpoint_shard_file_name(0), first);
    files.emplace_back(checkpoint_shard_file_name(1), std::string(in.rest()));
  } else {
    files.emplace_back(checkpoint_shard_file_name(0), std::string(in.rest()));
  }
  if (flags & 1) manifest = checkpoint_manifest_file(flags & 2 ? fix_files(manifest, files) : manifest);

  const std::string dir = fuzz::scratch_dir() + "/ckpt";
  static const bool made = [&] { std::filesystem::create_directories(dir); return true; }();
  (void)made;
  std::filesystem::remove(dir + "/" + checkpoint_shard_file_name(1));
  fuzz::write_file(dir + "/" + kCheckpointManifestName, manifest);
  for (const auto& [name, bytes] : files) fuzz::write_file(dir + "/" + name, bytes);

  proto::CheckpointManifest m;
  try {
    m = read_checkpoint_manifest(dir);
  } catch (const ConfigError&) {
    return 0;
  } catch (const IoError&) {
    return 0;
  }
  try {
    verify_checkpoint(dir);
  } catch (const ConfigError&) {
  } catch (const IoError&) {
  }
  for (int world = 1; world <= 3; ++world) {
    try {
      read_as_ranks(dir, m, world);
    } catch (const ConfigError&) {
    } catch (const IoError&) {
    }
  }
  return 0;
}
