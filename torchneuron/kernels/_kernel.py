"""Kernel objects: C++ against the kernel ABI (torchneuron_kernel.h), launched
as queued work items on neuron streams.

``cpp_kernel(source, name)`` builds the source with Inductor's C++ code cache
(the compiler and flags Inductor uses for its own CPU kernels; the library is
cached in memory and on disk, keyed by the source, so a kernel compiles once
per machine); ``load_kernel(path, name)`` takes a prebuilt shared library.
Either gives a ``Kernel``: calling it with tensors and numbers packs them into
a ``tn_args`` block and hands it to the backend's compiled-kernel launch
(``csrc/inductor/CompiledLaunch.h``), which copies the block into a work item
of kind ``custom`` on the current stream of the tensors' device.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from pathlib import Path
from typing import Any

import torch

from .. import _C

_HERE = Path(__file__).resolve().parent
ABI_VERSION = 1
MAX_DIMS = 8
MAX_TENSORS = 16
MAX_SCALARS = 16

_DTYPES = {
    torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3,
    torch.int64: 4, torch.int32: 5, torch.int16: 6, torch.int8: 7, torch.uint8: 8,
    torch.bool: 9,
}

_Body = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
_ParallelFor = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _Body,
                                ctypes.c_void_p)


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("numel", ctypes.c_int64), ("ndim", ctypes.c_int32),
                ("dtype", ctypes.c_int32), ("sizes", ctypes.c_int64 * MAX_DIMS),
                ("strides", ctypes.c_int64 * MAX_DIMS)]


class _Scalar(ctypes.Structure):
    _fields_ = [("f", ctypes.c_double), ("i", ctypes.c_int64)]


class _Args(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_int32), ("device", ctypes.c_int32),
                ("num_tensors", ctypes.c_int32), ("num_scalars", ctypes.c_int32),
                ("parallel_for", ctypes.c_void_p), ("tensors", _Tensor * MAX_TENSORS),
                ("scalars", _Scalar * MAX_SCALARS)]


_Launch = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)
_Run = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@functools.cache
def _backend() -> tuple[Any, int]:
    return _Launch(_C._compiled_launch_address()), int(_C._parallel_for_address())


def include_dir() -> str:
    """The folder holding ``torchneuron_kernel.h``, for prebuilt kernel libraries."""
    return str(_HERE)


@functools.cache
def _abi_header() -> str:
    return (_HERE / "torchneuron_kernel.h").read_text()


def _is_traced(t: torch.Tensor) -> bool:
    # Fake and meta tensors have no memory: the call is shape propagation
    # (torch.compile's fake mode, a custom op's fake implementation).
    return t.device.type == "meta" or isinstance(t, torch._subclasses.FakeTensor)


def check_float_inputs(op: str, **tensors: Any) -> None:
    """The checks every library kernel's inputs pass (the first tensor leads):
    tensors, float32 or bfloat16, one dtype, one device, neuron or cpu (or
    meta, when traced)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
    names, values = list(tensors), list(tensors.values())
    lead = values[0]

    def listed(items: list[Any]) -> str:
        return ", ".join(map(str, items[:-1])) + f" and {items[-1]}"

    if lead.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"{op}: {names[0]} must be float32 or bfloat16, got {lead.dtype}")
    if any(t.dtype != lead.dtype for t in values[1:]):
        raise TypeError(f"{op}: {listed(names[1:])} must have {names[0]}'s dtype {lead.dtype}, "
                        f"got {listed([t.dtype for t in values[1:]])}")
    if len({t.device for t in values}) != 1:
        raise ValueError(f"{op}: {listed(names)} must be on one device, got "
                         f"{listed([t.device for t in values])}")
    if lead.device.type not in ("neuron", "cpu", "meta"):
        raise ValueError(f"{op}: tensors on neuron (or cpu), got {lead.device}")


