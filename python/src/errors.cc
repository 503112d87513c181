#include "python/src/errors.h"

#include <exception>
#include <new>
#include <string>

#include "core/error.h"

namespace nb = nanobind;

namespace mp::python {
namespace {

// The Python classes, created once by bind_errors (module lifetime).
struct Classes {
  PyObject* base = nullptr;
  PyObject* config = nullptr;
  PyObject* io = nullptr;
  PyObject* comm = nullptr;
  PyObject* cuda = nullptr;
  PyObject* oom = nullptr;
  PyObject* numeric = nullptr;
  PyObject* model = nullptr;
  PyObject* enforce = nullptr;
};
Classes g_classes;

PyObject* make_class(nb::module_& m, const char* name, PyObject* base, const char* doc) {
  const std::string qualified = std::string("mp.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
  if (cls == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(cls);
  return cls;
}

// The class of an mp::Error (the most derived tier it belongs to).
PyObject* class_of(const Error& e, const char** tier) {
  const auto is = [&](auto* p, const char* name, PyObject* cls) -> PyObject* {
    if (p == nullptr) return nullptr;
    *tier = name;
    return cls;
  };
  if (PyObject* c = is(dynamic_cast<const ConfigError*>(&e), "ConfigError", g_classes.config)) return c;
  if (PyObject* c = is(dynamic_cast<const IoError*>(&e), "IoError", g_classes.io)) return c;
  if (PyObject* c = is(dynamic_cast<const CommError*>(&e), "CommError", g_classes.comm)) return c;
  if (PyObject* c = is(dynamic_cast<const CudaError*>(&e), "CudaError", g_classes.cuda)) return c;
  if (PyObject* c = is(dynamic_cast<const OutOfMemoryError*>(&e), "OutOfMemoryError", g_classes.oom)) return c;
  if (PyObject* c = is(dynamic_cast<const NumericError*>(&e), "NumericError", g_classes.numeric)) return c;
  if (PyObject* c = is(dynamic_cast<const ModelError*>(&e), "ModelError", g_classes.model)) return c;
  *tier = "EnforceError";
  return g_classes.enforce;  // EnforceError, or an Error of no other tier
}

void set_attr(PyObject* obj, const char* name, nb::handle value) {
  if (PyObject_SetAttrString(obj, name, value.ptr()) != 0) PyErr_Clear();
}

// Raises the Python exception for `e`: its class, what() as the argument,
// and the attributes of the file comment.
void raise(const Error& e) {
  const char* tier = "Error";
  PyObject* cls = class_of(e, &tier);
  nb::object exc = nb::steal(PyObject_CallFunction(cls, "s", e.what()));
  if (!exc.is_valid()) return;  // the call set a Python error: raise that
  set_attr(exc.ptr(), "message", nb::str(e.message().c_str()));
  set_attr(exc.ptr(), "rank", nb::int_(e.rank()));
  set_attr(exc.ptr(), "file", nb::str(e.file() != nullptr ? e.file() : ""));
  set_attr(exc.ptr(), "line", nb::int_(e.line()));
  set_attr(exc.ptr(), "agreed", nb::bool_(e.agreed()));
  set_attr(exc.ptr(), "tier", nb::str(tier));
  PyErr_SetObject(cls, exc.ptr());
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    raise(e);
  } catch (const std::bad_alloc&) {
    PyErr_SetString(g_classes.oom, "out of memory");
  }
}

}  // namespace

void bind_errors(nb::module_& m) {
  g_classes.base = make_class(m, "Error", PyExc_RuntimeError,
                              "Base of mp's errors: the C++ message (what()) and its tier (core/error.h).");
  g_classes.config = make_class(m, "ConfigError", g_classes.base, "A bad config, argument or input data.");
  g_classes.io = make_class(m, "IoError", g_classes.base, "A file could not be opened, read, written or renamed.");
  g_classes.comm = make_class(m, "CommError", g_classes.base, "A collective failed, timed out or was mismatched.");
  g_classes.cuda = make_class(m, "CudaError", g_classes.base, "CUDA, cuBLASLt or NCCL reported an error.");
  g_classes.oom = make_class(m, "OutOfMemoryError", g_classes.base, "An allocation failed.");
  g_classes.numeric = make_class(m, "NumericError", g_classes.base, "NaN/Inf where the run cannot skip the step.");
  g_classes.model = make_class(m, "ModelError", g_classes.base,
                               "The model's own code failed: a callback raised, on this rank or another.");
  g_classes.enforce = make_class(m, "EnforceError", g_classes.base, "A broken invariant: a bug in mp or its caller.");
  nb::register_exception_translator(translate);
}

}  // namespace mp::python
