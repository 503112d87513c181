#include "python/src/models.h"

#include <nanobind/ndarray.h>

#include <cstdint>
#include <utility>

#include "core/error.h"
#include "kernels/ops.h"
#include "mp/config.h"
#include "python/src/arrays.h"
#if MP_WITH_CUDA
#include "core/cuda_stream.h"
#endif

namespace nb = nanobind;

namespace mp::python {
namespace {

// "the model's forward of unit 2 ('h1')".
std::string describe(const ModelSpec& spec, const char* call, int unit) {
  std::string s = std::string("the model's ") + call;
  if (unit >= 0 && unit < static_cast<int>(spec.units.size())) {
    s += " of unit " + std::to_string(unit) + " ('" + spec.units[static_cast<size_t>(unit)].name + "')";
  }
  return s;
}

// Runs `f` (Python calls) with the GIL held; a Python error becomes
// ModelError naming the call and carrying the traceback.
template <class F>
auto call_python(const ModelSpec& spec, const char* call, int unit, F&& f) -> decltype(f()) {
  nb::gil_scoped_acquire gil;
  try {
    return f();
  } catch (nb::python_error& e) {
    MP_THROW(ModelError, describe(spec, call, unit), " raised:\n", e.what());
  } catch (const nb::cast_error&) {
    MP_THROW(ModelError, describe(spec, call, unit), " returned a value of the wrong type");
  } catch (const nb::builtin_exception& e) {
    MP_THROW(ModelError, describe(spec, call, unit), " failed: ", e.what());
  }
}

// The CPU: the calls as host tasks of the compute stream (HostModel).
class PyHostModel final : public HostModel {
 public:
  PyHostModel(nb::object model, const ModelSpec& spec, std::vector<bool> recomputed)
      : model_(std::move(model)), spec_(spec), recomputed_(std::move(recomputed)) {
    has_begin_ = nb::hasattr(model_, "begin_micro_batch");
  }
  ~PyHostModel() override {
    nb::gil_scoped_acquire gil;
    model_.reset();
  }
  const ModelSpec& spec() const override { return spec_; }
  void begin_micro_batch(int64_t g) override {
    if (!has_begin_) return;
    call_python(spec_, "begin_micro_batch", -1, [&] { model_.attr("begin_micro_batch")(g); });
  }
  void forward(int unit, const Tensor& params) override {
    call_python(spec_, "forward", unit, [&] { model_.attr("forward")(unit, view(params)); });
  }
  double loss() const override {
    return call_python(spec_, "loss", -1, [&] { return nb::cast<double>(model_.attr("loss")()); });
  }
  void backward(int unit, const Tensor& params, const Tensor& grads) override {
    call_python(spec_, "backward", unit, [&] { model_.attr("backward")(unit, view(params), view(grads)); });
  }
  bool recomputes(int unit) const override { return recomputed_[static_cast<size_t>(unit)]; }
  void recompute(int unit, const Tensor& params) override {
    call_python(spec_, "recompute", unit, [&] { model_.attr("recompute")(unit, view(params)); });
  }

 private:
  nb::object model_;
  const ModelSpec& spec_;
  std::vector<bool> recomputed_;
  bool has_begin_ = false;
};

#if MP_WITH_CUDA
// A CUDA device: the calls on the host thread as the engine enqueues, the
// model's work on the compute stream (Note [Python callbacks]).
class PyDeviceModel final : public Model {
 public:
  PyDeviceModel(nb::object model, const ModelSpec& spec, std::vector<bool> recomputed)
      : model_(std::move(model)), spec_(spec), recomputed_(std::move(recomputed)) {
    has_begin_ = nb::hasattr(model_, "begin_micro_batch");
  }
  ~PyDeviceModel() override {
    nb::gil_scoped_acquire gil;
    kept_.clear();
    model_.reset();
  }
  const ModelSpec& spec() const override { return spec_; }
  void begin_micro_batch_on(int64_t g, Stream& s) override {
    if (!has_begin_) return;
    guarded(s, "begin_micro_batch", -1, [&] { model_.attr("begin_micro_batch")(g); });
  }
  void forward_on(int unit, const Tensor& params, Stream& s) override {
    guarded(s, "forward", unit, [&] { model_.attr("forward")(unit, view(params), handle(s)); });
  }
  void loss_on(double* loss, Stream& s) override {
    guarded(s, "loss", -1, [&] {
      nb::object value = model_.attr("loss")();
      auto a = nb::cast<nb::ndarray<nb::device::cuda>>(value);
      if (a.size() != 1 || a.dtype() != nb::dtype<double>()) {
        throw nb::type_error("loss() must return one float64 element on the device");
      }
      ops::copy_bytes(loss, Device::cpu(), a.data(), s.device(), sizeof(double), s);
      kept_.push_back(std::move(value));  // until the copy has run (release_kept)
    });
  }
  void backward_on(int unit, const Tensor& params, const Tensor& grads, Stream& s) override {
    guarded(s, "backward", unit, [&] { model_.attr("backward")(unit, view(params), view(grads), handle(s)); });
  }
  bool recomputes(int unit) const override { return recomputed_[static_cast<size_t>(unit)]; }
  void recompute_on(int unit, const Tensor& params, Stream& s) override {
    guarded(s, "recompute", unit, [&] { model_.attr("recompute")(unit, view(params), handle(s)); });
  }
  void release() {
    kept_.clear();
    failed_ = false;  // a new step calls the model again
  }

 private:
  static uintptr_t handle(Stream& s) { return reinterpret_cast<uintptr_t>(cuda_handle(&s)); }

  // A call that raises fails the stream with its error, in stream order,
  // and the step skips the model's later calls (Note [A failed step]).
  template <class F>
  void guarded(Stream& s, const char* call, int unit, F&& f) {
    if (failed_) return;
    try {
      call_python(spec_, call, unit, f);
    } catch (const Error&) {
      failed_ = true;
      s.host_task([e = std::current_exception()] { std::rethrow_exception(e); }, TaskName{call});
    }
  }

  nb::object model_;
  const ModelSpec& spec_;
  std::vector<bool> recomputed_;
  bool has_begin_ = false;
  bool failed_ = false;
  std::vector<nb::object> kept_;
};
#endif

}  // namespace

std::unique_ptr<Model> make_python_model(nb::object model, const ModelSpec& spec, Device device,
                                         std::vector<bool> recomputed) {
  if (device.is_cpu()) return std::make_unique<PyHostModel>(std::move(model), spec, std::move(recomputed));
#if MP_WITH_CUDA
  return std::make_unique<PyDeviceModel>(std::move(model), spec, std::move(recomputed));
#else
  MP_THROW(ConfigError, "a model on ", device, ": mp was built without CUDA");
#endif
}

void release_kept(Model& model) {
#if MP_WITH_CUDA
  if (auto* m = dynamic_cast<PyDeviceModel*>(&model)) m->release();
#else
  (void)model;
#endif
}

}  // namespace mp::python
