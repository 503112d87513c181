// mp.Engine: the C++ Engine (runtime/engine.h) over the world of mp.init(),
// on the CPU or this rank's GPU, with a Python object as its model
// (python/src/models.h). Every call that waits for the engine releases the
// GIL (Note [Python callbacks]).
#include "python/src/engine.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/comm_config.h"
#include "core/device.h"
#include "mp/config.h"
#include "mp/mp.h"
#include "optim/optimizer_kind.h"
#include "python/src/arrays.h"
#include "python/src/models.h"
#include "python/src/world.h"
#if MP_WITH_CUDA
#include "core/cuda_stream.h"
#endif

namespace nb = nanobind;

namespace mp::python {
namespace {

// "cpu", "cuda" (this rank's GPU: its node-local rank modulo the GPUs) or
// "cuda:N"; `*shared` := several ranks of the node on one GPU.
Device parse_device(const std::string& s, bool* shared) {
  *shared = false;
  if (s == "cpu") return Device::cpu();
  if (s == "cuda" || s.rfind("cuda:", 0) == 0) {
    const CudaInfo info = cuda_info();
    if (info.device_count == 0) {
      MP_THROW(ConfigError, "Engine(device='", s, "'): no CUDA device is usable: ", info.unavailable_reason);
    }
    const Ranks& w = world().ranks;
    *shared = w.local_size > info.device_count;
    if (s == "cuda") return Device::cuda(w.local_rank % info.device_count);
    int index = -1;
    try {
      index = std::stoi(s.substr(5));
    } catch (const std::exception&) {
    }
    if (index < 0 || index >= info.device_count) {
      MP_THROW(ConfigError, "Engine(device='", s, "'): ", info.device_count, " CUDA device(s) exist");
    }
    return Device::cuda(index);
  }
  MP_THROW(ConfigError, "Engine(device='", s, "'): expected 'cpu', 'cuda' or 'cuda:N'");
}

// The engine config a Python host runs: the text, with the driving host's
// settings where the text leaves them at their defaults.
proto::EngineConfig host_config(const std::string& text, int held_units, bool param_dtype_gradients) {
  proto::EngineConfig config = parse_engine_config(text, "engine config");
  if (config.sharding().held_units() == 0) config.mutable_sharding()->set_held_units(held_units);
  if (param_dtype_gradients) config.mutable_sharding()->set_param_dtype_gradients(true);
  return config;
}

// A memory plan as {category: bytes, ..., "total": bytes}.
nb::dict plan_dict(const MemoryPlan& plan) {
  nb::dict out;
  for (int c = 0; c < kNumMemCategories; ++c) {
    out[std::string(mem_category_name(static_cast<MemCategory>(c))).c_str()] = plan.bytes[static_cast<size_t>(c)];
  }
  out["total"] = plan.total();
  return out;
}

ParamInit::Kind init_kind(const std::string& s) {
  if (s == "zeros") return ParamInit::Kind::kZeros;
  if (s == "ones") return ParamInit::Kind::kOnes;
  if (s == "normal") return ParamInit::Kind::kNormal;
  if (s == "uniform") return ParamInit::Kind::kUniform;
  MP_THROW(ConfigError, "Param init '", s, "': expected 'zeros', 'ones', 'normal' or 'uniform'");
}

class PyEngine {
 public:
  PyEngine(std::vector<UnitSpec> units, const std::string& config_text, const std::string& device, int held_units,
           bool param_dtype_gradients) {
    spec_.units = std::move(units);
    bool shared = false;
    device_ = parse_device(device, &shared);
    config_ = host_config(config_text, held_units, param_dtype_gradients);
    const proto::EngineConfig& config = config_;
    nb::gil_scoped_release release;
    set_current_device(device_);
    world_ = make_world_communicator(device_, comm_options_from_config(config.comm()), shared);
    engine_ = std::make_unique<Engine>(spec_, config, *world_, Allocator(device_));
    closer_ = register_closer([this] { close(); });
  }
  ~PyEngine() { close(); }

  void close() {
    if (closer_ >= 0) unregister_closer(closer_);
    closer_ = -1;
    engine_.reset();  // waits for its queued work
    world_.reset();
  }

