// launch/c_api.cc: the C ABI (include/mp/mp_c.h) over the C++ API. Every
// entry point catches everything: an mp::Error becomes its status code and
// the message is kept on the handle (or per thread without one).
#include <algorithm>
#include <exception>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "models/flat_layout.h"
#include "mp/mp.h"
#include "mp/mp_c.h"

namespace {

thread_local std::string g_last_error;
std::unique_ptr<mp::MpiWorld> g_world;

mp_status status_of(std::string& message) {
  // Each tier's status, in mp::ErrorTier's order: CUDA errors and broken invariants are internal.
  static constexpr mp_status kStatus[mp::kNumErrorTiers] = {
      MP_ERROR_CONFIG,  MP_ERROR_IO,   MP_ERROR_COMM,     MP_ERROR_INTERNAL, MP_ERROR_OUT_OF_MEMORY,
      MP_ERROR_NUMERIC, MP_ERROR_HOST, MP_ERROR_INTERNAL};
  try {
    throw;
  } catch (const mp::Error& e) {
    message = e.what();
    return kStatus[static_cast<int>(e.tier())];
  } catch (const std::bad_alloc&) {
    message = "out of memory";
    return MP_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    message = e.what();
    return MP_ERROR_INTERNAL;
  } catch (...) {
    message = "unknown error";
    return MP_ERROR_INTERNAL;
  }
}

mp_status invalid(std::string& message, const std::string& what) {
  message = what;
  return MP_ERROR_INVALID_ARGUMENT;
}

mp_dtype c_dtype(mp::DType d) {
  switch (d) {
    case mp::DType::kBF16: return MP_DTYPE_BF16;
    case mp::DType::kF16: return MP_DTYPE_F16;
    default: return MP_DTYPE_F32;
  }
}

// The host's callbacks as an mp::Model.
mp_step_result c_result(const mp::StepResult& r) {
  return mp_step_result{r.step, r.loss, r.grad_norm, r.loss_scale, r.lr, r.skipped ? 1 : 0, r.timings.total_s};
}

class CallbackModel final : public mp::HostModel {
 public:
  // recomputed: the engine's choice per unit (Note [Activation recomputation]).
  CallbackModel(const mp::ModelSpec& spec, const mp_model_callbacks& cb, void* user, std::vector<bool> recomputed)
      : spec_(spec), cb_(cb), user_(user), recomputed_(std::move(recomputed)) {}
  const mp::ModelSpec& spec() const override { return spec_; }
  bool recomputes(int unit) const override { return recomputed_[static_cast<size_t>(unit)]; }
  void recompute(int unit, const mp::Tensor& params) override {
    check(cb_.recompute(user_, unit, params.data(), c_dtype(params.dtype()), params.numel()), "recompute", unit);
  }
  void begin_micro_batch(int64_t g) override {
    if (cb_.begin_micro_batch != nullptr) check(cb_.begin_micro_batch(user_, g), "begin_micro_batch", -1);
  }
  void forward(int unit, const mp::Tensor& params) override {
    check(cb_.forward(user_, unit, params.data(), c_dtype(params.dtype()), params.numel()), "forward", unit);
  }
  double loss() const override { return cb_.loss(user_); }
  void backward(int unit, const mp::Tensor& params, const mp::Tensor& grads) override {
    check(cb_.backward(user_, unit, params.data(), c_dtype(params.dtype()), grads.data_as<float>(), grads.numel()),
          "backward", unit);
  }

 private:
  static void check(int rc, const char* what, int unit) {
    if (rc != 0) {
      MP_THROW(mp::ModelError, "the host's ", what, " callback", unit >= 0 ? " of unit " : "",
               unit >= 0 ? std::to_string(unit) : "", " returned ", rc);
    }
  }
  const mp::ModelSpec& spec_;
  mp_model_callbacks cb_;
  void* user_;
  std::vector<bool> recomputed_;
};

}  // namespace

struct mp_engine {
  mp::ModelSpec spec;
  std::unique_ptr<mp::Communicator> world;
  std::unique_ptr<mp::Engine> engine;
  std::string last_error;
};

namespace {

// Runs `f` (returning a status, or nothing for MP_OK); what it throws
// becomes its status, the message kept in `message`.
template <class F>
mp_status guarded(std::string& message, F&& f) {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      f();
      return MP_OK;
    } else {
      return f();
    }
  } catch (...) {
    return status_of(message);
  }
}

// Runs a driven call (Note [Driving the engine]); a status names what failed.
template <class F>
mp_status driven(const char* fn, mp_engine* engine, F&& f) {
  if (engine == nullptr) return invalid(g_last_error, mp::detail::str(fn, ": engine is null"));
  return guarded(engine->last_error, [&] { f(*engine->engine); });
}

}  // namespace

