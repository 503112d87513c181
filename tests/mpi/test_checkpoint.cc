// Checkpoints under mpirun (runtime/checkpoint.h): resuming is bitwise
// exact for every strategy and recipe; loading on another world size or
// strategy restores the weights bit for bit and, in deterministic mode,
// continues training with exactly the losses of an uninterrupted run; bad
// checkpoints give errors that name the file and the problem.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

#include "mp/config.h"
#include "runtime/checkpoint.h"
#include "runtime/memory_plan.h"
#include "tests/mpi/engine_test_util.h"
#include "tests/mpi/mpi_test.h"
#include "tests/test_util.h"

namespace mp::testing {
namespace {

namespace fs = std::filesystem;
using SC = proto::ShardingConfig;

class CheckpointTest : public EngineWorldTest {
 protected:
  CheckpointTest() : EngineWorldTest("ckpt") {}
  void SetUp() override {
    EngineWorldTest::SetUp();
    // One directory for the job, named by rank 0's pid.
    long pid = static_cast<long>(getpid());
    MPI_Bcast(&pid, 1, MPI_LONG, 0, comm());
    root_ = (fs::temp_directory_path() / ("mp_ckpt_test_" + std::to_string(pid))).string();
    if (rank() == 0) fs::remove_all(root_);
    MPI_Barrier(comm());
  }
  void TearDown() override {
    MPI_Barrier(comm());
    if (rank() == 0) fs::remove_all(root_);
    EngineWorldTest::TearDown();
  }
  // The first n ranks as a communicator; nullptr on the others.
  std::unique_ptr<Communicator> first(int n) {
    std::unique_ptr<Communicator> c = world_->split(rank() < n ? 0 : 1, rank(), "first" + std::to_string(n));
    if (rank() >= n) return nullptr;
    return c;
  }
  std::string root_;
};

constexpr int kSteps = MP_SANITIZE ? 4 : 8;

// Save after half the steps, load into a fresh engine, run the rest: the
// losses, gradient norms, loss scales and final weights are those of the
// uninterrupted run, bit for bit, for every strategy and recipe.
TEST_F(CheckpointTest, ResumeIsBitwiseExact) {
  const int n = size();
  const std::vector<std::string> recipes =
      MP_SANITIZE ? std::vector<std::string>{"bf16_master", "amp_fp16"}
                  : std::vector<std::string>{"fp32", "amp_bf16", "bf16_master", "bf16_remainder", "pure_bf16", "amp_fp16"};
  for (Strategy s : all_strategies()) {
    for (const std::string& recipe : recipes) {
      SCOPED_TRACE(std::string(strategy_name(s)) + " " + recipe + " on " + std::to_string(n) + " ranks");
      proto::EngineConfig config = engine_config(s, recipe, n, 2);
      if (recipe == "pure_bf16") config.mutable_precision()->set_rounding(proto::PrecisionPolicy::STOCHASTIC);
      const std::unique_ptr<Model> model = make_model(TestModel::kGpt);
      std::vector<StepResult> ref;
      std::vector<std::vector<float>> ref_weights;
      {
        Engine e(model->spec(), config, *world_);
        for (int i = 0; i < kSteps; ++i) ref.push_back(e.step(*model));
        ref_weights = all_weights(e);
      }
      const std::string root = root_ + "/resume_" + std::string(strategy_name(s)) + "_" + recipe;
      {
        Engine e(model->spec(), config, *world_);
        for (int i = 0; i < kSteps / 2; ++i) e.step(*model);
        const CheckpointInfo info = save_checkpoint(e, root);
        EXPECT_EQ(info.step, kSteps / 2);
        EXPECT_GT(info.bytes, 0);
      }
      Engine e(model->spec(), config, *world_);
      const proto::CheckpointManifest m = load_checkpoint(e, resolve_checkpoint(root));
      EXPECT_EQ(m.step(), kSteps / 2);
      EXPECT_EQ(m.world_size(), n);
      for (int i = kSteps / 2; i < kSteps; ++i) {
        const StepResult r = e.step(*model);
        EXPECT_EQ(r.step, ref[static_cast<size_t>(i)].step);
        EXPECT_EQ(r.loss, ref[static_cast<size_t>(i)].loss) << "step " << i + 1;
        EXPECT_EQ(r.grad_norm, ref[static_cast<size_t>(i)].grad_norm) << "step " << i + 1;
        EXPECT_EQ(r.loss_scale, ref[static_cast<size_t>(i)].loss_scale) << "step " << i + 1;
        EXPECT_EQ(r.lr, ref[static_cast<size_t>(i)].lr) << "step " << i + 1;
      }
      const std::vector<std::vector<float>> w = all_weights(e);
      EXPECT_TRUE(same_bits(w, ref_weights));
      EXPECT_EQ(e.optimizer().steps_done(), kSteps);
    }
  }
}

struct Reshard {
  int from_ranks;
  Strategy from;
  int to_ranks;
  Strategy to;
};

std::string describe(const Reshard& r) {
  return std::to_string(r.from_ranks) + " " + std::string(strategy_name(r.from)) + " -> " +
         std::to_string(r.to_ranks) + " " + std::string(strategy_name(r.to));
}

// Deterministic mode makes training independent of the world size, so a
// run that changes world size and strategy at a checkpoint must give the
// losses and weights of one rank training straight through, bit for bit.
TEST_F(CheckpointTest, ReshardToAnyWorldSizeAndStrategyContinuesExactly) {
  const std::vector<Reshard> cases = {
      {2, SC::FULL_SHARD, 4, SC::FULL_SHARD},        {4, SC::FULL_SHARD, 3, SC::SHARD_GRAD_OP},
      {3, SC::SHARD_OPTIMIZER, 1, SC::NO_SHARD},     {2, SC::NO_SHARD, 4, SC::HYBRID_SHARD},
      {4, SC::HYBRID_SHARD, 2, SC::FULL_SHARD},      {1, SC::FULL_SHARD, 3, SC::FULL_SHARD},
      {3, SC::FULL_SHARD, 2, SC::SHARD_GRAD_OP},     {2, SC::SHARD_GRAD_OP, 1, SC::FULL_SHARD},
  };
  constexpr int kMicro = 12;  // global micro-batches per step: divisible by 1..4
  // A tiny MLP too: its first unit has 9 elements (3 weights, aligned to
  // 8, and a bias), so on 4 ranks the last shard is padding only, and on 3
  // ranks the padding differs from every other world size's.
  MlpConfig tiny = small_mlp();
  tiny.dims = {3, 1, 2};
  const std::vector<std::pair<std::string, std::shared_ptr<Model>>> models = {
      {"mlp", make_model(TestModel::kMlp)}, {"gpt", make_model(TestModel::kGpt)},
      {"tiny_mlp", std::make_shared<Mlp>(tiny)}};
  for (const auto& [model_name, model] : models) {
    auto config_for = [&](Strategy s, int ranks) {
      proto::EngineConfig c = engine_config(s, "fp32", ranks, kMicro / ranks);
      c.set_deterministic(true);
      c.mutable_optimizer()->set_grad_clip(0.5);
      return c;
    };
    std::vector<StepResult> ref;
    std::vector<std::vector<float>> ref_weights;
    {
      Engine e(model->spec(), config_for(SC::FULL_SHARD, 1), *self_);
      for (int i = 0; i < kSteps; ++i) ref.push_back(e.step(*model));
      ref_weights = all_weights(e);
    }
    for (const Reshard& c : cases) {
      if (c.from_ranks > size() || c.to_ranks > size()) continue;
      SCOPED_TRACE(model_name + " " + describe(c));
      const std::string root = root_ + "/reshard_" + model_name + "_" + std::to_string(c.from_ranks) +
                               std::string(strategy_name(c.from)) + "_" + std::to_string(c.to_ranks) +
                               std::string(strategy_name(c.to));
      std::vector<std::vector<float>> saved;
      if (std::unique_ptr<Communicator> w = first(c.from_ranks)) {
        Engine e(model->spec(), config_for(c.from, c.from_ranks), *w);
        for (int i = 0; i < kSteps / 2; ++i) e.step(*model);
        saved = all_weights(e);
        save_checkpoint(e, root);
      }
      MPI_Barrier(comm());
      if (std::unique_ptr<Communicator> w = first(c.to_ranks)) {
        Engine e(model->spec(), config_for(c.to, c.to_ranks), *w);
        load_checkpoint(e, resolve_checkpoint(root));
        const std::vector<std::vector<float>> loaded = all_weights(e);
        if (!saved.empty()) {
          EXPECT_TRUE(same_bits(loaded, saved));
        }
        for (int i = kSteps / 2; i < kSteps; ++i) {
          const StepResult r = e.step(*model);
          EXPECT_EQ(r.loss, ref[static_cast<size_t>(i)].loss) << "step " << i + 1;
          EXPECT_EQ(r.grad_norm, ref[static_cast<size_t>(i)].grad_norm) << "step " << i + 1;
        }
        const std::vector<std::vector<float>> w_end = all_weights(e);
        EXPECT_TRUE(same_bits(w_end, ref_weights));
      }
      MPI_Barrier(comm());
    }
  }
}

// Optimizer kind MUON keeps its matrices' momentum sharded in state0 (Note
// [Muon in the engine]), so a run resumed on another world size and
// strategy, where other ranks own the matrices, continues with exactly one
// rank's losses and weights. Saved in the background or not, with the
// snapshot the plan predicts; a checkpoint of another optimizer kind is
// refused, naming it.
TEST_F(CheckpointTest, MuonMomentumReshardsAndResumesExactly) {
  const std::vector<Reshard> cases = {
      {2, SC::FULL_SHARD, 3, SC::FULL_SHARD},  {3, SC::SHARD_GRAD_OP, 2, SC::NO_SHARD},
      {4, SC::HYBRID_SHARD, 1, SC::FULL_SHARD}, {1, SC::NO_SHARD, 4, SC::SHARD_OPTIMIZER},
      {2, SC::FULL_SHARD, 2, SC::FULL_SHARD},
  };
  constexpr int kMicro = 12;
  auto config_for = [&](Strategy s, int ranks) {
    proto::EngineConfig c = engine_config(s, "fp32", ranks, kMicro / ranks);
    c.set_deterministic(true);
    c.mutable_optimizer()->set_kind(proto::OptimizerConfig::MUON);
    c.mutable_optimizer()->set_lr(2e-2);
    c.mutable_optimizer()->set_grad_clip(0.5);
    return c;
  };
  const std::unique_ptr<Model> model = make_model(TestModel::kGpt);
  std::vector<StepResult> ref;
  std::vector<std::vector<float>> ref_weights;
  {
    Engine e(model->spec(), config_for(SC::FULL_SHARD, 1), *self_);
    for (int i = 0; i < kSteps; ++i) ref.push_back(e.step(*model));
    ref_weights = all_weights(e);
  }
  for (size_t k = 0; k < cases.size(); ++k) {
    const Reshard& c = cases[k];
    if (c.from_ranks > size() || c.to_ranks > size()) continue;
    const bool async = k % 2 == 1;
    SCOPED_TRACE(describe(c) + (async ? " (async save)" : ""));
    const std::string root = root_ + "/muon_" + std::to_string(k);
    if (std::unique_ptr<Communicator> w = first(c.from_ranks)) {
      Engine e(model->spec(), config_for(c.from, c.from_ranks), *w);
      for (int i = 0; i < kSteps / 2; ++i) e.step(*model);
      if (async) {
        CheckpointWriter writer(e, root);
        writer.save_async();
        writer.wait();
        const int64_t largest = w->all_reduce_int64(static_cast<int64_t>(writer.snapshot_bytes()), HostOp::kMax);
        EXPECT_EQ(largest, static_cast<int64_t>(plan_checkpoint_snapshot(model->spec(), e.options())));
      } else {
        save_checkpoint(e, root);
      }
    }
    MPI_Barrier(comm());
    if (rank() == 0) {
      EXPECT_GT(verify_checkpoint(resolve_checkpoint(root)), 0);
    }
    if (std::unique_ptr<Communicator> w = first(c.to_ranks)) {
      Engine e(model->spec(), config_for(c.to, c.to_ranks), *w);
      load_checkpoint(e, resolve_checkpoint(root));
      for (int i = kSteps / 2; i < kSteps; ++i) {
        const StepResult r = e.step(*model);
        EXPECT_EQ(r.loss, ref[static_cast<size_t>(i)].loss) << "step " << i + 1;
        EXPECT_EQ(r.grad_norm, ref[static_cast<size_t>(i)].grad_norm) << "step " << i + 1;
      }
      EXPECT_TRUE(same_bits(all_weights(e), ref_weights));
    }
    MPI_Barrier(comm());
  }
  // Another optimizer kind's checkpoint, and Muon's into another kind.
  const int n = size();
  const std::string muon_root = root_ + "/muon_kind", adamw_root = root_ + "/adamw_kind";
  proto::EngineConfig adamw = config_for(SC::FULL_SHARD, n);
  adamw.mutable_optimizer()->set_kind(proto::OptimizerConfig::ADAMW);
  {
    Engine e(model->spec(), config_for(SC::FULL_SHARD, n), *world_);
    save_checkpoint(e, muon_root);
    Engine a(model->spec(), adamw, *world_);
    save_checkpoint(a, adamw_root);
  }
  for (const bool into_muon : {true, false}) {
    Engine e(model->spec(), into_muon ? config_for(SC::FULL_SHARD, n) : adamw, *world_);
    try {
      load_checkpoint(e, resolve_checkpoint(into_muon ? adamw_root : muon_root));
      ADD_FAILURE() << "loaded a checkpoint of another optimizer kind";
    } catch (const ConfigError& err) {
      EXPECT_NE(std::string(err.what()).find(into_muon ? "saved with optimizer.kind = ADAMW, whose state this run's MUON"
                                                       : "saved with optimizer.kind = MUON, whose state this run's ADAMW"),
                std::string::npos)
          << err.what();
    }
  }
}

// Every recipe's fields (fp32 master, bf16 params, int16 remainders, bf16
// or fp32 moments) reshard: the weights after loading on another world
// size equal the saved ones bit for bit, and training goes on.
TEST_F(CheckpointTest, EveryRecipeReshardsItsWeightsExactly) {
  if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int to = size() >= 3 ? 3 : 1;
  for (const std::string recipe : {"bf16_master", "bf16_remainder", "pure_bf16", "amp_fp16"}) {
    SCOPED_TRACE(recipe + " 2 -> " + std::to_string(to));
    const std::unique_ptr<Model> model = make_model(TestModel::kGpt);
    const std::string root = root_ + "/recipe_" + recipe;
    std::vector<std::vector<float>> saved;
    if (std::unique_ptr<Communicator> w = first(2)) {
      Engine e(model->spec(), engine_config(SC::FULL_SHARD, recipe, 2, 1), *w);
      for (int i = 0; i < 3; ++i) e.step(*model);
      saved = all_weights(e);
      save_checkpoint(e, root);
    }
    MPI_Barrier(comm());
    if (std::unique_ptr<Communicator> w = first(to)) {
      Engine e(model->spec(), engine_config(SC::SHARD_GRAD_OP, recipe, to, 1), *w);
      load_checkpoint(e, resolve_checkpoint(root));
      const std::vector<std::vector<float>> loaded = all_weights(e);
      if (!saved.empty()) {
        EXPECT_TRUE(same_bits(loaded, saved));
      }
      EXPECT_EQ(e.optimizer().steps_done(), 3);
      const StepResult r = e.step(*model);
      EXPECT_EQ(r.step, 4);
      EXPECT_TRUE(std::isfinite(r.loss));
    }
    MPI_Barrier(comm());
  }
}

// keep_last: older checkpoints go, `latest` names the newest, stale
// temporaries are removed, and saving a step twice writes nothing.
TEST_F(CheckpointTest, KeepsTheLastKAndMovesLatestLast) {
  const std::unique_ptr<Model> model = make_model(TestModel::kMlp);
  Engine e(model->spec(), engine_config(SC::FULL_SHARD, "bf16_master", size(), 1), *world_);
  const std::string root = root_ + "/keep";
  if (rank() == 0) fs::create_directories(root + "/.tmp-step_00000099");  // a crashed save
  MPI_Barrier(comm());
  CheckpointSaveOptions o;
  o.keep_last = 2;
  for (int i = 0; i < 4; ++i) {
    e.step(*model);
    save_checkpoint(e, root, o);
  }
  EXPECT_EQ(save_checkpoint(e, root, o).bytes, 0) << "step 4 saved twice";
  MPI_Barrier(comm());
  if (rank() == 0) {
    std::vector<std::string> names;
    for (const auto& d : fs::directory_iterator(root)) names.push_back(d.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_00000003", "step_00000004"}));
    EXPECT_EQ(resolve_checkpoint(root), root + "/step_00000004");
    EXPECT_GT(verify_checkpoint(root + "/step_00000003"), 0);
  }
  MPI_Barrier(comm());
}

// ---- asynchronous saves (Note [Asynchronous saves]) ------------------------------

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A save in the background while training goes on: training is unchanged,
// the files equal a synchronous save's of the same step byte for byte, and
// a run resumed from it continues with the uninterrupted run's losses and
// weights, bit for bit; the snapshot's bytes are what the memory plan says.
TEST_F(CheckpointTest, AsyncSaveWritesTheSyncFilesAndResumesBitwise) {
  const int n = size();
  for (Strategy s : all_strategies()) {
    for (const std::string recipe : {"bf16_master", "amp_fp16"}) {
      SCOPED_TRACE(std::string(strategy_name(s)) + " " + recipe + " on " + std::to_string(n) + " ranks");
      const proto::EngineConfig config = engine_config(s, recipe, n, 2);
      const std::unique_ptr<Model> model = make_model(TestModel::kGpt);
      std::vector<StepResult> ref;
      std::vector<std::vector<float>> ref_weights;
      const std::string tag = std::string(strategy_name(s)) + "_" + recipe;
      const std::string sync_root = root_ + "/sync_" + tag, async_root = root_ + "/async_" + tag;
      {
        Engine e(model->spec(), config, *world_);
        for (int i = 0; i < kSteps; ++i) {
          ref.push_back(e.step(*model));
          if (i + 1 == kSteps / 2) save_checkpoint(e, sync_root);
        }
        ref_weights = all_weights(e);
      }
      {
        Engine e(model->spec(), config, *world_);
        CheckpointWriter writer(e, async_root);
        for (int i = 0; i < kSteps / 2; ++i) e.step(*model);
        const CheckpointInfo started = writer.save_async();
        EXPECT_EQ(started.step, kSteps / 2);
        EXPECT_TRUE(writer.pending());
        // Training goes on while the snapshot is written: the same results.
        for (int i = kSteps / 2; i < kSteps; ++i) {
          EXPECT_EQ(e.step(*model).loss, ref[static_cast<size_t>(i)].loss) << "step " << i + 1;
        }
        EXPECT_TRUE(same_bits(all_weights(e), ref_weights));
        const std::optional<CheckpointInfo> done = writer.wait();
        ASSERT_TRUE(done.has_value());
        EXPECT_EQ(done->step, kSteps / 2);
        EXPECT_GT(done->bytes, 0);
        EXPECT_FALSE(writer.pending());
        EXPECT_FALSE(writer.wait().has_value()) << "nothing left to commit";
        // The largest rank's snapshot is the plan's (replica rank 0 of its shards).
        const int64_t largest = world_->all_reduce_int64(static_cast<int64_t>(writer.snapshot_bytes()), HostOp::kMax);
        EXPECT_EQ(largest, static_cast<int64_t>(plan_checkpoint_snapshot(model->spec(), e.options())));
      }
      const std::string name = checkpoint_step_dir_name(kSteps / 2), shard = checkpoint_shard_file_name(rank());
      EXPECT_EQ(resolve_checkpoint(async_root), async_root + "/" + name);
      const std::string async_file = file_bytes(async_root + "/" + name + "/" + shard);
      EXPECT_FALSE(async_file.empty());
      EXPECT_TRUE(async_file == file_bytes(sync_root + "/" + name + "/" + shard))
          << "rank " << rank() << "'s shard file differs";
      Engine e(model->spec(), config, *world_);
      load_checkpoint(e, resolve_checkpoint(async_root));
      for (int i = kSteps / 2; i < kSteps; ++i) {
        const StepResult r = e.step(*model);
        EXPECT_EQ(r.loss, ref[static_cast<size_t>(i)].loss) << "step " << i + 1;
        EXPECT_EQ(r.grad_norm, ref[static_cast<size_t>(i)].grad_norm) << "step " << i + 1;
        EXPECT_EQ(r.loss_scale, ref[static_cast<size_t>(i)].loss_scale) << "step " << i + 1;
      }
      EXPECT_TRUE(same_bits(all_weights(e), ref_weights));
    }
  }
}

// The background writer's path (write_checkpoint_image: O_DIRECT from an
// aligned image, the unaligned tail buffered): files from one block to
// several 8 MiB pieces get the bytes and block checksums that
// CheckpointBlockWriter streams; a misaligned image is written too.
TEST_F(CheckpointTest, ImageWritesGiveTheBytesOfStreamedWrites) {
  const std::string dir = root_ + "/image" + std::to_string(rank());
  fs::create_directories(dir);
  const int64_t max_bytes = (int64_t{20} << 20) + 4096;
  PinnedBuffer image(Device::cpu(), static_cast<size_t>(max_bytes) + 4096);
  char* data = image.as<char>();
  for (int64_t i = 0; i < max_bytes; ++i) data[i] = static_cast<char>((static_cast<uint64_t>(i) * 2654435761u) >> 13);
  for (const int64_t size : {int64_t{100}, int64_t{4096}, int64_t{8} << 20, (int64_t{20} << 20) - 123}) {
    for (const int64_t shift : {int64_t{0}, int64_t{64}}) {
      SCOPED_TRACE(std::to_string(size) + " bytes at offset " + std::to_string(shift));
      std::vector<uint32_t> streamed;
      {
        CheckpointBlockWriter w(dir + "/streamed.bin", kCheckpointBlockBytes);
        for (int64_t at = 0, piece = 1; at < size; at += piece, piece = piece * 3 + 7) {
          w.write(data + shift + at, std::min(piece, size - at));
        }
        streamed = w.finish();
      }
      int calls = 0;
      const std::vector<uint32_t> crcs =
          write_checkpoint_image(dir + "/image.bin", data + shift, size, kCheckpointBlockBytes, [&] { ++calls; });
      EXPECT_EQ(calls, 1);
      EXPECT_EQ(crcs, streamed);
      const std::string bytes = file_bytes(dir + "/image.bin");
      EXPECT_EQ(static_cast<int64_t>(bytes.size()), size);
      EXPECT_TRUE(bytes == file_bytes(dir + "/streamed.bin")) << "the image's file differs";
    }
  }
}

// At most one save in flight: the next save commits the previous one first,
// `latest` moves only at a commit, a save of a committed step writes
// nothing, and a writer destroyed with a save in flight leaves `latest`
// alone (the temporary directory goes at the next commit).
TEST_F(CheckpointTest, AsyncSaveCommitsInOrderAndOnlyWhenComplete) {
  const std::unique_ptr<Model> model = make_model(TestModel::kMlp);
  Engine e(model->spec(), engine_config(SC::FULL_SHARD, "bf16_master", size(), 1), *world_);
  const std::string root = root_ + "/async_order";
  auto latest = [&] { return resolve_checkpoint(root, true); };
  auto name = [&](int step) { return root + "/" + checkpoint_step_dir_name(step); };
  {
    CheckpointWriter w(e, root);
    EXPECT_TRUE(w.written()) << "nothing in flight";
    EXPECT_FALSE(w.wait().has_value());
    e.step(*model);
    w.save_async();
    EXPECT_EQ(latest(), "") << "step 1 is not committed yet";
    e.step(*model);
    w.save_async();  // commits step 1, starts step 2
    EXPECT_EQ(latest(), name(1));
    while (!w.written()) std::this_thread::yield();  // ends by itself, no collective needed
    EXPECT_EQ(latest(), name(1)) << "written is not committed";
    EXPECT_EQ(w.wait()->step, 2);
    EXPECT_EQ(latest(), name(2));
    EXPECT_EQ(w.save_async().bytes, 0) << "step 2 saved twice";
    EXPECT_FALSE(w.pending());
    e.step(*model);
    w.save_async();  // step 3 in flight when the writer goes
  }
  MPI_Barrier(comm());
  EXPECT_EQ(latest(), name(2));
  if (rank() == 0) {
    EXPECT_TRUE(fs::exists(root + "/.tmp-" + checkpoint_step_dir_name(3)));
  }
  MPI_Barrier(comm());
  {
    CheckpointWriter w(e, root);
    w.save_async();
    EXPECT_EQ(w.wait()->step, 3);
  }
  EXPECT_EQ(latest(), name(3));
  if (rank() == 0) {
    EXPECT_GT(verify_checkpoint(name(3)), 0);
    for (const auto& d : fs::directory_iterator(root)) {
      EXPECT_NE(d.path().filename().string().rfind(".tmp-", 0), 0u) << d.path() << " left behind";
    }
  }
  MPI_Barrier(comm());
}

// ---- bad checkpoints ------------------------------------------------------------

void flip_byte(const std::string& path, int64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5A);
  f.seekp(at);
  f.write(&c, 1);
}

// Each rank breaks its own copy (world size 1 each): every kind of damage
// gives an error naming the file and what is wrong, from load and verify.
TEST_F(CheckpointTest, DamagedCheckpointsGiveErrorsNamingTheFile) {
  const std::unique_ptr<Model> model = make_model(TestModel::kGpt);
  const proto::EngineConfig config = engine_config(SC::FULL_SHARD, "bf16_master", 1, 1);
  const std::string root = root_ + "/bad" + std::to_string(rank());
  {
    Engine e(model->spec(), config, *self_);
    e.step(*model);
    save_checkpoint(e, root);
  }
  const std::string dir = resolve_checkpoint(root);
  const std::string shard = dir + "/shard_00000.bin", manifest = dir + "/manifest.pb";
  const std::string backup = root + "/backup";
  fs::copy(dir, backup);

  struct Damage {
    std::string name;
    std::function<void()> apply;
    std::string expect;  // in the message, after the path
  };
  const int64_t shard_size = static_cast<int64_t>(fs::file_size(shard));
  const std::vector<Damage> damages = {
      {"flipped data byte", [&] { flip_byte(shard, shard_size / 2); }, "checksum mismatch"},
      {"flipped header byte", [&] { flip_byte(shard, 2); }, "checksum mismatch"},
      {"truncated shard", [&] { fs::resize_file(shard, static_cast<uintmax_t>(shard_size - 100)); }, "(truncated)"},
      {"grown shard", [&] { fs::resize_file(shard, static_cast<uintmax_t>(shard_size + 1)); }, "the manifest says"},
      {"deleted shard", [&] { fs::remove(shard); }, "cannot open"},
      {"deleted manifest", [&] { fs::remove(manifest); }, "no manifest.pb"},
      {"edited manifest", [&] { flip_byte(manifest, static_cast<int64_t>(fs::file_size(manifest)) - 3); },
       "checksum mismatch (the manifest was edited"},
      {"truncated manifest", [&] { fs::resize_file(manifest, 40); }, "truncated"},
      {"manifest magic", [&] { flip_byte(manifest, 0); }, "bad magic"},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.name);
    fs::remove_all(dir);
    fs::copy(backup, dir);
    d.apply();
    Engine e(model->spec(), config, *self_);
    const std::string load = error_of([&] { load_checkpoint(e, dir); });
    EXPECT_NE(load.find(dir), std::string::npos) << load;
    EXPECT_NE(load.find(d.expect), std::string::npos) << load;
    const std::string verify = error_of([&] { verify_checkpoint(dir); });
    EXPECT_NE(verify.find(d.expect), std::string::npos) << verify;
  }