  StepResult step(nb::object model) {
    return with_model(std::move(model), [&](Model& m) { return engine().step(m); });
  }
  double evaluate(nb::object model, int64_t first, int count) {
    return with_model(std::move(model), [&](Model& m) { return engine().evaluate(m, first, count); });
  }

  // Note [Driving the engine] (runtime/engine.h). On the CPU the host's own
  // thread computes: unshard and gradient_buffer return once the compute
  // stream has passed what they enqueued (the gather has landed, the buffer
  // is free). On a GPU they return at once; compute_stream() orders the
  // caller's work.
  nb::object unshard(int u, bool backward) {
    Tensor t;
    {
      nb::gil_scoped_release release;
      t = engine().unshard(u, backward ? Engine::Pass::kBackward : Engine::Pass::kForward);
      if (device_.is_cpu()) engine().wait_compute();
    }
    return view(t);
  }
  void reshard(int u) { engine().reshard(u); }  // these four: without the GIL (call_guard below)
  bool unsharded(int u) { return engine().unsharded(u); }
  nb::object gradient_buffer(int u) {
    Tensor t;
    {
      nb::gil_scoped_release release;
      t = engine().gradient_buffer(u);
      if (device_.is_cpu()) engine().wait_compute();
    }
    return view(t);
  }
  void reduce_gradients(int u) { engine().reduce_gradients(u); }
  void note_loss(double loss) { engine().note_loss(loss); }
  void set_lr(double lr) { engine().set_lr(lr); }
  double loss_scale() { return engine().loss_scale(); }
  StepResult finish_step() { return engine().finish_step(); }
  // The compute stream's cudaStream_t as an int; 0 on the CPU.
  uintptr_t compute_stream() {
#if MP_WITH_CUDA
    if (!device_.is_cpu()) return reinterpret_cast<uintptr_t>(cuda_handle(&engine().compute()));
#endif
    return 0;
  }

  // Per unit: whether engine.activation_checkpointing recomputes it.
  const std::vector<bool>& recomputed() { return engine().recomputed(); }
  bool recomputes(int unit) {
    check_unit(unit);
    return recomputed()[static_cast<size_t>(unit)];
  }

  // Without the GIL, as the four above.
  std::string save_checkpoint(const std::string& root) { return mp::save_checkpoint(engine(), root).path; }
  int64_t load_checkpoint(const std::string& path) {
    return mp::load_checkpoint(engine(), resolve_checkpoint(path)).step();
  }

  // Unit u's weights from `values` (unit_numel floats); from rank `root`'s
  // values on every rank when root is given (broadcast in pieces of 16 MiB:
  // no copy on the root, one on the others).
  void set_weights(int u, nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> values,
                   std::optional<int> root) {
    check_unit(u);
    const int64_t want = engine().layout().unit(u).numel;
    if (static_cast<int64_t>(values.shape(0)) != want) {
      MP_THROW(ConfigError, "set_weights: unit ", u, " ('", engine().layout().unit(u).name, "') has ", want,
               " elements, got ", values.shape(0));
    }
    nb::gil_scoped_release release;
    if (!root.has_value() || *root == world_->rank()) {
      if (root.has_value()) broadcast_pieces(const_cast<float*>(values.data()), want, *root);  // sends only
      engine().set_weights(u, std::span<const float>(values.data(), static_cast<size_t>(want)));
      return;
    }
    std::vector<float> full(static_cast<size_t>(want));
    broadcast_pieces(full.data(), want, *root);
    engine().set_weights(u, full);
  }

  // data[0, n) := rank root's, in pieces (the root's own are only read).
  void broadcast_pieces(float* data, int64_t n, int root) {
    constexpr int64_t kPiece = int64_t{4} << 20;  // floats
    for (int64_t at = 0; at < n; at += kPiece) {
      const int64_t len = std::min(kPiece, n - at);
      const std::string bytes = world_->broadcast_bytes(
          std::string_view(reinterpret_cast<const char*>(data + at), static_cast<size_t>(len) * sizeof(float)), root);
      if (world_->rank() != root) std::memcpy(data + at, bytes.data(), bytes.size());
    }
  }

