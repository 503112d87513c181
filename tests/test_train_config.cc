// The training config (launch/train_config.h): the embedded default is
// configs/default.textproto, every shipped config resolves, each kind of
// override sets what it names, and each kind of bad input gives a
// ConfigError that says where and what.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "launch/train_config.h"
#include "tests/test_util.h"

#ifndef MP_SOURCE_DIR
#error "tests/CMakeLists.txt defines MP_SOURCE_DIR, the repository root"
#endif

namespace mp {
namespace {

using google::protobuf::util::MessageDifferencer;
using testing::error_of;
using testing::read_bytes;
using testing::write_bytes;
using SC = proto::ShardingConfig;
using PP = proto::PrecisionPolicy;

const std::string kConfigs = std::string(MP_SOURCE_DIR) + "/configs";

bool same(const proto::TrainConfig& a, const proto::TrainConfig& b) { return MessageDifferencer::Equals(a, b); }

proto::TrainConfig with(proto::TrainConfig c, const std::vector<std::string>& overrides) {
  for (const std::string& o : overrides) apply_override(c, o);
  return c;
}

proto::TrainConfig overridden(const std::vector<std::string>& overrides) {
  return with(default_train_config(), overrides);
}

class TrainConfigFiles : public testing::TempDirTest {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    write_bytes(path(name), text);
    return path(name);
  }
};

// ---- the embedded default and the shipped files ---------------------------------------

TEST(TrainConfig, EmbeddedDefaultIsConfigsDefaultTextproto) {
  const std::string path = kConfigs + "/default.textproto";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  // The same text (rebuild after editing the file), hence the same message.
  EXPECT_EQ(std::string(default_train_config_text()), read_bytes(path));
  EXPECT_TRUE(same(default_train_config(), load_train_config(path)));
}

TEST(TrainConfig, DefaultIsTheSmallGpt) {
  const proto::TrainConfig c = default_train_config();
  ASSERT_TRUE(c.model().has_gpt());
  const proto::GptModelConfig& g = c.model().gpt();
  EXPECT_EQ(g.vocab(), 256);
  EXPECT_EQ(g.context(), 64);
  EXPECT_EQ(g.channels(), 128);
  EXPECT_EQ(g.heads(), 4);
  EXPECT_EQ(g.layers(), 4);
  EXPECT_EQ(c.data().micro_batch_size(), 8);
  EXPECT_EQ(c.data().seed(), 1234u);
  EXPECT_TRUE(c.data().train_path().empty());
  EXPECT_EQ(c.engine().sharding().strategy(), SC::FULL_SHARD);
  EXPECT_EQ(c.engine().precision().recipe(), PP::BF16_MASTER);
  const proto::OptimizerConfig& o = c.engine().optimizer();
  EXPECT_EQ(o.kind(), proto::OptimizerConfig::ADAMW);
  EXPECT_DOUBLE_EQ(o.lr(), 3e-3);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(o.grad_clip(), 1.0);
  EXPECT_EQ(o.schedule().warmup_steps(), 20);
  EXPECT_EQ(o.schedule().total_steps(), 300);
  EXPECT_DOUBLE_EQ(o.schedule().min_lr(), 3e-4);
  EXPECT_EQ(c.engine().micro_batches(), 1);
  EXPECT_EQ(c.engine().seed(), 1u);
  EXPECT_EQ(c.steps(), 300);
  EXPECT_EQ(c.log_interval(), 10);
  EXPECT_EQ(c.val_interval(), 100);
  EXPECT_EQ(c.val_batches(), 4);
}

TEST(TrainConfig, EveryShippedConfigParsesAndResolves) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(kConfigs)) {
    if (entry.path().extension() == ".textproto") names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  const std::vector<std::string> expected = {"default.textproto", "gpt2_124m.textproto", "mlp.textproto"};
  for (const std::string& e : expected) {
    EXPECT_NE(std::find(names.begin(), names.end(), e), names.end()) << e << " is missing from " << kConfigs;
  }
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const proto::TrainConfig c = load_train_config(kConfigs + "/" + name);
    for (int world : {1, 8}) {
      const TrainSettings s = resolve_train_config(c, world);
      EXPECT_EQ(s.engine_options.world_size, world);
      // What the run directory records reads back as the same config, and
      // resolves to itself.
      EXPECT_TRUE(same(parse_train_config(to_text(s.config), "to_text"), s.config)) << to_text(s.config);
      EXPECT_TRUE(same(resolve_train_config(s.config, world).config, s.config));
    }
  }
}

