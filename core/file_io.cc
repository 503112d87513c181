#include "core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace mp {

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

void write_all(int fd, const void* data, size_t size, const std::string& what, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) MP_THROW(IoError, what, " '", path, "': write failed: ", std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

bool pread_all(int fd, void* dst, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

bool fsync_directory(const std::string& dir) {
  const Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  return fd.get() >= 0 && ::fsync(fd.get()) == 0;
}

AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), what_(std::move(what)) {
  fd_ = Fd(::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd_.get() < 0) MP_THROW(IoError, what_, " '", tmp_, "': cannot create: ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (!committed_) {
    fd_ = Fd();
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* src, size_t n_bytes) { write_all(fd_.get(), src, n_bytes, what_, tmp_); }

void AtomicFile::commit() {
  if (::fsync(fd_.get()) != 0) MP_THROW(IoError, what_, " '", tmp_, "': fsync failed: ", std::strerror(errno));
  if (::close(fd_.release()) != 0) MP_THROW(IoError, what_, " '", tmp_, "': close failed: ", std::strerror(errno));
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    MP_THROW(IoError, what_, " '", path_, "': cannot rename from '", tmp_, "': ", std::strerror(errno));
  }
  committed_ = true;
  const size_t slash = path_.rfind('/');
  (void)fsync_directory(slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash));
}

void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& what) {
  AtomicFile out(path, what);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

}  // namespace mp
