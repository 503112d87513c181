// metrics.jsonl (launch/metrics.h): lines parse back, with null for
// non-finite numbers, flushed line by line, appended or replaced; and
// make_run_dir creates parents and names the path it cannot create.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "launch/metrics.h"
#include "tests/run_dir_test_util.h"
#include "tests/test_util.h"

namespace mp {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::read_bytes;
using testing::read_jsonl;
using MetricsJsonl = testing::TempDirTest;
using MetricsRunDir = testing::TempDirTest;

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
