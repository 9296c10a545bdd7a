// MetaRefusal.cpp: tells the Meta pass (aten/MetaPass.h) whether a Python
// meta kernel's exception means "no Meta answer exists for this op" or "these
// arguments are wrong". Only the first takes the op off the asynchronous path
// for good; the second is the user's error, which CPU's kernel raises again
// for that call alone.
#include "aten/MetaPass.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

namespace torchneuron {
namespace {

// The exception types of a refusal: NotImplementedError, and fake tensors'
// "the output depends on data" exceptions (both RuntimeError subclasses, so
// they must be named; a plain RuntimeError is an argument error).
bool isRefusalType(PyObject* type) {
  if (type == nullptr) return true;  // nothing to look at: keep the old, safe answer
  if (PyErr_GivenExceptionMatches(type, PyExc_NotImplementedError)) return true;
  static PyObject* refusals = []() -> PyObject* {
    try {
      py::module_ fake = py::module_::import("torch._subclasses.fake_tensor");
      py::tuple types = py::make_tuple(fake.attr("DataDependentOutputException"),
                                       fake.attr("DynamicOutputShapeException"),
                                       fake.attr("UnsupportedOperatorException"));
      return types.release().ptr();  // kept for the process's life
    } catch (const py::error_already_set&) {
      return nullptr;  // (a torch without them: NotImplementedError alone refuses)
    }
  }();
  return refusals != nullptr && PyErr_GivenExceptionMatches(type, refusals) != 0;
}

bool pythonMetaRefused(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const py::error_already_set& e) {
    py::gil_scoped_acquire gil;
    return isRefusalType(e.type().ptr());
  } catch (const python_error& e) {
    py::gil_scoped_acquire gil;
    if (e.type != nullptr) return isRefusalType(e.type);
    // Raised without persist(): the exception is still the thread's pending one.
    PyObject* pending = PyErr_Occurred();
    return isRefusalType(pending);
  } catch (...) {
    return true;
  }
}

}  // namespace

void installMetaRefusalTest() { setForeignMetaRefusalTest(&pythonMetaRefused); }

}  // namespace torchneuron
