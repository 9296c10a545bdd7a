"""Inductor's C++ kernels as work items on neuron streams.

Inductor compiles a CPU kernel into a module whose Python entry calls the
kernel on the calling thread. For ``neuron`` the same kernel source, with the
same compiler and flags (so the same bits), is built with a different entry:
it packs the arguments (device pointers, sizes, scalars) into a struct and
queues a function that unpacks them and calls the kernel on the current
stream of the kernel's device (``csrc/inductor/CompiledLaunch.h``). The host
returns at once; the kernel runs in stream order with eager work, as a CUDA
kernel does. Each launch is a visible work item named
``inductor::<graph>/<kernel>``.
"""
from __future__ import annotations

import functools
import os
import re
from typing import Any, Callable, Sequence

from torch._inductor.codecache import CppPythonBindingsCodeCache
from torch._inductor.utils import clear_on_fresh_cache

from .. import _C

_LAUNCH_ENV = "_TORCHNEURON_LAUNCH_COMPILED"
_HOST_SCALAR_ENV = "_TORCHNEURON_HOST_SCALAR"

# Argument types Inductor's C++ kernels take, by how the entry reads them
# from Python: tensors (pointers), integers (sizes, seeds) and floats.
_INT_TYPES = {"int64_t", "long", "int", "int32_t", "uint64_t", "size_t"}
_FLOAT_TYPES = {"float", "double"}


def _field(argtype: str) -> tuple[str, str]:
    """(C type of the struct field, how the entry reads it) for one argument."""
    t = argtype.strip()
    bare = re.sub(r"^const\s+", "", t)
    if t.endswith("*"):
        return t, "pointer"
    if bare in _INT_TYPES:
        return bare, "int"
    if bare == "uintptr_t":
        return bare, "address"
    if bare in _FLOAT_TYPES:
        return bare, "float"
    if bare == "bool":
        return bare, "bool"
    raise NotImplementedError(f"torchneuron: compiled kernel argument type {argtype!r}")


def _read(kind: str, ctype: str, i: int) -> str:
    arg = f"argv[{i + 1}]"
    if kind == "pointer":
        return f"static_cast<{ctype}>(neuron_tensor_data({arg}))"
    if kind == "int":
        return f"static_cast<{ctype}>(PyLong_AsLongLong({arg}))"
    if kind == "address":
        return f"reinterpret_cast<uintptr_t>(PyLong_AsVoidPtr({arg}))"
    if kind == "float":
        return f"static_cast<{ctype}>(PyFloat_AsDouble({arg}))"
    return f"PyObject_IsTrue({arg}) == 1"


def _pointer_read(ctype: str, i: int) -> str:
    """A tensor argument: its device pointer, or, for a one-element CPU tensor
    (a CPU scalar), its value copied into the argument block now (the kernel
    runs later, when the host may have changed or freed it)."""
    return f"""  switch (neuron_host_scalar(argv[{i + 1}], packed.s{i}, sizeof packed.s{i})) {{
    case 1: packed.h{i} = true; break;
    case 0: packed.a{i} = {_read("pointer", ctype, i)}; break;
    default: return nullptr;
  }}"""