extern "C" {

const char* mp_version(void) { return MP_VERSION; }
const char* mp_last_error(void) { return g_last_error.c_str(); }

mp_status mp_init(int* argc, char*** argv) {
  return guarded(g_last_error, [&] {
    if (!g_world) g_world = std::make_unique<mp::MpiWorld>(argc, argv);
    mp::set_error_rank(g_world->rank());
  });
}

mp_status mp_finalize(void) {
  return guarded(g_last_error, [&] { g_world.reset(); });
}

int mp_world_rank(void) { return g_world ? g_world->rank() : -1; }
int mp_world_size(void) { return g_world ? g_world->size() : -1; }

mp_status mp_engine_create(const char* config_text, const mp_unit_desc* units, int num_units, mp_engine** out) {
  if (out == nullptr) return invalid(g_last_error, "mp_engine_create: out is null");
  *out = nullptr;
  if (!g_world) return invalid(g_last_error, "mp_engine_create: call mp_init first");
  if (units == nullptr || num_units <= 0) return invalid(g_last_error, "mp_engine_create: no units");
  return guarded(g_last_error, [&] {
    auto e = std::make_unique<mp_engine>();
    for (int u = 0; u < num_units; ++u) {
      const mp_unit_desc& ud = units[u];
      if (ud.name == nullptr || (ud.num_params > 0 && ud.params == nullptr) || ud.num_params < 0) {
        return invalid(g_last_error, mp::detail::str("mp_engine_create: unit ", u, ": null name or params"));
      }
      mp::UnitSpec unit{ud.name, {}, /*backward_reads_params=*/true, ud.recomputable != 0};
      for (int k = 0; k < ud.num_params; ++k) {
        const mp_param_desc& pd = ud.params[k];
        if (pd.name == nullptr || pd.ndim < 0 || (pd.ndim > 0 && pd.shape == nullptr)) {
          return invalid(g_last_error,
                         mp::detail::str("mp_engine_create: unit ", ud.name, " parameter ", k, ": null name or shape"));
        }
        if (static_cast<int>(pd.init) < MP_INIT_ZEROS || static_cast<int>(pd.init) > MP_INIT_UNIFORM) {
          return invalid(g_last_error, mp::detail::str("mp_engine_create: parameter ", pd.name, ": init ",
                                                       static_cast<int>(pd.init), " is not an mp_init_kind"));
        }
        mp::ParamSpec p{pd.name, mp::Shape(pd.shape, pd.shape + pd.ndim),
                        mp::ParamInit{static_cast<mp::ParamInit::Kind>(pd.init), pd.init_scale}};
        p.muon = pd.muon != 0;
        unit.params.push_back(std::move(p));
      }
      e->spec.units.push_back(std::move(unit));
    }
    const mp::proto::EngineConfig config =
        mp::parse_engine_config(config_text != nullptr ? config_text : "", "engine config");
    e->world = mp::MpiCommunicator::create_world("world", mp::CommOptions{});
    e->engine = std::make_unique<mp::Engine>(e->spec, config, *e->world);
    *out = e.release();
    return MP_OK;
  });
}

void mp_engine_destroy(mp_engine* engine) { delete engine; }

int mp_engine_recomputes(const mp_engine* engine, int unit) {
  if (engine == nullptr || unit < 0 || unit >= static_cast<int>(engine->spec.units.size())) return -1;
  return engine->engine->recomputed()[static_cast<size_t>(unit)] ? 1 : 0;
}

const char* mp_engine_last_error(const mp_engine* engine) {
  return engine != nullptr ? engine->last_error.c_str() : g_last_error.c_str();
}

int mp_engine_num_units(const mp_engine* engine) {
  return engine != nullptr ? engine->engine->layout().num_units() : -1;
}

int64_t mp_engine_unit_numel(const mp_engine* engine, int unit) {
  if (engine == nullptr || unit < 0 || unit >= engine->engine->layout().num_units()) return -1;
  return engine->engine->layout().unit(unit).numel;
}

mp_status mp_engine_param_location(mp_engine* engine, const char* name, int* unit, int64_t* offset, int64_t* numel) {
  if (engine == nullptr) return invalid(g_last_error, "mp_engine_param_location: engine is null");
  if (name == nullptr) return invalid(engine->last_error, "mp_engine_param_location: name is null");
  return guarded(engine->last_error, [&] {
    const mp::ParamPlacement& p = engine->engine->layout().param(name);
    if (unit != nullptr) *unit = p.unit;
    if (offset != nullptr) *offset = p.offset;
    if (numel != nullptr) *numel = p.numel;
  });
}

mp_status mp_engine_step(mp_engine* engine, const mp_model_callbacks* model, void* user, mp_step_result* result) {
  if (engine == nullptr) return invalid(g_last_error, "mp_engine_step: engine is null");
  if (model == nullptr || model->forward == nullptr || model->backward == nullptr || model->loss == nullptr) {
    return invalid(engine->last_error, "mp_engine_step: forward, loss and backward callbacks are required");
  }
  const std::vector<bool>& recomputed = engine->engine->recomputed();
  if (model->recompute == nullptr && std::find(recomputed.begin(), recomputed.end(), true) != recomputed.end()) {
    return invalid(engine->last_error, "mp_engine_step: the config's activation_checkpointing recomputes units, "
                                       "but the recompute callback is NULL");
  }
  return guarded(engine->last_error, [&] {
    CallbackModel m(engine->spec, *model, user, recomputed);
    const mp::StepResult r = engine->engine->step(m);
    if (result != nullptr) {
      *result = c_result(r);
    }
  });
}


// The host computes on its own thread: the calls that hand it a buffer
// return once the engine's compute stream has passed what they enqueued.
mp_status mp_engine_unshard(mp_engine* engine, int unit, int backward, const void** params, mp_dtype* dtype,
                            int64_t* numel) {
  return driven("mp_engine_unshard", engine, [&](mp::Engine& e) {
    const mp::Tensor t = e.unshard(unit, backward != 0 ? mp::Engine::Pass::kBackward : mp::Engine::Pass::kForward);
    e.wait_compute();
    if (params != nullptr) *params = t.data();
    if (dtype != nullptr) *dtype = c_dtype(t.dtype());
    if (numel != nullptr) *numel = t.numel();
  });
}

mp_status mp_engine_reshard(mp_engine* engine, int unit) {
  return driven("mp_engine_reshard", engine, [&](mp::Engine& e) { e.reshard(unit); });
}

mp_status mp_engine_gradient_buffer(mp_engine* engine, int unit, float** grads, int64_t* numel) {
  return driven("mp_engine_gradient_buffer", engine, [&](mp::Engine& e) {
    const mp::Tensor t = e.gradient_buffer(unit);
    e.wait_compute();
    if (grads != nullptr) *grads = t.data_as<float>();
    if (numel != nullptr) *numel = t.numel();
  });
}

mp_status mp_engine_reduce_gradients(mp_engine* engine, int unit) {
  return driven("mp_engine_reduce_gradients", engine, [&](mp::Engine& e) { e.reduce_gradients(unit); });
}

mp_status mp_engine_note_loss(mp_engine* engine, double loss) {
  return driven("mp_engine_note_loss", engine, [&](mp::Engine& e) { e.note_loss(loss); });
}

mp_status mp_engine_finish_step(mp_engine* engine, mp_step_result* result) {
  return driven("mp_engine_finish_step", engine, [&](mp::Engine& e) {
    const mp::StepResult r = e.finish_step();
    if (result != nullptr) *result = c_result(r);
  });
}

namespace {

// The arguments mp_engine_set_weights and mp_engine_get_weights share: a
// status other than MP_OK names `fn` and what is wrong.
mp_status check_weights_args(const char* fn, mp_engine* engine, int unit, const void* values, int64_t count) {
  if (engine == nullptr) return invalid(g_last_error, mp::detail::str(fn, ": engine is null"));
  if (values == nullptr) return invalid(engine->last_error, mp::detail::str(fn, ": values is null"));
  const int64_t want = mp_engine_unit_numel(engine, unit);
  if (want < 0) return invalid(engine->last_error, mp::detail::str(fn, ": no unit ", unit));
  if (count != want) {
    return invalid(engine->last_error, mp::detail::str(fn, ": unit ", unit, " has ", want, " elements, got ", count));
  }
  return MP_OK;
}

}  // namespace

mp_status mp_engine_set_weights(mp_engine* engine, int unit, const float* values, int64_t count) {
  if (const mp_status st = check_weights_args("mp_engine_set_weights", engine, unit, values, count); st != MP_OK) {
    return st;
  }
  return guarded(engine->last_error, [&] {
    engine->engine->set_weights(unit, std::span<const float>(values, static_cast<size_t>(count)));
  });
}

mp_status mp_engine_get_weights(mp_engine* engine, int unit, float* values, int64_t count) {
  if (const mp_status st = check_weights_args("mp_engine_get_weights", engine, unit, values, count); st != MP_OK) {
    return st;
  }
  return guarded(engine->last_error, [&] {
    const std::vector<float> w = engine->engine->gather_master(unit);
    std::copy(w.begin(), w.end(), values);
  });
}

mp_status mp_engine_save_checkpoint(mp_engine* engine, const char* root) {
  if (engine == nullptr) return invalid(g_last_error, "mp_engine_save_checkpoint: engine is null");
  if (root == nullptr) return invalid(engine->last_error, "mp_engine_save_checkpoint: root is null");
  return guarded(engine->last_error, [&] { mp::save_checkpoint(*engine->engine, root); });
}

mp_status mp_engine_load_checkpoint(mp_engine* engine, const char* path) {
  if (engine == nullptr) return invalid(g_last_error, "mp_engine_load_checkpoint: engine is null");
  if (path == nullptr) return invalid(engine->last_error, "mp_engine_load_checkpoint: path is null");
  return guarded(engine->last_error, [&] { mp::load_checkpoint(*engine->engine, mp::resolve_checkpoint(path)); });
}

}  // extern "C"
