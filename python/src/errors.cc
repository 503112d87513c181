#include "python/src/errors.h"

#include <exception>
#include <new>
#include <string>

#include "core/error.h"

namespace nb = nanobind;

namespace mp::python {
namespace {

// Each tier's Python class (mp.<tier name>) and docstring, in ErrorTier's order.
struct Tier {
  const char* name;
  const char* doc;
};
constexpr Tier kTiers[kNumErrorTiers] = {
    {"ConfigError", "A bad config, argument or input data."},
    {"IoError", "A file could not be opened, read, written or renamed."},
    {"CommError", "A collective failed, timed out or was mismatched."},
    {"CudaError", "CUDA, cuBLASLt or NCCL reported an error."},
    {"OutOfMemoryError", "An allocation failed."},
    {"NumericError", "NaN/Inf where the run cannot skip the step."},
    {"ModelError", "The model's own code failed: a callback raised, on this rank or another."},
    {"EnforceError", "A broken invariant: a bug in mp or its caller."},
};
// The classes, created once by bind_errors (module lifetime).
PyObject* g_classes[kNumErrorTiers] = {};

PyObject* make_class(nb::module_& m, const char* name, PyObject* base, const char* doc) {
  const std::string qualified = std::string("mp.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
  if (cls == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(cls);
  return cls;
}

void set_attr(PyObject* obj, const char* name, nb::handle value) {
  if (PyObject_SetAttrString(obj, name, value.ptr()) != 0) PyErr_Clear();
}

// Raises the Python exception for `e`: its class, what() as the argument,
// and the attributes of the file comment.
void raise(const Error& e) {
  const int tier = static_cast<int>(e.tier());
  PyObject* cls = g_classes[tier];
  nb::object exc = nb::steal(PyObject_CallFunction(cls, "s", e.what()));
  if (!exc.is_valid()) return;  // the call set a Python error: raise that
  set_attr(exc.ptr(), "message", nb::str(e.message().c_str()));
  set_attr(exc.ptr(), "rank", nb::int_(e.rank()));
  set_attr(exc.ptr(), "file", nb::str(e.file() != nullptr ? e.file() : ""));
  set_attr(exc.ptr(), "line", nb::int_(e.line()));
  set_attr(exc.ptr(), "agreed", nb::bool_(e.agreed()));
  set_attr(exc.ptr(), "tier", nb::str(kTiers[tier].name));
  PyErr_SetObject(cls, exc.ptr());
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    raise(e);
  } catch (const std::bad_alloc&) {
    PyErr_SetString(g_classes[static_cast<int>(ErrorTier::kOutOfMemory)], "out of memory");
  }
}

}  // namespace

void bind_errors(nb::module_& m) {
  PyObject* base = make_class(m, "Error", PyExc_RuntimeError,
                              "Base of mp's errors: the C++ message (what()) and its tier (core/error.h).");
  for (int t = 0; t < kNumErrorTiers; ++t) g_classes[t] = make_class(m, kTiers[t].name, base, kTiers[t].doc);
  nb::register_exception_translator(translate);
}

}  // namespace mp::python