TEST(TrainConfig, Gpt2_124mIsLlmcsRun) {
  const TrainSettings s = resolve_train_config(load_train_config(kConfigs + "/gpt2_124m.textproto"), 8);
  ASSERT_EQ(s.model, ModelKind::kGpt);
  EXPECT_EQ(s.gpt.vocab, 50257);
  EXPECT_EQ(s.gpt.context, 1024);
  EXPECT_EQ(s.gpt.channels, 768);
  EXPECT_EQ(s.gpt.heads, 12);
  EXPECT_EQ(s.gpt.layers, 12);
  EXPECT_EQ(s.gpt.micro_batch_size, 4);
  EXPECT_EQ(s.engine_options.precision.recipe, "amp_bf16");
  EXPECT_EQ(s.engine_options.strategy, SC::SHARD_OPTIMIZER);
  const proto::OptimizerConfig& o = s.config.engine().optimizer();
  EXPECT_DOUBLE_EQ(o.lr(), 6e-4);
  EXPECT_DOUBLE_EQ(o.beta2(), 0.95);
  EXPECT_EQ(o.schedule().warmup_steps(), 700);
  // 524288 tokens per step on 8 ranks.
  EXPECT_EQ(s.gpt.micro_batch_size * s.gpt.context * s.engine_options.micro_batches * 8, 524288);
}

TEST(TrainConfig, MlpConfigIsTheSmokeRun) {
  const TrainSettings s = resolve_train_config(load_train_config(kConfigs + "/mlp.textproto"), 2);
  ASSERT_EQ(s.model, ModelKind::kMlp);
  EXPECT_EQ(s.mlp.dims, (std::vector<int64_t>{64, 256, 256, 256, 16}));
  EXPECT_EQ(s.mlp.micro_batch_size, 32);
  EXPECT_EQ(s.config.steps(), 30);
  EXPECT_DOUBLE_EQ(s.config.engine().optimizer().lr(), 3e-3);
}

// ---- resolving --------------------------------------------------------------------------

TEST(TrainConfig, ResolveFillsTheDocumentedDefaults) {
  const proto::TrainConfig c =
      parse_train_config("model { gpt { layers: 6 } } data { micro_batch_size: 2 seed: 7 } steps: 5", "inline");
  const TrainSettings s = resolve_train_config(c, 1);
  ASSERT_EQ(s.model, ModelKind::kGpt);
  // model.gpt's zero fields take the embedded default's.
  EXPECT_EQ(s.gpt.vocab, 256);
  EXPECT_EQ(s.gpt.context, 64);
  EXPECT_EQ(s.gpt.channels, 128);
  EXPECT_EQ(s.gpt.heads, 4);
  EXPECT_EQ(s.gpt.layers, 6);
  EXPECT_EQ(s.config.model().gpt().vocab(), 256);
  EXPECT_EQ(s.gpt.micro_batch_size, 2);
  EXPECT_EQ(s.gpt.data_seed, 7u);
  EXPECT_EQ(s.config.log_interval(), 1);
  EXPECT_EQ(s.config.val_batches(), 4);
  EXPECT_EQ(s.config.sample_tokens(), 64);
  EXPECT_EQ(s.config.val_interval(), 0);
  EXPECT_EQ(s.engine_options.micro_batches, 1);
  EXPECT_EQ(s.engine_options.strategy, SC::FULL_SHARD);
  // What is set is kept.
  const TrainSettings t = resolve_train_config(overridden({"log_interval=3", "val_batches=9", "sample_tokens=16"}), 4);
  EXPECT_EQ(t.config.log_interval(), 3);
  EXPECT_EQ(t.config.val_batches(), 9);
  EXPECT_EQ(t.config.sample_tokens(), 16);
  // Checkpoints: none without a directory; out_dir/checkpoints with one,
  // saving on SIGTERM by default; keep_last 3.
  EXPECT_EQ(s.checkpoint_dir, "");
  EXPECT_FALSE(s.checkpoint_saves);
  const TrainSettings o = resolve_train_config(overridden({"out_dir=/r"}), 4);
  EXPECT_EQ(o.checkpoint_dir, "/r/checkpoints");
  EXPECT_TRUE(o.checkpoint_saves);
  EXPECT_EQ(o.checkpoint_keep_last, 3);
  const TrainSettings d = resolve_train_config(
      overridden({"out_dir=/r", "checkpoint.dir=/c", "checkpoint.save_on_signal=false", "checkpoint.keep_last=5"}), 4);
  EXPECT_EQ(d.checkpoint_dir, "/c");
  EXPECT_FALSE(d.checkpoint_saves);
  EXPECT_EQ(d.checkpoint_keep_last, 5);
}

