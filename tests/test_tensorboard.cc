// TensorBoard event files (launch/tensorboard.h), read back by an
// independent TFRecord reader that checks both CRCs and notices a corrupt
// byte; files named as TensorFlow names them; a missing directory named.
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
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "launch/metrics.h"
#include "launch/tensorboard.h"
#include "tests/run_dir_test_util.h"
#include "tests/test_util.h"

namespace mp {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::EventFile;
using testing::get_le;
using testing::read_bytes;
using testing::read_event_file;
using testing::read_jsonl;

class TensorBoardEvents : public testing::TempDirTest {
 protected:
  std::vector<std::string> event_files(const std::string& dir) const {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().filename().string().starts_with("events.out.tfevents.")) files.push_back(e.path().string());
    }
    return files;
  }
};

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

}  // namespace
}  // namespace mp