  nb::ndarray<nb::numpy, float, nb::ndim<1>> gather_master(int u) {
    check_unit(u);
    auto* values = new std::vector<float>();
    nb::capsule owner(values, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
    {
      nb::gil_scoped_release release;
      *values = engine().gather_master(u);
    }
    const size_t shape[1] = {values->size()};
    return nb::ndarray<nb::numpy, float, nb::ndim<1>>(values->data(), 1, shape, owner);
  }

  // This engine's memory plan at `world_size` ranks (0: its own).
  nb::dict plan(int world_size) {
    const int w = world_size > 0 ? world_size : engine().options().world_size;
    return plan_dict(plan_memory(spec_, resolve_engine_options(config_, w), -1, device_));
  }

  nb::dict memory() {
    const MemStats s = engine().memory();
    nb::dict current, peak, out;
    for (int c = 0; c < kNumMemCategories; ++c) {
      const std::string name(mem_category_name(static_cast<MemCategory>(c)));
      current[name.c_str()] = s.current_bytes[static_cast<size_t>(c)];
      peak[name.c_str()] = s.peak_bytes[static_cast<size_t>(c)];
    }
    out["current"] = current;
    out["peak"] = peak;
    out["total_current"] = s.total_current_bytes;
    out["total_peak"] = s.total_peak_bytes;
    return out;
  }

  nb::list params(int u) {
    check_unit(u);
    nb::list out;
    for (const ParamPlacement& p : engine().layout().unit(u).params) {
      nb::dict d;
      d["name"] = p.name;
      d["shape"] = nb::tuple(nb::cast(p.shape));
      d["offset"] = p.offset;
      d["numel"] = p.numel;
      d["muon"] = p.muon;
      out.append(d);
    }
    return out;
  }

  nb::tuple param_location(const std::string& name) {
    const ParamPlacement& p = engine().layout().param(name);
    return nb::make_tuple(p.unit, p.offset, p.numel);
  }

  int num_units() { return engine().layout().num_units(); }
  int64_t unit_numel(int u) {
    check_unit(u);
    return engine().layout().unit(u).numel;
  }
  std::string param_dtype() { return python_dtype_name(engine().options().precision.param_dtype); }
  std::string device() const { return to_string(device_); }
  int rank() { return world_->rank(); }
  int world_size() { return world_->size(); }

 private:
  Engine& engine() {
    if (!engine_) MP_THROW(ConfigError, "the engine was closed (Engine.close() or mp.finalize())");
    return *engine_;
  }
  void check_unit(int u) {
    const int n = engine().layout().num_units();
    if (u < 0 || u >= n) MP_THROW(ConfigError, "unit ", u, " out of range: the engine has ", n, " units");
  }
  // Runs `f` on the host's model without the GIL; the model's kept objects go after.
  template <class F, class R = std::invoke_result_t<F&, Model&>>
  R with_model(nb::object model, F&& f) {
    auto m = make_python_model(std::move(model), spec_, device_, recomputed());
    R r;
    {
      nb::gil_scoped_release release;
      r = f(*m);
    }
    release_kept(*m);
    return r;
  }

  ModelSpec spec_;
  proto::EngineConfig config_;  // as the engine runs it (host_config)
  Device device_;
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<Engine> engine_;
  int closer_ = -1;
};

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<ParamSpec>(m, "Param",
                        "One parameter: a unique name, a shape and how it starts. muon=True: optimizer kind MUON "
                        "updates it with Muon as one row-major matrix of its 2-D shape (adjust_lr_fn reads that "
                        "shape), not with its AdamW; other kinds ignore it.")
      .def(
          "__init__",
          [](ParamSpec* p, std::string name, std::vector<int64_t> shape, const std::string& init, double scale,
             bool muon) {
            new (p) ParamSpec{std::move(name), std::move(shape), ParamInit{init_kind(init), scale}};
            p->muon = muon;
          },
          nb::arg("name"), nb::arg("shape"), nb::arg("init") = "normal", nb::arg("scale") = 0.02,
          nb::arg("muon") = false)
      .def_ro("name", &ParamSpec::name)
      .def_ro("shape", &ParamSpec::shape)
      .def_ro("muon", &ParamSpec::muon);