class Kernel:
    """A custom kernel: ``kernel(*tensors_and_numbers)`` queues it (see the module)."""

    def __init__(self, name: str, load: Any):
        self.name = name
        self._load = load  # () -> ctypes.CDLL, called at first launch
        self._lock = threading.Lock()
        self._function: int | None = None
        self._handles: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"torchneuron.kernels.Kernel({self.name!r})"

    def _entry(self) -> int:
        with self._lock:
            if self._function is None:
                library = self._load()
                try:
                    symbol = getattr(library, self.name)
                except AttributeError:
                    raise RuntimeError(
                        f"kernel {self.name!r}: the library defines no function of that name "
                        f"(declare it extern \"C\" void {self.name}(const tn_args*))") from None
                self._function = ctypes.cast(symbol, ctypes.c_void_p).value
            return self._function

    def _pack(self, args: tuple[Any, ...]) -> tuple[_Args, int | None, list[torch.Tensor]]:
        block = _Args()
        block.abi_version = ABI_VERSION
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        numbers = [a for a in args if not isinstance(a, torch.Tensor)]
        if len(tensors) > MAX_TENSORS or len(numbers) > MAX_SCALARS:
            raise ValueError(
                f"kernel {self.name!r}: at most {MAX_TENSORS} tensors and {MAX_SCALARS} numbers "
                f"per launch, got {len(tensors)} and {len(numbers)}")
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise RuntimeError(
                f"kernel {self.name!r}: expected all tensors on one device, got "
                f"{sorted(map(str, devices))}")
        device = next(iter(devices)) if devices else None
        if device is not None and device.type not in ("neuron", "cpu"):
            raise RuntimeError(
                f"kernel {self.name!r}: tensors must be on neuron (or cpu), got {device}")
        for slot, t in zip(block.tensors, tensors):
            if t.dtype not in _DTYPES:
                raise TypeError(f"kernel {self.name!r}: unsupported dtype {t.dtype}")
            if t.dim() > MAX_DIMS:
                raise ValueError(
                    f"kernel {self.name!r}: tensors of at most {MAX_DIMS} dims, got {t.dim()}")
            slot.data = t.data_ptr()
            slot.numel = t.numel()
            slot.ndim = t.dim()
            slot.dtype = _DTYPES[t.dtype]
            for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
                slot.sizes[d] = size
                slot.strides[d] = stride
        for slot, n in zip(block.scalars, numbers):
            if not isinstance(n, (bool, int, float)):
                raise TypeError(
                    f"kernel {self.name!r}: arguments are tensors, ints, floats and bools; "
                    f"got {type(n).__name__}")
            slot.f = float(n)
            slot.i = int(n)
        block.num_tensors, block.num_scalars = len(tensors), len(numbers)
        index = None
        if device is not None and device.type == "neuron":
            index = device.index if device.index is not None else torch.neuron.current_device()
        block.device = -1 if index is None else index
        return block, index, tensors

    def __call__(self, *args: Any) -> None:
        if any(isinstance(a, torch.Tensor) and _is_traced(a) for a in args):
            return None
        block, device, _ = self._pack(args)
        launch, parallel_for = _backend()
        block.parallel_for = parallel_for
        entry = self._entry()
        if device is None:  # CPU tensors: run now, on this thread
            _Run(entry)(ctypes.addressof(block))
            return None
        handle = self._handles.get(device)
        if handle is None:
            handle = self._handles.setdefault(device, int(_C._custom_kernel_handle(self.name, device)))
        error = ctypes.create_string_buffer(2048)
        if launch(handle, entry, ctypes.addressof(block), ctypes.sizeof(block), error,
                  len(error)) != 0:
            raise RuntimeError(f"kernel {self.name!r}: {error.value.decode(errors='replace')}")
        return None


def cpp_kernel(source: str, name: str, extra_flags: tuple[str, ...] = ()) -> Kernel:
    """A kernel from C++ source defining ``extern "C" void <name>(const tn_args*)``.

    The ABI header is prepended; the source compiles at the first launch (a
    second or so; then cached on disk by Inductor's code cache, one library
    per source and flags, whichever kernels of it are used). ``extra_flags``
    come after Inductor's, so they win (e.g. ``-ffp-contract=off``)."""

    def load() -> Any:
        from torch._inductor.codecache import CppCodeCache

        return CppCodeCache.load(_abi_header() + "\n" + source, extra_flags=tuple(extra_flags))

    return Kernel(name, load)


def load_kernel(path: str, name: str) -> Kernel:
    """A kernel from a prebuilt shared library (built against torchneuron_kernel.h)."""
    return Kernel(name, lambda: ctypes.CDLL(str(path)))