TEST(TrainConfig, Fp32OpsMatchWholeNames) {
  const TrainSettings s = resolve_train_config(overridden({"compute.fp32_ops=head,h0\\..*"}), 1);
  ASSERT_EQ(s.fp32_ops.size(), 2u);
  EXPECT_TRUE(s.is_fp32_op("head"));
  EXPECT_TRUE(s.is_fp32_op("h0.attn.c_attn"));
  EXPECT_FALSE(s.is_fp32_op("h1.attn.c_attn"));
  EXPECT_FALSE(s.is_fp32_op("xhead"));
  EXPECT_FALSE(resolve_train_config(default_train_config(), 1).is_fp32_op("head"));
}

TEST(TrainConfig, ToTextWritesRepeatedScalarsOnOneLine) {
  const std::string text = to_text(load_train_config(kConfigs + "/mlp.textproto"));
  EXPECT_NE(text.find("dims: [64, 256, 256, 256, 16]"), std::string::npos) << text;
}

// ---- overrides ----------------------------------------------------------------------------

TEST(TrainConfig, OverridesOfEveryKind) {
  const proto::TrainConfig c = overridden({
      "engine.optimizer.lr=3e-4",                // double
      "model.gpt.layers= 6 ",                    // int64, spaces ignored
      "engine.micro_batches=-0",                 // int32
      "engine.seed=18446744073709551615",        // uint64, the largest
      "engine.sharding.strategy=shard_grad_op",  // enum by name, any case
      "engine.precision.recipe=3",               // enum by number (AMP_BF16)
      "engine.deterministic=TRUE",               // bool
      "data.train_path=/x/y z.bin",              // string, as written
      "data.val_path=a=b",                       // split at the first '='
      "compute.fp32_ops=head,h0\\..*",           // repeated string
      "engine.optimizer.beta1=0.8",              // proto3 optional: now present
  });
  EXPECT_DOUBLE_EQ(c.engine().optimizer().lr(), 3e-4);
  EXPECT_EQ(c.model().gpt().layers(), 6);
  EXPECT_EQ(c.model().gpt().vocab(), 256);  // the rest of the message is kept
  EXPECT_EQ(c.engine().micro_batches(), 0);
  EXPECT_EQ(c.engine().seed(), UINT64_MAX);
  EXPECT_EQ(c.engine().sharding().strategy(), SC::SHARD_GRAD_OP);
  EXPECT_EQ(c.engine().precision().recipe(), PP::AMP_BF16);
  EXPECT_TRUE(c.engine().deterministic());
  EXPECT_EQ(c.data().train_path(), "/x/y z.bin");
  EXPECT_EQ(c.data().val_path(), "a=b");
  ASSERT_EQ(c.compute().fp32_ops_size(), 2);
  EXPECT_EQ(c.compute().fp32_ops(0), "head");
  EXPECT_EQ(c.compute().fp32_ops(1), "h0\\..*");
  EXPECT_TRUE(c.engine().optimizer().has_beta1());
  EXPECT_DOUBLE_EQ(c.engine().optimizer().beta1(), 0.8);

  for (const auto& [text, expected] : std::vector<std::pair<std::string, bool>>{
           {"true", true}, {"false", false}, {"1", true}, {"0", false}, {"False", false}}) {
    EXPECT_EQ(overridden({"engine.deterministic=" + text}).engine().deterministic(), expected) << text;
  }
}

