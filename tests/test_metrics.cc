// The run directory's writers (launch/metrics.h, launch/tensorboard.h):
// CRC-32C against published check values and a bitwise reference; event
// files read back by an independent TFRecord reader that checks both CRCs
// and notices a corrupt byte; metrics.jsonl lines parse back, with null for
// non-finite numbers; make_run_dir names the path it cannot create.
//
// MP_TEST_TENSORBOARD_DIR=DIR: TensorBoardEvents.WritesExampleRunDir leaves
// its files in DIR for tests/check_tensorboard.py (see tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/tensorboard.pb.h"
#include "core/error.h"
#include "launch/metrics.h"
#include "launch/tensorboard.h"
#include "tests/test_util.h"

namespace mp {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::read_bytes;

// CRC-32C one bit at a time, straight from the definition: the reference
// the table-driven crc32c() is compared with.
uint32_t crc32c_bitwise(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : bytes) {
    crc ^= static_cast<uint8_t>(c);
    for (int bit = 0; bit < 8; ++bit) {
      if (crc & 1u) {
        crc = (crc >> 1) ^ 0x82F63B78u;
      } else {
        crc >>= 1;
      }
    }
  }
  return ~crc;
}

uint32_t mask_bitwise(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t get_le(const std::string& bytes, size_t at, int n_bytes) {
  uint64_t v = 0;
  for (int i = 0; i < n_bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
  return v;
}

// A TFRecord reader written apart from the writer: every record's framing,
// both CRCs (bitwise reference) and Event proto are checked. `error` names
// the first problem and the record it is in; events are those before it.
struct EventFile {
  std::vector<tensorboard::Event> events;
  std::string error;
};

EventFile read_event_file(const std::string& path) {
  const std::string bytes = read_bytes(path);
  EventFile out;
  size_t at = 0;
  for (int record = 0; at < bytes.size(); ++record) {
    const std::string where = "record " + std::to_string(record) + " at byte " + std::to_string(at);
    if (bytes.size() - at < 12) {
      out.error = where + ": truncated header";
      return out;
    }
    const uint64_t length = get_le(bytes, at, 8);
    if (get_le(bytes, at + 8, 4) != mask_bitwise(crc32c_bitwise(bytes.substr(at, 8)))) {
      out.error = where + ": length CRC mismatch";
      return out;
    }
    if (bytes.size() - at - 12 < length + 4) {
      out.error = where + ": truncated data";
      return out;
    }
    const std::string data = bytes.substr(at + 12, length);
    if (get_le(bytes, at + 12 + length, 4) != mask_bitwise(crc32c_bitwise(data))) {
      out.error = where + ": data CRC mismatch";
      return out;
    }
    tensorboard::Event event;
    if (!event.ParseFromString(data)) {
      out.error = where + ": not an Event proto";
      return out;
    }
    out.events.push_back(std::move(event));
    at += 12 + length + 4;
  }
  return out;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));  // throws on invalid JSON
  return lines;
}

class RunDirTest : public testing::TempDirTest {
 protected:
  std::vector<std::string> event_files(const std::string& dir) const {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().filename().string().starts_with("events.out.tfevents.")) files.push_back(e.path().string());
    }
    return files;
  }
};
using TensorBoardEvents = RunDirTest;
using MetricsJsonl = RunDirTest;
using MetricsRunDir = RunDirTest;

// ---- CRC-32C --------------------------------------------------------------------

TEST(Crc32c, PublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, of ones, incrementing, decrementing.
  std::string zeros(32, '\0'), ones(32, '\xFF'), up(32, '\0'), down(32, '\0');
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<char>(i);
    down[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down), 0x113FDB5Cu);
}