  // A checkpoint of another model or precision policy.
  fs::remove_all(dir);
  fs::copy(backup, dir);
  {
    GptConfig other = small_gpt();
    other.channels = 24;
    Gpt wider(other);
    Engine e(wider.spec(), config, *self_);
    const std::string msg = error_of([&] { load_checkpoint(e, dir); });
    EXPECT_NE(msg.find("parameter 0 of unit embed is wte [128, 16]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("the model has wte [128, 24]"), std::string::npos) << msg;
  }
  {
    Engine e(model->spec(), engine_config(SC::FULL_SHARD, "bf16_remainder", 1, 1), *self_);
    const std::string msg = error_of([&] { load_checkpoint(e, dir); });
    EXPECT_NE(msg.find("stores master:fp32 param:bf16 state0:fp32 state1:fp32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("keeps param:bf16 remainder:int16"), std::string::npos) << msg;
  }
  // `latest` naming something that is not there; a path that is nothing.
  {
    std::ofstream(root + "/latest") << "step_00000042\n";
    const std::string msg = error_of([&] { read_checkpoint_manifest(resolve_checkpoint(root)); });
    EXPECT_NE(msg.find("step_00000042': no manifest.pb"), std::string::npos) << msg;
    std::ofstream(root + "/latest") << "../../etc\n";
    EXPECT_NE(error_of([&] { resolve_checkpoint(root); }).find("is not a checkpoint directory name"), std::string::npos);
    EXPECT_NE(error_of([&] { resolve_checkpoint(root + "/nothing"); }).find("neither a checkpoint"), std::string::npos);
    EXPECT_EQ(resolve_checkpoint(root + "/nothing", true), "");
  }
}

// One rank's damaged file: every rank fails the load with the same cause,
// none hangs.
TEST_F(CheckpointTest, ALoadErrorOnOneRankStopsEveryRank) {
  if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::unique_ptr<Model> model = make_model(TestModel::kMlp);
  const proto::EngineConfig config = engine_config(SC::FULL_SHARD, "fp32", size(), 1);
  const std::string root = root_ + "/one_bad";
  Engine e(model->spec(), config, *world_);
  e.step(*model);
  save_checkpoint(e, root);
  const std::string dir = resolve_checkpoint(root);
  if (rank() == 0) flip_byte(dir + "/shard_00001.bin", 100);  // rank 1 reads it (same world size)
  MPI_Barrier(comm());
  const std::string msg = error_of([&] { load_checkpoint(e, dir); });
  EXPECT_NE(msg.find("shard_00001.bin': checksum mismatch"), std::string::npos) << msg;
  if (rank() != 1) {
    EXPECT_NE(msg.find("checkpoint load failed on rank 1"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace mp::testing