TEST(TrainConfig, RepeatedOverridesReplaceTheList) {
  const proto::TrainConfig mlp = load_train_config(kConfigs + "/mlp.textproto");
  const proto::TrainConfig c = with(mlp, {"model.mlp.dims=64, 128,16"});
  EXPECT_EQ(std::vector<int64_t>(c.model().mlp().dims().begin(), c.model().mlp().dims().end()),
            (std::vector<int64_t>{64, 128, 16}));
  EXPECT_EQ(with(mlp, {"model.mlp.dims="}).model().mlp().dims_size(), 0);  // cleared
  EXPECT_EQ(with(c, {"model.mlp.dims=7"}).model().mlp().dims_size(), 1);
}

TEST(TrainConfig, OverrideStringsKeepAnyUtf8) {
  proto::TrainConfig c = default_train_config();
  const std::string path = "data/\xd0\xb4\xd0\xb0\xe2\x82\xac\xf0\x9f\x98\x80.bin";  // Cyrillic, euro sign, emoji
  apply_override(c, "data.train_path=" + path);
  EXPECT_EQ(c.data().train_path(), path);
  EXPECT_EQ(parse_train_config(to_text(c), "round trip").data().train_path(), path);
}

TEST(TrainConfig, OverrideInsideAOneofMemberSelectsIt) {
  const proto::TrainConfig mlp = load_train_config(kConfigs + "/mlp.textproto");
  const proto::TrainConfig gpt = with(mlp, {"model.gpt.layers=2"});
  ASSERT_TRUE(gpt.model().has_gpt());
  EXPECT_FALSE(gpt.model().has_mlp());
  EXPECT_EQ(gpt.model().gpt().layers(), 2);
  EXPECT_EQ(gpt.model().gpt().vocab(), 0);  // unset: the default's at resolve
  EXPECT_EQ(resolve_train_config(gpt, 1).gpt.vocab, 256);
  const proto::TrainConfig back = with(gpt, {"model.mlp.dims=4,3"});
  ASSERT_TRUE(back.model().has_mlp());
  EXPECT_FALSE(back.model().has_gpt());
}

TEST(TrainConfig, FailedOverrideLeavesTheConfigUnchanged) {
  const proto::TrainConfig mlp = load_train_config(kConfigs + "/mlp.textproto");
  proto::TrainConfig c = mlp;
  EXPECT_THROW(apply_override(c, "model.gpt.layers=x"), ConfigError);  // would have selected gpt
  EXPECT_TRUE(same(c, mlp));
  EXPECT_THROW(apply_override(c, "model.mlp.dims=1,2,x"), ConfigError);  // would have cleared dims
  EXPECT_TRUE(same(c, mlp));
}

// ---- bad input ---------------------------------------------------------------------------

struct BadCase {
  std::string what;
  std::function<void()> run;
  std::string expected;  // a substring of the ConfigError's message
  std::string also = "";  // and another, when not empty
};

// Runs each case; every one must throw ConfigError with `expected` in it.
void expect_config_errors(const std::vector<BadCase>& cases) {
  for (size_t i = 0; i < cases.size(); ++i) {
    const BadCase& b = cases[i];
    const std::string message = error_of<ConfigError>(b.run);
    const bool found = message.find(b.expected) != std::string::npos &&
                       (b.also.empty() || message.find(b.also) != std::string::npos);
    EXPECT_TRUE(found) << "case " << i << " (" << b.what << "): expected a ConfigError containing\n  " << b.expected
                       << (b.also.empty() ? "" : "\nand\n  ") << b.also << "\ngot\n  " << message;
  }
}

BadCase bad_override(const std::string& assignment, const std::string& expected) {
  return {"override " + assignment,
          [assignment] {
            proto::TrainConfig c = default_train_config();
            apply_override(c, assignment);
          },
          expected};
}