  m.def(
      "plan_memory",
      [](std::vector<UnitSpec> units, const std::string& config, int world_size, const std::string& device,
         int held_units, bool param_dtype_gradients) {
        MP_ENFORCE(world_size > 0, "plan_memory at ", world_size, " ranks");
        ModelSpec spec;
        spec.units = std::move(units);
        const Device d = device == "cpu" ? Device::cpu() : Device::cuda(0);
        const EngineOptions o = resolve_engine_options(host_config(config, held_units, param_dtype_gradients),
                                                       world_size);
        return plan_dict(plan_memory(spec, o, -1, d));
      },
      nb::arg("units"), nb::arg("config") = "", nb::arg("world_size") = 1, nb::arg("device") = "cpu",
      nb::arg("held_units") = 0, nb::arg("param_dtype_gradients") = false,
      "The memory plan of an Engine(units, config, device, held_units, param_dtype_gradients) at world_size "
      "ranks: bytes per rank by category and their total, without making one (no collective).");

  m.def(
      "optimizer_kind",
      [](const std::string& config_text) {
        return proto::OptimizerConfig::Kind_Name(parse_engine_config(config_text, "engine config").optimizer().kind());
      },
      nb::arg("config") = "",
      "The name of the optimizer kind an engine config text names ('ADAMW', 'MUON', ...). ConfigError when the "
      "text does not parse.");
  m.def(
      "optimizer_updates_matrices",
      [](const std::string& config_text) {
        return configure_kind(parse_engine_config(config_text, "engine config").optimizer()).kind->matrices != nullptr;
      },
      nb::arg("config") = "",
      "Whether the optimizer kind an engine config text names updates the parameters marked muon=True as whole "
      "matrices (MUON does). ConfigError when the text does not parse or its optimizer is bad.");

  nb::class_<UnitSpec>(m, "Unit", "A unit: parameters gathered and reduced together, in order.")
      .def(
          "__init__",
          [](UnitSpec* u, std::string name, std::vector<ParamSpec> params, bool backward_reads_params,
             bool recomputable) {
            new (u) UnitSpec{std::move(name), std::move(params), backward_reads_params, recomputable};
          },
          nb::arg("name"), nb::arg("params"), nb::arg("backward_reads_params") = true,
          nb::arg("recomputable") = false)
      .def_ro("name", &UnitSpec::name)
      .def_ro("params", &UnitSpec::params)
      .def_ro("recomputable", &UnitSpec::recomputable);

  nb::class_<StepResult>(m, "StepResult", "What Engine.step returns (runtime/engine.h StepResult).")
      .def_ro("step", &StepResult::step)
      .def_ro("loss", &StepResult::loss)
      .def_ro("grad_norm", &StepResult::grad_norm)
      .def_ro("skipped", &StepResult::skipped)
      .def_ro("loss_scale", &StepResult::loss_scale)
      .def_ro("lr", &StepResult::lr)
      .def_prop_ro("seconds", [](const StepResult& r) { return r.timings.total_s; })
      .def_prop_ro("compute_seconds", [](const StepResult& r) { return r.timings.compute_s; })
      .def_prop_ro("exposed_comm_seconds", [](const StepResult& r) { return r.timings.exposed_comm_s; })
      .def("__repr__", [](const StepResult& r) {
        return "StepResult(step=" + std::to_string(r.step) + ", loss=" + std::to_string(r.loss) +
               ", grad_norm=" + std::to_string(r.grad_norm) + ", skipped=" + (r.skipped ? "True" : "False") + ")";
      });