TEST(Crc32c, TableMatchesBitwiseReference) {
  std::mt19937 rng(7);
  for (const size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{255}, size_t{256},
                         size_t{1000}, size_t{4099}, size_t{24575}, size_t{24576}, size_t{24583},
                         size_t{3 * 24576 + 5}, size_t{200001}}) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xFF);
    EXPECT_EQ(crc32c(bytes), crc32c_bitwise(bytes)) << "length " << n << ", hardware " << crc32c_hardware();
    // Any split point: extending a finished CRC equals the CRC of the whole.
    const size_t cut = n / 3;
    EXPECT_EQ(crc32c_extend(crc32c(bytes.substr(0, cut)), bytes.data() + cut, n - cut), crc32c(bytes)) << n;
  }
}

TEST(Crc32c, MaskedMatchesTensorFlow) {
  // Values from TensorBoard's own Python masked_crc32c.
  EXPECT_EQ(masked_crc32c("123456789"), 0xC78AB0E5u);
  EXPECT_EQ(masked_crc32c(""), 0xA282EAD8u);
  EXPECT_NE(masked_crc32c("abc"), crc32c("abc"));
}

// ---- TensorBoard event files ----------------------------------------------------

TEST_F(TensorBoardEvents, RoundTripsScalarsAndText) {
  std::string path;
  {
    TensorBoardWriter tb(dir_);
    path = tb.path();
    tb.add_scalar("train/loss", 1, 2.5);
    tb.add_scalar("train/loss", 2, 2.25);
    tb.add_scalar("train/lr", 2, 3e-4);
    tb.add_text("config", 0, "hidden **64**, `FULL_SHARD`");
    tb.add_scalar("train/grad_norm", 3, std::numeric_limits<double>::quiet_NaN());
    tb.close();
  }
  const EventFile f = read_event_file(path);
  ASSERT_EQ(f.error, "");
  ASSERT_EQ(f.events.size(), 6u);

  EXPECT_EQ(f.events[0].file_version(), "brain.Event:2");
  EXPECT_FALSE(f.events[0].has_summary());
  for (const tensorboard::Event& e : f.events) {
    EXPECT_GT(e.wall_time(), 1.5e9) << e.DebugString();  // after 2017: real Unix seconds
  }

  struct Scalar {
    size_t event;
    const char* tag;
    int64_t step;
    float value;
  };
  for (const Scalar& s : {Scalar{1, "train/loss", 1, 2.5f}, Scalar{2, "train/loss", 2, 2.25f},
                          Scalar{3, "train/lr", 2, 3e-4f}}) {
    const tensorboard::Event& e = f.events[s.event];
    EXPECT_EQ(e.step(), s.step) << "event " << s.event;
    ASSERT_EQ(e.summary().value_size(), 1) << "event " << s.event;
    EXPECT_EQ(e.summary().value(0).tag(), s.tag) << "event " << s.event;
    ASSERT_TRUE(e.summary().value(0).has_simple_value()) << "event " << s.event;
    EXPECT_EQ(e.summary().value(0).simple_value(), s.value) << "event " << s.event;
  }

  const tensorboard::Event& text = f.events[4];
  EXPECT_EQ(text.step(), 0);
  ASSERT_EQ(text.summary().value_size(), 1);
  const tensorboard::Summary::Value& v = text.summary().value(0);
  EXPECT_EQ(v.tag(), "config");
  EXPECT_EQ(v.metadata().plugin_data().plugin_name(), "text");
  ASSERT_TRUE(v.has_tensor());
  EXPECT_EQ(v.tensor().dtype(), tensorboard::DT_STRING);
  EXPECT_TRUE(v.tensor().has_tensor_shape());
  EXPECT_EQ(v.tensor().tensor_shape().dim_size(), 0);  // a scalar
  ASSERT_EQ(v.tensor().string_val_size(), 1);
  EXPECT_EQ(v.tensor().string_val(0), "hidden **64**, `FULL_SHARD`");

  EXPECT_TRUE(std::isnan(f.events[5].summary().value(0).simple_value()));
}