// Overrides the default (or `base`), then resolves for `world` ranks.
BadCase bad_resolve(const std::vector<std::string>& overrides, const std::string& expected, int world = 1,
                    const std::string& base = "") {
  std::string what = "resolve";
  for (const std::string& o : overrides) what += " " + o;
  return {what,
          [=] {
            const proto::TrainConfig c = base.empty() ? default_train_config() : parse_train_config(base, "base");
            resolve_train_config(with(c, overrides), world);
          },
          expected};
}

TEST(TrainConfig, BadOverridesAreNamed) {
  expect_config_errors({
      bad_override("engine.optimzer.lr=1",
                   "unknown field 'engine.optimzer': engine (mp.proto.EngineConfig) has sharding, precision, "
                   "optimizer, comm, micro_batches, seed, deterministic"),
      bad_override("engine.optimizer.lrr=1", "unknown field 'engine.optimizer.lrr': engine.optimizer"),
      bad_override("stepz=1", "unknown field 'stepz': the config (mp.proto.TrainConfig) has model, data, engine"),
      bad_override("engine.optimizer.lr=abc", "engine.optimizer.lr = 'abc': not a number"),
      bad_override("engine.optimizer.lr=3e-4x", "engine.optimizer.lr = '3e-4x': not a number"),
      bad_override("engine.optimizer.lr=", "engine.optimizer.lr = '': not a number"),
      bad_override("engine.optimizer.lr=nan", "engine.optimizer.lr = 'nan': not a finite number"),
      bad_override("engine.optimizer.lr=-inf", "not a finite number"),
      bad_override("engine.optimizer.lr=1e999", "engine.optimizer.lr = '1e999': out of range for double"),
      bad_override("model.gpt.layers=6.5", "model.gpt.layers = '6.5': not an integer"),
      bad_override("model.gpt.layers=0x10", "model.gpt.layers = '0x10': not an integer"),
      bad_override("engine.micro_batches=2147483648",
                   "engine.micro_batches = '2147483648': out of range for int32 [-2147483648, 2147483647]"),
      bad_override("engine.micro_batches=-2147483649", "out of range for int32"),
      bad_override("steps=9223372036854775808", "steps = '9223372036854775808': out of range for int64"),
      bad_override("engine.seed=-1", "engine.seed = '-1': out of range for uint64 [0, 18446744073709551615]"),
      bad_override("engine.seed=18446744073709551616", "out of range for uint64"),
      bad_override("engine.sharding.strategy=FULL",
                   "engine.sharding.strategy = 'FULL': not a value of mp.proto.ShardingConfig.Strategy; valid: "
                   "FULL_SHARD, NO_SHARD, SHARD_OPTIMIZER, SHARD_GRAD_OP, HYBRID_SHARD"),
      bad_override("engine.sharding.strategy=9", "engine.sharding.strategy = '9': not a value of"),
      bad_override("engine.deterministic=yes", "engine.deterministic = 'yes': not a bool (true, false, 1 or 0)"),
      bad_override("model.mlp.dims=64,x,16", "model.mlp.dims[1] = 'x': not an integer"),
      bad_override("engine.optimizer=adamw",
                   "engine.optimizer (mp.proto.OptimizerConfig) is a message: cannot assign a whole message"),
      bad_override("model=gpt", "model (mp.proto.ModelConfig) is a message"),
      bad_override("engine.optimizer.param_groups=x", "engine.optimizer.param_groups (repeated "
                                                      "mp.proto.ParamGroupConfig) is a repeated message"),
      bad_override("engine.optimizer.param_groups.lr_scale=2", "is a repeated message; overrides cannot reach"),
      bad_override("steps.x=1", "steps (int64) is not a message"),
      bad_override("engine.optimizer.lr", "override 'engine.optimizer.lr': missing '='"),
      bad_override("data.train_path=a\xff.bin", "data.train_path: the value is not valid UTF-8 (text fields are UTF-8)"),
      bad_override("compute.fp32_ops=head,\xc0\xaf", "compute.fp32_ops[1]: the value is not valid UTF-8"),
      bad_override("data.train_path=\xed\xa0\x80", "data.train_path: the value is not valid UTF-8"),
      bad_override("data.train_path=\xf0\x9f\x98", "data.train_path: the value is not valid UTF-8"),
      bad_override("=3", "override '=3': no field path before '='"),
      bad_override("engine..lr=1", "override field path 'engine..lr': empty field name"),
  });
}

