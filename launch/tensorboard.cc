#include "launch/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "core/crc32c.h"
#include "core/error.h"
#include "proto/tensorboard.pb.h"

namespace mp {
namespace {

void put_le(std::string& out, uint64_t v, int n_bytes) {
  for (int i = 0; i < n_bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  const std::string stem = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(time(nullptr))) +
                           "." + host_name() + "." + std::to_string(static_cast<int64_t>(getpid())) + ".";
  // "x": fail rather than overwrite, so two writers in one second and one
  // process (or a restarted rank reusing a pid) never share a file.
  constexpr int kMaxAttempts = 1000;
  for (int n = 0; n < kMaxAttempts && file_ == nullptr; ++n) {
    path_ = stem + std::to_string(n);
    file_ = std::fopen(path_.c_str(), "wbx");
    if (file_ == nullptr && errno != EEXIST) {
      MP_THROW(IoError, "TensorBoard event file '", path_, "': cannot create: ", std::strerror(errno));
    }
  }
  if (file_ == nullptr) {
    MP_THROW(IoError, "TensorBoard event file '", stem, "N': ", kMaxAttempts, " files of this name exist already");
  }
  tensorboard::Event event;
  event.set_wall_time(unix_seconds_now());
  event.set_file_version(kTensorBoardFileVersion);
  try {
    write_record(event.SerializeAsString());
    flush();
  } catch (...) {
    std::fclose(file_);  // no destructor runs for a throwing constructor
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, int64_t step, double value) {
  tensorboard::Event event;
  event.set_wall_time(unix_seconds_now());
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  write_record(event.SerializeAsString());
}

void TensorBoardWriter::add_text(const std::string& tag, int64_t step, const std::string& text) {
  tensorboard::Event event;
  event.set_wall_time(unix_seconds_now());
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  // What tf.summary.text writes: the text plugin's marker (empty content is
  // its TextPluginData version 0) and a scalar DT_STRING tensor.
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tensorboard::TensorProto* t = v->mutable_tensor();
  t->set_dtype(tensorboard::DT_STRING);
  t->mutable_tensor_shape();  // present and empty: rank 0
  t->add_string_val(text);
  write_record(event.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& data) {
  MP_ENFORCE(file_ != nullptr, "TensorBoard event file '", path_, "' is closed");
  std::string record;
  record.reserve(data.size() + 16);
  put_le(record, data.size(), 8);
  put_le(record, masked_crc32c(record), 4);
  record += data;
  put_le(record, masked_crc32c(data), 4);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    MP_THROW(IoError, "TensorBoard event file '", path_, "': write failed: ", std::strerror(errno));
  }
}

void TensorBoardWriter::flush() {
  MP_ENFORCE(file_ != nullptr, "TensorBoard event file '", path_, "' is closed");
  if (std::fflush(file_) != 0) {
    MP_THROW(IoError, "TensorBoard event file '", path_, "': write failed: ", std::strerror(errno));
  }
}

void TensorBoardWriter::close() {
  if (file_ == nullptr) return;
  std::FILE* f = file_;
  file_ = nullptr;
  const bool flushed = std::fflush(f) == 0;
  const int flush_errno = errno;
  if (std::fclose(f) != 0 || !flushed) {
    MP_THROW(IoError, "TensorBoard event file '", path_, "': write failed on close: ",
             std::strerror(flushed ? errno : flush_errno));
  }
}

}  // namespace mp