TEST_F(TensorBoardEvents, FlushMakesRecordsVisible) {
  TensorBoardWriter tb(dir_);
  EXPECT_EQ(read_event_file(tb.path()).events.size(), 1u);  // the version record is flushed at once
  tb.add_scalar("loss", 1, 1.0);
  tb.flush();
  const EventFile f = read_event_file(tb.path());
  EXPECT_EQ(f.error, "");
  EXPECT_EQ(f.events.size(), 2u);
}

TEST_F(TensorBoardEvents, NamesFilesLikeTensorFlow) {
  TensorBoardWriter a(dir_);
  TensorBoardWriter b(dir_);  // same process, most likely the same second
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const std::regex name("events\\.out\\.tfevents\\.([0-9]+)\\." + std::regex_replace(host, std::regex("\\."), "\\.") +
                        "\\." + std::to_string(getpid()) + "\\.([0-9]+)");
  std::smatch ma, mb;
  const std::string fa = fs::path(a.path()).filename().string(), fb = fs::path(b.path()).filename().string();
  ASSERT_TRUE(std::regex_match(fa, ma, name)) << fa;
  ASSERT_TRUE(std::regex_match(fb, mb, name)) << fb;
  EXPECT_EQ(ma[2], "0");
  EXPECT_EQ(fs::path(a.path()).parent_path(), fs::path(dir_));
  EXPECT_NE(a.path(), b.path());
  if (ma[1] == mb[1]) {
    EXPECT_EQ(mb[2], "1") << "the second writer in the same second takes the next number";
  }
  EXPECT_EQ(event_files(dir_).size(), 2u);
}

TEST_F(TensorBoardEvents, ReaderNoticesACorruptByte) {
  std::string path;
  {
    TensorBoardWriter tb(dir_);
    path = tb.path();
    tb.add_scalar("loss", 1, 2.0);
    tb.add_scalar("loss", 2, 1.0);
  }
  const std::string good = read_bytes(path);
  ASSERT_EQ(read_event_file(path).error, "");
  const size_t first = 12 + get_le(good, 0, 8) + 4;  // record 1 starts here
  const uint64_t len1 = get_le(good, first, 8);
  struct Case {
    size_t byte;
    std::string expected;
  };
  const std::string at1 = "record 1 at byte " + std::to_string(first) + ": ";
  for (const Case& c : {Case{first + 1, at1 + "length CRC mismatch"},
                        Case{first + 9, at1 + "length CRC mismatch"},
                        Case{first + 12 + len1 / 2, at1 + "data CRC mismatch"},
                        Case{first + 12 + len1 + 2, at1 + "data CRC mismatch"}}) {
    std::string bad = good;
    bad[c.byte] = static_cast<char>(bad[c.byte] ^ 0x20);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;
    const EventFile f = read_event_file(path);
    EXPECT_EQ(f.error, c.expected) << "byte " << c.byte << " flipped";
    EXPECT_EQ(f.events.size(), 1u) << "byte " << c.byte << " flipped";
  }
  // A record cut short (a writer that died mid-write): the last one, record 2.
  const size_t second = first + 12 + len1 + 4;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 1);
  EXPECT_EQ(read_event_file(path).error, "record 2 at byte " + std::to_string(second) + ": truncated data");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << good.substr(0, second + 5);
  EXPECT_EQ(read_event_file(path).error, "record 2 at byte " + std::to_string(second) + ": truncated header");
}