  const auto kNoGil = nb::call_guard<nb::gil_scoped_release>();
  nb::class_<PyEngine>(m, "Engine",
                       "The sharded engine over every rank of mp.init()'s world. Collective: every rank "
                       "constructs it with the same units and config.")
      .def(nb::init<std::vector<UnitSpec>, const std::string&, const std::string&, int, bool>(), nb::arg("units"),
           nb::arg("config") = "", nb::arg("device") = "cpu", nb::arg("held_units") = 0,
           nb::arg("param_dtype_gradients") = false)
      .def("step", &PyEngine::step, nb::arg("model"), "One optimizer step of `model`. Collective.")
      .def("unshard", &PyEngine::unshard, nb::arg("unit"), nb::arg("backward") = false,
           "The unit's gathered parameters (param dtype, its padded elements) for its forward or backward; "
           "prefetches the next units. Collective.")
      .def("reshard", &PyEngine::reshard, nb::arg("unit"), kNoGil, "The unit's gathered parameters are read no more.")
      .def("unsharded", &PyEngine::unsharded, nb::arg("unit"), "Whether the unit is unsharded (not resharded yet).")
      .def("gradient_buffer", &PyEngine::gradient_buffer, nb::arg("unit"),
           "Where this backward's gradients of the unit go (float32, or the param dtype with param_dtype_gradients "
           "where that goes on the wire as it is; the layout of unshard's array).")
      .def("reduce_gradients", &PyEngine::reduce_gradients, nb::arg("unit"), kNoGil,
           "The unit's gradient_buffer holds this backward's gradients: issues their reduction. Collective.")
      .def("note_loss", &PyEngine::note_loss, nb::arg("loss"), "A micro-batch's mean loss, for StepResult.loss.")
      .def("finish_step", &PyEngine::finish_step, kNoGil,
           "After engine.micro_batches backwards: statistics, clipping, skip decision, the fused update. "
           "Collective.")
      .def("set_lr", &PyEngine::set_lr, nb::arg("lr"),
           "The lr of the steps from the next on, in place of the config's schedule. The same on every rank.")
      .def("loss_scale", &PyEngine::loss_scale,
           "What a host's loss is multiplied by before its backward (precision.loss_scaling; 1 without).")
      .def("compute_stream", &PyEngine::compute_stream, "The engine's cudaStream_t as an int (0 on the CPU).")
      .def("recomputes", &PyEngine::recomputes, nb::arg("unit"),
           "Whether engine.activation_checkpointing recomputes the unit: the model's forward then keeps only "
           "its input and recompute(unit, params) rebuilds the rest just before its backward.")
      .def("evaluate", &PyEngine::evaluate, nb::arg("model"), nb::arg("first"), nb::arg("count"),
           "The mean loss of `count` forward-only micro-batches per rank from index `first`. Collective.")
      .def("save_checkpoint", &PyEngine::save_checkpoint, nb::arg("root"), kNoGil,
           "Saves ROOT/step_N atomically and points ROOT/latest at it; returns the directory. Collective.")
      .def("load_checkpoint", &PyEngine::load_checkpoint, nb::arg("path"), kNoGil,
           "Loads a checkpoint directory or a root's latest, saved on any world size; returns its step "
           "(the steps it had run). Collective.")
      .def("set_weights", &PyEngine::set_weights, nb::arg("unit"), nb::arg("values"), nb::arg("root") = nb::none(),
           "Replaces the unit's weights with `values` (unit_numel float32s; rank `root`'s on every rank when "
           "given). Collective.")
      .def("gather_master", &PyEngine::gather_master, nb::arg("unit"),
           "The unit's weights as a float32 numpy array (unit_numel). Collective.")
      .def("memory", &PyEngine::memory, "The engine's own bytes by category: current, peak and totals.")
      .def("plan", &PyEngine::plan, nb::arg("world_size") = 0,
           "The engine's bytes by category and their total as its memory plan predicts them at world_size ranks "
           "(0: this engine's), before anything runs.")
      .def("params", &PyEngine::params, nb::arg("unit"),
           "The unit's parameters: name, shape, offset, numel, muon (Param's mark).")
      .def("param_location", &PyEngine::param_location, nb::arg("name"), "(unit, offset, numel) of a parameter.")
      .def("unit_numel", &PyEngine::unit_numel, nb::arg("unit"))
      .def("close", &PyEngine::close, "Waits for the engine's queued work and frees it.")
      .def_prop_ro("num_units", &PyEngine::num_units)
      .def_prop_ro("param_dtype", &PyEngine::param_dtype)
      .def_prop_ro("device", &PyEngine::device)
      .def_prop_ro("rank", &PyEngine::rank)
      .def_prop_ro("world_size", &PyEngine::world_size);
}

}  // namespace mp::python
