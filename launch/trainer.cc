#include "launch/trainer.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_config.h"
#include "comm/data_plane.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/stop_signals.h"
#include "kernels/gemm_choice.h"
#include "kernels/op_profile.h"
#if MP_WITH_CUDA
#include "kernels/cuda/gemm_cublaslt.h"
#endif
#include "launch/checkpoint_policy.h"
#include "launch/crash_report.h"
#include "launch/device_choice.h"
#include "launch/run_log.h"
#include "launch/run_model.h"
#include "launch/step_agreement.h"
#include "mp/config.h"
#include "runtime/engine.h"

namespace mp {

int default_threads_per_rank(int local_size) {
  if (const char* env = std::getenv("MP_NUM_THREADS"); env != nullptr && *env != '\0') {
    return default_cpu_threads();  // parses and checks MP_NUM_THREADS
  }
  cpu_set_t set;
  int allowed = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (sched_getaffinity(0, sizeof(set), &set) == 0) allowed = std::max(1, CPU_COUNT(&set));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Bound to fewer cores than the node has: the launcher split them already.
  if (allowed < cores) return allowed;
  return std::max(1, allowed / std::max(1, local_size));
}

namespace {

// Every rank computes on the same kind of device (their data planes must
// match); ConfigError on every rank otherwise, naming the odd ones. Returns
// whether any rank shares its GPU (then every rank's data plane is the
// staged backend).
bool check_same_device_kind(Communicator& control, const DeviceChoice& choice) {
  const std::vector<std::string> all =
      control.all_gather_bytes(to_string(choice.device) + (choice.shared ? " shared" : ""));
  const bool cpu0 = all.front() == "cpu";
  std::string odd;
  bool shared = false;
  for (size_t r = 0; r < all.size(); ++r) {
    if ((all[r] == "cpu") != cpu0) odd += detail::str(odd.empty() ? "" : ", ", "rank ", r, " on ", all[r]);
    shared = shared || all[r].ends_with(" shared");
  }
  if (!odd.empty()) {
    MP_THROW_AGREED(ConfigError, "the ranks chose different kinds of device (compute.device): rank 0 on ",
                    all.front(), "; ", odd, ". Set compute.device to CPU or CUDA for every rank");
  }
  return shared;
}

// MP_OP_PROFILE=1: where the compute time goes, by op family (Note [Op
// profile]), printed at the end of the run.
bool op_profile_requested() {
  const char* env = std::getenv("MP_OP_PROFILE");
  if (env == nullptr || *env == '\0' || std::string(env) == "0") return false;
  if (std::string(env) == "1") return true;
  MP_THROW(ConfigError, "MP_OP_PROFILE = '", env, "': use 1 (print the compute time by op family) or 0");
}

// The GEMM plans made so far on a GPU (Note [cuBLASLt GEMM]), a line each.
std::vector<std::string> gemm_plan_lines() {
  std::vector<std::string> lines;
#if MP_WITH_CUDA
  for (const GemmPlanReport& r : gemm_cuda_new_plans()) {
    lines.push_back(detail::str(r.problem, ": ", r.form, ", algorithm ", r.algorithm, " of ", r.candidates,
                                r.tflops > 0 ? detail::str(", ", r.tflops, " TFLOP/s") : std::string(", not timed"),
                                " (cuda:", r.device, ")"));
  }
#endif
  return lines;
}

// Note [GEMM algorithm choice]: on a GPU each rank keeps its GEMM choices in
// the run directory, and a run that resumes there reads them back first, so
// it computes with the algorithms of the run it continues. "" where there is
// nothing to keep (the CPU, no run directory).
std::string gemm_choices_path(const proto::TrainConfig& c, const Device& device, int rank) {
  if (device.is_cpu() || c.out_dir().empty()) return "";
  return detail::str(c.out_dir(), "/gemm_choices.rank", rank, ".tsv");
}

// Whether step `step` of `steps` is one of every `interval` (> 0), or the last.
bool every(int64_t interval, int64_t step, int64_t steps) {
  return interval > 0 && (step % interval == 0 || step == steps);
}

}  // namespace

int train(const MpiWorld& world, const TrainSettings& s) {
  const proto::TrainConfig& c = s.config;
  const bool lead = world.rank() == 0;
  // Note [Crash reports] in launch/crash_report.h.
  install_worker_crash_report(c.out_dir(), world.rank());
  const int threads = c.compute().threads() > 0 ? c.compute().threads() : default_threads_per_rank(world.local_size());
  set_default_cpu_threads(threads);  // the engine's loops take the model's share of the cores
  (void)cuda_sync_each_op();  // checks MP_CUDA_SYNC on every device (core/device.h)
  const bool profile = op_profile_requested();
  op_profile_enable(profile);
  // Note [Device choice] in launch/device_choice.h.
  const DeviceChoice device = use_device(c.compute(), world.rank(), world.local_rank(), world.local_size());
  const CommOptions comm_options = comm_options_from_config(c.engine().comm());
  // The control plane; on the CPU the data plane too.
  auto comm = MpiCommunicator::create_world(device.device.is_cpu() ? "world" : "control", comm_options);
  const bool shared = check_same_device_kind(*comm, device);
  std::string data_plane_name = "MPI";
  std::unique_ptr<Communicator> data_plane;
  if (!device.device.is_cpu()) data_plane = make_data_plane(device.device, comm_options, shared, &data_plane_name);
  const std::string gemm_choices = gemm_choices_path(c, device.device, world.rank());
  if (!gemm_choices.empty() && std::filesystem::exists(gemm_choices)) {
    const int64_t n = gemm_choice_book().load(gemm_choices);
    if (lead) std::printf("GEMM choices: %lld read from %s\n", static_cast<long long>(n), gemm_choices.c_str());
  }
  Allocator allocator(device.device);
  RunModel m = make_model(s, threads, allocator);
  Engine engine(m.model->spec(), c.engine(), data_plane ? *data_plane : *comm, allocator);

  CheckpointPolicy checkpoints(engine, s, lead);
  const int64_t start = checkpoints.restore();  // a checkpoint, imported weights, or the init
  RunLog log(s, m, engine, allocator, world.size(), lead);
  log.begin(threads, start, checkpoints.note(), checkpoints.describe(),
            describe_device(device.device) + ", data plane " + data_plane_name +
                (device.note.empty() ? "" : "; " + device.note));
  if (s.export_only) {  // --steps 0: the weights as restored, no step
    if (lead) std::printf("no training (--steps 0): exporting the weights of step %lld\n", static_cast<long long>(start));
    checkpoints.export_weights();
    return 0;
  }
  // Note [Signals and oneDNN]: recorded by the watcher thread, acted on at
  // the next step boundary (every rank agrees there).
  std::optional<StopSignalScope> signals;
  if (checkpoints.saves_on_signal()) signals.emplace();

  const int64_t steps = c.steps();
  int64_t step = start;
  int stop = 0;  // the agreed stop signal
  while (step < steps && stop == 0) {
    StepReport report;
    report.step = ++step;
    const bool count = step == start + 2;  // the first steady step: Note [Op count]
    if (count) (void)op_count_take();
    report.result = engine.step(*m.model);
    if (count) log.ops(op_count_take(), gemm_plan_lines());
    if (step == start + 1 && !gemm_choices.empty()) gemm_choice_book().save(gemm_choices);
    if (every(c.val_interval(), step, steps)) report.val = m.validate(engine, std::max(1, c.val_batches()));
    if (m.gpt != nullptr && every(c.sample_interval(), step, steps)) {
      report.sample = m.sample(engine, c.sample_tokens(), c.engine().seed(), step);
    }
    // Note [Step agreement] in trainer.h.
    const StepAgreement agreed =
        agree_on_step(*comm, checkpoints.time_due(), report.result.timings, checkpoints.save_written());
    report.straggler = agreed.straggler;
    stop = checkpoints.after_step(step, agreed);
    log.step(report);
  }
  if (!gemm_choices.empty()) gemm_choice_book().save(gemm_choices);  // with validation's and sampling's too
  if (profile) {
    if (m.gpt != nullptr) m.gpt->flush_profile();
    log.op_profile(op_profile_take());
  }
  if (stop != 0) {
    log.stopped(stop, step);
    return 0;
  }
  checkpoints.finish();
  log.done();
  return 0;
}

}  // namespace mp