def queued_entry(argtypes: Sequence[str]) -> str:
    """C++ appended to a kernel's source: the module's Python entry `kernel`,
    called as kernel(handle, *args), which queues the kernel instead of
    running it."""
    fields = [_field(a) for a in argtypes]
    members = "\n".join(
        f"  {ctype} a{i};" + (f" uint64_t s{i}[2]; bool h{i};" if kind == "pointer" else "")
        for i, (ctype, kind) in enumerate(fields))
    call = ", ".join(
        f"(a->h{i} ? ({ctype})(const_cast<uint64_t*>(a->s{i})) : a->a{i})" if kind == "pointer"
        else f"a->a{i}" for i, (ctype, kind) in enumerate(fields))
    reads = "\n".join(
        _pointer_read(ctype, i) if kind == "pointer" else f"  packed.a{i} = {_read(kind, ctype, i)};"
        for i, (ctype, kind) in enumerate(fields)
    )
    n = len(fields)
    return f"""
// torchneuron: the Python entry queues kernel() on a neuron stream.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace {{
void* (*neuron_tensor_data)(PyObject*) = nullptr;
int (*neuron_launch)(const void*, void (*)(const void*), const void*, size_t, char*, size_t) =
    nullptr;
int (*neuron_host_scalar)(PyObject*, void*, size_t) = nullptr;

struct neuron_args {{
  char unused;  // keeps the struct non-empty for kernels without arguments
{members}
}};

void neuron_run(const void* p) {{
  const neuron_args* a = static_cast<const neuron_args*>(p);
  (void)a;
  kernel({call});
}}

PyObject* neuron_queue(PyObject*, PyObject* const* argv, Py_ssize_t argc) {{
  if (argc != {n + 1}) {{
    PyErr_Format(PyExc_TypeError, "compiled neuron kernel takes %d arguments, got %zd", {n},
                 argc - 1);
    return nullptr;
  }}
  const void* handle = PyLong_AsVoidPtr(argv[0]);
  neuron_args packed{{}};
{reads}
  if (PyErr_Occurred()) return nullptr;
  char error[2048];
  if (neuron_launch(handle, &neuron_run, &packed, sizeof packed, error, sizeof error) != 0) {{
    PyErr_SetString(PyExc_RuntimeError, error);
    return nullptr;
  }}
  Py_RETURN_NONE;
}}

PyMethodDef neuron_methods[] = {{
    {{"kernel", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&neuron_queue)),
     METH_FASTCALL, "queues the kernel on the current neuron stream"}},
    {{nullptr, nullptr, 0, nullptr}}}};

PyModuleDef neuron_module = {{PyModuleDef_HEAD_INIT, "kernel", nullptr, -1, neuron_methods}};

void* neuron_address(const char* var) {{
  const char* s = std::getenv(var);
  if (!s) return nullptr;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  return (errno || end == s) ? nullptr : reinterpret_cast<void*>(static_cast<uintptr_t>(v));
}}
}}  // namespace

PyMODINIT_FUNC PyInit_kernel(void) {{
  neuron_tensor_data = reinterpret_cast<void* (*)(PyObject*)>(
      neuron_address("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"));
  neuron_launch = reinterpret_cast<decltype(neuron_launch)>(neuron_address("{_LAUNCH_ENV}"));
  neuron_host_scalar =
      reinterpret_cast<decltype(neuron_host_scalar)>(neuron_address("{_HOST_SCALAR_ENV}"));
  if (!neuron_tensor_data || !neuron_launch || !neuron_host_scalar) {{
    PyErr_SetString(PyExc_ImportError, "a compiled neuron kernel is loaded by torchneuron only");
    return nullptr;
  }}
  return PyModule_Create(&neuron_module);
}}
"""


@clear_on_fresh_cache
class NeuronKernelCodeCache(CppPythonBindingsCodeCache):
    """Builds and loads kernel modules with the queued entry (cached as
    Inductor caches its CPU kernels: in memory and on disk, by source)."""

    cache: dict[str, Callable[[], Any]] = {}

    @classmethod
    def _load_library_inner(cls, path: str, key: str) -> Any:
        os.environ[_LAUNCH_ENV] = str(_C._compiled_launch_address())
        os.environ[_HOST_SCALAR_ENV] = str(_C._host_scalar_address())
        return super()._load_library_inner(path, key)

    @classmethod
    def load_queued_async(
        cls, argtypes: Sequence[str], source: str, submit_fn: Any = None
    ) -> Callable[[], Any]:
        get_module = cls.load_async(source + queued_entry(argtypes), "cpu", submit_fn=submit_fn)
        entry = None

        def future() -> Any:
            nonlocal entry
            if entry is None:
                entry = getattr(get_module(), cls.entry_function)
            return entry

        return future


def load_kernel(
    async_compile: Any, name: str, device: int, argtypes: Sequence[str], source: str
) -> Any:
    """What a neuron graph's wrapper calls in place of
    ``async_compile.cpp_pybinding``: the kernel, as a callable that queues it."""
    from torch._inductor.async_compile import get_compile_threads
    from torch._inductor.codecache import LambdaFuture

    handle = _C._compiled_kernel_handle(name, device)
    in_process = get_compile_threads() <= 1
    get_entry = NeuronKernelCodeCache.load_queued_async(
        argtypes, source, submit_fn=None if in_process else async_compile.submit)
    if in_process:
        return functools.partial(get_entry(), handle)
    return LambdaFuture(lambda: functools.partial(get_entry(), handle))