TEST(TrainConfig, BadConfigsAreNamed) {
  const std::string mlp_base = "model { mlp { dims: [4, 2] } } data { micro_batch_size: 1 } steps: 1";
  expect_config_errors({
      bad_resolve({"model.gpt.heads=5"}, "model.gpt.heads = 5 does not divide model.gpt.channels = 128"),
      bad_resolve({"model.gpt.layers=-1"}, "model.gpt.layers = -1: must be positive"),
      bad_resolve({"model.gpt.vocab=2000000000"}, "model.gpt.vocab = 2000000000: must be at most 1073741824"),
      bad_resolve({"model.gpt.layers=99999999999"}, "model.gpt.layers = 99999999999: must be at most 65536"),
      bad_resolve({"model.gpt.context=99999999999"}, "model.gpt.context = 99999999999: must be at most 16777216"),
      bad_resolve({"model.gpt.channels=1048576", "model.gpt.heads=1", "model.gpt.layers=2"},
                  "model.gpt: 2.63886e+13 parameters; at most 2^40 (1.09951e+12) are supported"),
      bad_resolve({"model.mlp.dims=4,99999999999,2"}, "model.mlp.dims[1] = 99999999999: must be at most 16777216"),
      bad_resolve({"model.mlp.dims=16777216,16777216,2"},
                  "model.mlp: 2.81475e+14 parameters; at most 2^40 (1.09951e+12) are supported"),
      bad_resolve({"steps=0"}, "steps = 0: must be positive"),
      bad_resolve({"log_interval=-1"}, "log_interval = -1: must not be negative"),
      bad_resolve({"val_batches=-4"}, "val_batches = -4: must not be negative"),
      bad_resolve({"compute.fp32_ops=head,h0\\.("}, "compute.fp32_ops[1] = 'h0\\.(': not a valid ECMAScript regex"),
      bad_resolve({"compute.threads=-2"}, "compute.threads = -2: must not be negative"),
      bad_resolve({"compute.matmul_dtype=9"}, "compute.matmul_dtype = '9': not a value of mp.proto.DataType"),
      bad_resolve({"data.micro_batch_size=0"}, "data.micro_batch_size = 0: must be positive"),
      bad_resolve({"data.train_path=t.bin", "data.val_fraction=1"}, "data.val_fraction = 1: must be in [0, 1)"),
      bad_resolve({"data.val_fraction=0.1"}, "data.val_fraction = 0.1 needs data.train_path"),
      bad_resolve({"data.train_path=t.bin", "data.val_path=v.bin", "data.val_fraction=0.1"},
                  "data.val_fraction = 0.1 and data.val_path = 'v.bin' are both set"),
      bad_resolve({"data.val_path=v.bin"}, "data.val_path = 'v.bin' needs data.train_path"),
      bad_resolve({"data.train_path=t.bin"}, "val_interval = 100 but data.train_path has no validation tokens"),
      bad_resolve({"sample_interval=10", "sample_tokens=65"}, "sample_tokens = 65 exceeds model.gpt.context = 64"),
      bad_resolve({"sample_interval=10"}, "sample_interval = 10: text samples need model.gpt", 1, mlp_base),
      bad_resolve({"data.train_path=t.bin"}, "data.train_path = 't.bin': token files feed model.gpt", 1, mlp_base),
      bad_resolve({"model.mlp.dims=64"}, "model.mlp.dims has 1 entry: need at least 2"),
      bad_resolve({"model.mlp.dims=64,0,16"}, "model.mlp.dims[1] = 0: must be positive"),
      bad_resolve({}, "model is not set", 1, "data { micro_batch_size: 1 } steps: 1"),
      bad_resolve({"checkpoint.interval_steps=100"},
                  "checkpoint.interval_steps is set but there is nowhere to save: set checkpoint.dir or out_dir"),
      bad_resolve({"checkpoint.save_at_end=true"}, "checkpoint.save_at_end is set but there is nowhere to save"),
      bad_resolve({"checkpoint.interval_steps=-1"}, "checkpoint.interval_steps = -1: must not be negative"),
      bad_resolve({"checkpoint.interval_minutes=-2"}, "checkpoint.interval_minutes = -2: must be finite and >= 0"),
      bad_resolve({"checkpoint.keep_last=-1"}, "checkpoint.keep_last = -1: must not be negative"),
      bad_resolve({"checkpoint.resume=auto"}, "checkpoint.resume = 'auto' looks under checkpoint.dir"),
      bad_resolve({"checkpoint.export_safetensors=x"}, "Hugging Face GPT-2 export needs model.gpt", 1, mlp_base),
      bad_resolve({"checkpoint.init_from_safetensors=x"}, "Hugging Face GPT-2 weights need model.gpt", 1, mlp_base),
      bad_resolve({"checkpoint.export_safetensors=x", "checkpoint.export_dtype=FP16"},
                  "checkpoint.export_dtype = FP16: FP32 or BF16"),
      // The engine's own errors pass through as they are.
      bad_resolve({"engine.sharding.strategy=HYBRID_SHARD", "engine.sharding.hybrid_shard_size=3"},
                  "sharding.hybrid_shard_size = 3 does not divide the world size 4", 4),
  });
}