TEST_F(TensorBoardEvents, InMissingDirIsIoErrorNamingIt) {
  const std::string missing = dir_ + "/no/such/dir";
  const std::string msg = error_of([&] { TensorBoardWriter tb(missing); });
  EXPECT_NE(msg.find("TensorBoard event file '" + missing + "/events.out.tfevents."), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot create"), std::string::npos) << msg;
  EXPECT_THROW(TensorBoardWriter tb(missing), IoError);
}

// Writes a small run (event file and metrics.jsonl) for the Python check, into
// $MP_TEST_TENSORBOARD_DIR when set (replacing the files of an earlier run
// there), else into a temporary directory.
TEST_F(TensorBoardEvents, WritesExampleRunDir) {
  const char* env = std::getenv("MP_TEST_TENSORBOARD_DIR");
  const std::string dir = make_run_dir(env != nullptr && env[0] != '\0' ? env : dir_ + "/run");
  for (const std::string& old : event_files(dir)) fs::remove(old);
  TensorBoardWriter tb(dir);
  MetricsWriter metrics(dir);
  tb.add_text("config", 0, "mp test run: **20** steps");
  for (int64_t step = 1; step <= 20; ++step) {
    StepMetrics m;
    m.step = step;
    m.loss = 3.0 / static_cast<double>(step);
    m.lr = 1e-3;
    m.grad_norm = 0.5;
    m.loss_scale = 65536.0;
    m.memory_bytes = {{"params", 4096}};
    metrics.write(m);
    tb.add_scalar("train/loss", step, m.loss);
    tb.add_scalar("train/lr", step, m.lr);
  }
  tb.close();
  const EventFile f = read_event_file(tb.path());
  EXPECT_EQ(f.error, "");
  EXPECT_EQ(f.events.size(), 42u);
  EXPECT_EQ(read_jsonl(metrics.path()).size(), 20u);
}

// ---- metrics.jsonl ---------------------------------------------------------------

TEST_F(MetricsJsonl, LinesParseBack) {
  MetricsWriter w(dir_);
  EXPECT_EQ(w.path(), dir_ + "/metrics.jsonl");
  StepMetrics m;
  m.step = 7;
  m.loss = 2.5;
  m.lr = 3e-4;
  m.grad_norm = 1.25;
  m.loss_scale = 65536.0;
  m.tokens_per_s = 51234.5;
  m.step_ms = 80.0;
  m.model_flops_per_s = 1.5e12;
  m.memory_bytes = {{"params", 1024}, {"grads", 512}, {"optimizer", int64_t{3} << 40}};
  w.write(m);
  m.step = 8;
  m.skipped = true;
  m.val_loss = 2.75;
  w.write(m);
  w.write(nlohmann::json{{"event", "checkpoint"}, {"step", 8}});

  const std::vector<nlohmann::json> lines = read_jsonl(w.path());
  ASSERT_EQ(lines.size(), 3u);
  const nlohmann::json& a = lines[0];
  EXPECT_EQ(a["step"], 7);
  EXPECT_EQ(a["loss"], 2.5);
  EXPECT_EQ(a["lr"], 3e-4);
  EXPECT_EQ(a["grad_norm"], 1.25);
  EXPECT_EQ(a["loss_scale"], 65536.0);
  EXPECT_EQ(a["skipped"], false);
  EXPECT_EQ(a["tokens_per_s"], 51234.5);
  EXPECT_EQ(a["step_ms"], 80.0);
  EXPECT_EQ(a["model_flops_per_s"], 1.5e12);
  EXPECT_EQ(a["memory_bytes"], (nlohmann::json{{"params", 1024}, {"grads", 512}, {"optimizer", int64_t{3} << 40}}));
  EXPECT_FALSE(a.contains("val_loss"));
  EXPECT_EQ(a.size(), 10u) << a.dump();
  EXPECT_EQ(lines[1]["step"], 8);
  EXPECT_EQ(lines[1]["skipped"], true);
  EXPECT_EQ(lines[1]["val_loss"], 2.75);
  EXPECT_EQ(lines[2], (nlohmann::json{{"event", "checkpoint"}, {"step", 8}}));

  // The step comes first on every step line, for a reader of `tail -f`.
  std::ifstream in(w.path());
  std::string first;
  std::getline(in, first);
  EXPECT_TRUE(first.starts_with("{\"step\":7,\"loss\":2.5,")) << first;
}

TEST_F(MetricsJsonl, WritesNonFiniteAsNull) {
  MetricsWriter w(dir_);
  StepMetrics m;
  m.step = 3;
  m.loss = std::numeric_limits<double>::quiet_NaN();
  m.grad_norm = std::numeric_limits<double>::infinity();
  m.loss_scale = 1024.0;
  m.val_loss = -std::numeric_limits<double>::infinity();
  w.write(m);
  w.write(nlohmann::json{{"nested", {{"x", std::nan("")}, {"y", 1.0}}}});

  const std::vector<nlohmann::json> lines = read_jsonl(w.path());  // throws if any line is not JSON
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(lines[0]["loss"].is_null()) << lines[0].dump();
  EXPECT_TRUE(lines[0]["grad_norm"].is_null()) << lines[0].dump();
  EXPECT_TRUE(lines[0]["val_loss"].is_null()) << lines[0].dump();
  EXPECT_EQ(lines[0]["loss_scale"], 1024.0);
  EXPECT_TRUE(lines[1]["nested"]["x"].is_null()) << lines[1].dump();
  EXPECT_EQ(lines[1]["nested"]["y"], 1.0);
  const std::string text = read_bytes(w.path());
  EXPECT_EQ(text.find("NaN"), std::string::npos) << text;
  EXPECT_EQ(text.find("nan"), std::string::npos) << text;
  EXPECT_EQ(text.find("inf"), std::string::npos) << text;
}

TEST_F(MetricsJsonl, FlushesEachLine) {
  MetricsWriter w(dir_);
  for (int64_t step = 1; step <= 3; ++step) {
    StepMetrics m;
    m.step = step;
    w.write(m);
    // Still open: what a `tail -f` reader sees now.
    const std::vector<nlohmann::json> lines = read_jsonl(w.path());
    ASSERT_EQ(lines.size(), static_cast<size_t>(step));
    EXPECT_EQ(lines.back()["step"], step);
  }
}

TEST_F(MetricsJsonl, AppendKeepsEarlierLines) {
  { MetricsWriter(dir_).write(nlohmann::json{{"step", 1}}); }
  { MetricsWriter(dir_, MetricsWriter::Mode::kAppend).write(nlohmann::json{{"step", 2}}); }
  EXPECT_EQ(read_jsonl(dir_ + "/metrics.jsonl").size(), 2u);
  { MetricsWriter(dir_).write(nlohmann::json{{"step", 3}}); }
  const std::vector<nlohmann::json> lines = read_jsonl(dir_ + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["step"], 3);
}

TEST_F(MetricsJsonl, RejectsARecordThatIsNotAnObject) {
  MetricsWriter w(dir_);
  EXPECT_THROW(w.write(nlohmann::json::array({1, 2})), EnforceError);
  EXPECT_EQ(read_bytes(w.path()), "");
}

TEST_F(MetricsRunDir, CreatesParents) {
  const std::string run = dir_ + "/runs/a/b";
  EXPECT_EQ(make_run_dir(run), run);
  EXPECT_TRUE(fs::is_directory(run));
  EXPECT_EQ(make_run_dir(run), run);  // exists already: fine
  MetricsWriter w(run);
  EXPECT_TRUE(fs::exists(run + "/metrics.jsonl"));
}

TEST_F(MetricsRunDir, PathThatIsAFileIsIoErrorNamingIt) {
  const std::string file = dir_ + "/taken";
  std::ofstream(file) << "x";
  EXPECT_THROW(make_run_dir(file), IoError);
  EXPECT_EQ(error_of([&] { make_run_dir(file); }), "run directory '" + file + "' exists and is not a directory");
  const std::string under = file + "/sub";
  EXPECT_THROW(make_run_dir(under), IoError);
  const std::string msg = error_of([&] { make_run_dir(under); });
  EXPECT_NE(msg.find("run directory '" + under + "': cannot create: "), std::string::npos) << msg;
}

TEST_F(MetricsJsonl, InMissingDirIsIoErrorNamingIt) {
  const std::string missing = dir_ + "/missing";
  const std::string msg = error_of([&] { MetricsWriter w(missing); });
  EXPECT_NE(msg.find("metrics file '" + missing + "/metrics.jsonl': cannot open for writing: "), std::string::npos)
      << msg;
}

}  // namespace
}  // namespace mp
