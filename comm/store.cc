#include "comm/store.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace mp {
namespace {

class FileStore final : public KeyValueStore {
 public:
  explicit FileStore(std::string directory) : dir_(std::move(directory)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) MP_THROW(IoError, "store directory ", dir_, ": ", ec.message());
  }

  void set(const std::string& key, const std::string& value) override {
    // Whole before it appears; no fsync (the store lives as long as the job).
    const std::string at = path(key), tmp = detail::str(dir_, "/.tmp.", getpid(), ".", ++written_);
    std::ofstream(tmp, std::ios::binary).write(value.data(), static_cast<std::streamsize>(value.size()));
    std::error_code ec;
    std::filesystem::rename(tmp, at, ec);
    if (ec) MP_THROW(IoError, "store key '", key, "' (", at, "): ", ec.message());
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(200);
    while (true) {
      std::ifstream in(path(key), std::ios::binary);
      if (in) return std::string(std::istreambuf_iterator<char>(in), {});
      if (std::chrono::steady_clock::now() > deadline) {
        MP_THROW(CommError, "store key '", key, "' was not set within ", timeout.count(), " ms (file store ", dir_,
                 "): a rank did not arrive");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
  }

 private:
  // Keys hold '/': each byte outside [A-Za-z0-9_.-] as %XX.
  std::string path(const std::string& key) const {
    std::ostringstream os;
    os << dir_ << "/";
    for (const unsigned char c : key) {
      if (std::isalnum(c) || c == '_' || c == '.' || c == '-') {
        os << c;
      } else {
        os << '%' << "0123456789abcdef"[c >> 4] << "0123456789abcdef"[c & 15];
      }
    }
    return os.str();
  }

  std::string dir_;
  uint64_t written_ = 0;
};

}  // namespace

std::shared_ptr<KeyValueStore> make_file_store(const std::string& directory) {
  return std::make_shared<FileStore>(directory);
}

}  // namespace mp