TEST_F(TrainConfigFiles, BadFilesNameFileLineAndColumn) {
  const std::string typo = write("typo.textproto", "steps: 3\ndata { micro_batchsize: 4 }\n");
  const std::string unclosed = write("unclosed.textproto", "# a comment\nmodel { gpt { layers: 2 }\n");
  const std::string bad_enum = write("enum.textproto", "engine {\n  sharding { strategy: FULL }\n}\n");
  const std::string twice = write("twice.textproto", "steps: 3\nsteps: 4\n");
  const std::string bad_int = write("int.textproto", "engine { micro_batches: 3000000000 }\n");
  // The line is exact; the column is protobuf's (at or just after the bad
  // token), which protobuf versions may place differently.
  expect_config_errors({
      {"unknown field", [&] { load_train_config(typo); }, typo + ":2:",
       ": Message type \"mp.proto.DataConfig\" has no field named \"micro_batchsize\""},
      {"unclosed brace", [&] { load_train_config(unclosed); }, unclosed + ":3:", ": Expected identifier"},
      {"unknown enum value", [&] { load_train_config(bad_enum); }, bad_enum + ":2:",
       ": Unknown enumeration value of \"FULL\""},
      {"a field twice", [&] { load_train_config(twice); }, twice + ":2:", ": Non-repeated field \"steps\""},
      {"int32 out of range", [&] { load_train_config(bad_int); }, bad_int + ":1:", ": Integer out of range"},
      {"syntax error in a string", [] { parse_train_config("steps 3 }", "inline"); }, "inline:1:"},
      {"a string that is not UTF-8",
       [] { parse_train_config("steps: 3\ncompute { fp32_ops: \"head\" fp32_ops: \"h\\xff\" }\n", "utf8"); },
       "utf8:2:", ": compute.fp32_ops[1]: not valid UTF-8 (text fields are UTF-8)"},
  });
  // The column counts from 1: "engine { micro_batches: " is 24 characters.
  expect_config_errors({{"column", [&] { load_train_config(bad_int); }, bad_int + ":1:25: Integer out of range"}});
}

TEST_F(TrainConfigFiles, AMissingFileIsAnIoErrorNamingIt) {
  const std::string path = dir_ + "/no_such.textproto";
  try {
    load_train_config(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("train config '" + path + "': cannot open"), std::string::npos) << e.message();
  }
  try {
    load_train_config(dir_);
    ADD_FAILURE() << "no error for the directory " << dir_;
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("is a directory"), std::string::npos) << e.message();
  }
}

TEST_F(TrainConfigFiles, AnEmptyFileIsAnEmptyConfig) {
  const proto::TrainConfig c = load_train_config(write("empty.textproto", "# nothing\n"));
  EXPECT_TRUE(same(c, proto::TrainConfig()));
  EXPECT_THROW(resolve_train_config(c, 1), ConfigError);  // no model
}

}  // namespace
}  // namespace mp
