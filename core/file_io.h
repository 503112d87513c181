// core/file_io.h: POSIX file helpers shared by the files the runtime
// writes and reads itself (checkpoints, safetensors): an owning descriptor,
// whole writes and positioned reads that retry on EINTR, and durable atomic
// replacement of a file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace mp {

// Owns a file descriptor (-1: none); closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// Writes all `size` bytes; IoError "WHAT 'PATH': write failed: ..." otherwise.
void write_all(int fd, const void* data, size_t size, const std::string& what, const std::string& path);

// Reads exactly n bytes at `offset`; false at end of file or on an error
// (errno tells which).
bool pread_all(int fd, void* dst, size_t n, uint64_t offset);

// fsync of a directory, so the renames and creations in it are durable.
// False where it failed (some file systems refuse it).
bool fsync_directory(const std::string& dir);

// PATH.tmp, renamed over PATH by commit() after an fsync, then the
// directory synced (best effort); the temporary is removed if commit()
// never ran. A crash leaves the old PATH or the new one, never a mix.
class AtomicFile {
 public:
  // `what` names the file in IoError messages, e.g. "config file".
  AtomicFile(std::string path, std::string what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* src, size_t n_bytes);
  void commit();

 private:
  std::string path_, tmp_, what_;
  Fd fd_;
  bool committed_ = false;
};

// An AtomicFile of `bytes`.
void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& what);

}  // namespace mp
