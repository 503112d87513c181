#include "launch/run_model.h"

#include <cmath>
#include <vector>

#include "formats/token_file.h"
#include "models/gpt_sample.h"
#include "models/mlp.h"

namespace mp {
namespace {

RunModel make_mlp(const TrainSettings& s, int threads, Allocator allocator) {
  RunModel m;
  MlpConfig mc = s.mlp;
  mc.threads = mc.threads > 0 ? mc.threads : threads;
  m.model = std::make_unique<Mlp>(mc, allocator);
  m.items_per_micro_batch = static_cast<double>(mc.micro_batch_size);
  m.flops_per_item = 6.0 * static_cast<double>(m.model->spec().numel());
  m.description = "MLP of " + std::to_string(m.model->spec().numel()) + " parameters";
  m.data_description = "synthetic classification data (models/mlp.h), held out: micro-batches from 2^40";
  return m;
}

// The GPT's sources: the synthetic language, or windows of data.train_path
// with validation windows of data.val_path or of the file's last val_fraction.
void open_gpt_data(const proto::DataConfig& d, const GptConfig& g, RunModel& m) {
  if (d.train_path().empty()) {
    auto data = std::make_shared<const GptData>(g);
    m.floor = data->entropy_floor();
    m.train = data;
    return;
  }
  auto file = std::make_shared<const TokenFile>(TokenFile::read(d.train_path(), g.vocab));
  int64_t train_end = file->size();
  const uint64_t seed = d.seed();
  if (!d.val_path().empty()) {
    auto val = std::make_shared<const TokenFile>(TokenFile::read(d.val_path(), g.vocab));
    m.val = std::make_shared<TokenWindows>(val, 0, val->size(), g.micro_batch_size, g.context, seed, false);
  } else if (d.val_fraction() > 0) {
    train_end = file->size() - static_cast<int64_t>(std::floor(d.val_fraction() * file->size()));
    m.val = std::make_shared<TokenWindows>(file, train_end, file->size(), g.micro_batch_size, g.context, seed, false);
  }
  m.train = std::make_shared<TokenWindows>(file, 0, train_end, g.micro_batch_size, g.context, seed, true);
  if (m.val) m.val_first = 0;
}

// The GPT's options from the run's engine options: TF32 GEMMs and the
// blocks whose activations are recomputed (the engine's own policy).
GptOptions gpt_options(const TrainSettings& s) {
  GptOptions o;
  o.allow_tf32 = s.engine_options.precision.tf32_matmul;
  o.deterministic = s.engine_options.deterministic;
  o.recompute_every = s.engine_options.recompute_every;
  return o;
}

RunModel make_gpt(const TrainSettings& s, int threads, Allocator allocator) {
  RunModel m;
  const proto::TrainConfig& c = s.config;
  GptConfig g = s.gpt;
  g.threads = g.threads > 0 ? g.threads : threads;
  g.matmul_dtype = s.gpt_matmul_dtype();
  g.fp32_ops.assign(c.compute().fp32_ops().begin(), c.compute().fp32_ops().end());
  open_gpt_data(c.data(), g, m);
  const GptOptions o = gpt_options(s);
  auto gpt = std::make_unique<Gpt>(g, allocator, m.train, o);
  m.gpt = gpt.get();
  m.model = std::move(gpt);
  m.description = gpt_describe(g);
  if (allocator.device().is_cuda()) m.description += "; CUDA kernels, " + m.gpt->describe_kernels();
  m.items_per_micro_batch = static_cast<double>(g.micro_batch_size * g.context);
  m.flops_per_item = gpt_train_flops_per_token(g);
  m.data_description = "train: " + m.train->describe() + "\n  validation: " +
                       (m.val ? m.val->describe() : "held-out sequences of the same source (index 2^40 on)");
  return m;
}

}  // namespace

ModelSpec model_spec(const TrainSettings& s) {
  return s.model == ModelKind::kGpt ? Gpt::spec_for(s.gpt) : Mlp::spec_for(s.mlp);
}

int64_t model_activation_bytes(const TrainSettings& s, Device device) {
  if (s.model == ModelKind::kMlp) return Mlp::activation_bytes(s.mlp, device);
  GptConfig g = s.gpt;
  g.matmul_dtype = s.gpt_matmul_dtype();
  g.fp32_ops.assign(s.config.compute().fp32_ops().begin(), s.config.compute().fp32_ops().end());
  return Gpt::activation_bytes(g, device, gpt_options(s));
}

RunModel make_model(const TrainSettings& settings, int threads, Allocator allocator) {
  RunModel m = settings.model == ModelKind::kMlp ? make_mlp(settings, threads, allocator)
                                                 : make_gpt(settings, threads, allocator);
  m.activation_bytes = model_activation_bytes(settings, allocator.device());
  return m;
}

double RunModel::validate(Engine& engine, int batches) {
  if (gpt != nullptr && val) gpt->set_source(val);
  const double loss = engine.evaluate(*model, val_first, batches);
  if (gpt != nullptr && val) gpt->set_source(train);
  return loss;
}

std::string RunModel::sample(Engine& engine, int count, uint64_t seed, int64_t step) {
  const std::vector<int32_t> tokens = gpt_sample(*gpt, [&] { engine.evaluate(*model, 0, 1); }, count, seed, step);
  return gpt_tokens_text(tokens, gpt->config().vocab);
}

}  // namespace mp
