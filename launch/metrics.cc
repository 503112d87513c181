#include "launch/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/error.h"

namespace mp {
namespace {

nlohmann::ordered_json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

// dump() writes NaN and Inf as null by itself; replace keeps a string with
// bad UTF-8 from throwing in the middle of a run.
template <class Json>
std::string dump_line(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace) + '\n';
}

}  // namespace

std::string make_run_dir(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) MP_THROW(IoError, "run directory: the path is empty");
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st) && !fs::is_directory(st)) {
    MP_THROW(IoError, "run directory '", path, "' exists and is not a directory");
  }
  fs::create_directories(path, ec);
  if (ec) MP_THROW(IoError, "run directory '", path, "': cannot create: ", ec.message());
  if (!fs::is_directory(path, ec)) {
    MP_THROW(IoError, "run directory '", path, "' is not a directory after creating it");
  }
  return path;
}

nlohmann::ordered_json to_json(const StepMetrics& m) {
  nlohmann::ordered_json memory = nlohmann::ordered_json::object();
  for (const auto& [name, bytes] : m.memory_bytes) memory[name] = bytes;
  nlohmann::ordered_json j = {
      {"step", m.step},
      {"loss", number_or_null(m.loss)},
      {"lr", number_or_null(m.lr)},
      {"grad_norm", number_or_null(m.grad_norm)},
      {"loss_scale", number_or_null(m.loss_scale)},
      {"skipped", m.skipped},
      {"tokens_per_s", number_or_null(m.tokens_per_s)},
      {"step_ms", number_or_null(m.step_ms)},
      {"model_flops_per_s", number_or_null(m.model_flops_per_s)},
      {"memory_bytes", std::move(memory)},
  };
  if (m.val_loss.has_value()) j["val_loss"] = number_or_null(*m.val_loss);
  return j;
}

MetricsWriter::MetricsWriter(const std::string& dir, Mode mode) : path_(dir + "/metrics.jsonl") {
  file_ = std::fopen(path_.c_str(), mode == Mode::kAppend ? "ab" : "wb");
  if (file_ == nullptr) {
    MP_THROW(IoError, "metrics file '", path_, "': cannot open for writing: ", std::strerror(errno));
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  MP_ENFORCE(record.is_object(), "metrics file '", path_, "': a record must be a JSON object, got ",
             record.type_name());
  write_line(dump_line(record));
}

void MetricsWriter::write(const StepMetrics& m) { write_line(dump_line(to_json(m))); }

void MetricsWriter::write_line(const std::string& line) {
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    MP_THROW(IoError, "metrics file '", path_, "': write failed: ", std::strerror(errno));
  }
}

}  // namespace mp
