"""Device management for ``torch.neuron``: availability, lazy init, fork safety."""
from __future__ import annotations

import atexit
import os
import threading
import warnings
from typing import Any, Callable

import torch

from . import _C

_initialized = False
_initialization_lock = threading.Lock()
_queued_calls: list[tuple[Callable[[], None], str]] = []
_tls = threading.local()


def _is_in_bad_fork() -> bool:
    """True in a child forked after the runtime was initialised (use 'spawn')."""
    return bool(_C._is_in_bad_fork())


def is_available() -> bool:
    """Whether at least one neuron device is visible. Never raises, never initialises."""
    try:
        return _C._device_count() > 0
    except Exception:  # pragma: no cover - defensive: must never throw
        return False


_init_error_warned = False


def device_count() -> int:
    """Number of visible neuron devices (0 when the runtime is unusable).

    As ``torch.cuda.device_count()``, an unusable runtime (a bad ``NEURON_RT_*``
    value) is not an exception here: it warns once with the reason, and the first
    use of a device raises a RuntimeError with the same reason.
    """
    global _init_error_warned
    try:
        n = int(_C._device_count())
    except Exception:  # pragma: no cover
        return 0
    if n == 0 and not _init_error_warned:
        error = _C._init_error()
        if error:
            _init_error_warned = True
            warnings.warn(f"neuron initialization: {error}", UserWarning, stacklevel=2)
    return n


def is_initialized() -> bool:
    return _initialized and not _is_in_bad_fork()


def _lazy_call(callable: Callable[[], None], **kwargs: Any) -> None:
    if is_initialized():
        callable()
    else:
        _queued_calls.append((callable, "".join(__import__("traceback").format_stack())))


def _lazy_init() -> None:
    global _initialized
    if is_initialized() or hasattr(_tls, "is_initializing"):
        return
    with _initialization_lock:
        if is_initialized():
            return
        if _is_in_bad_fork():
            raise RuntimeError(
                "Cannot re-initialize neuron in forked subprocess. To use neuron with "
                "multiprocessing, you must use the 'spawn' start method"
            )
        _C._init()
        _tls.is_initializing = True
        try:
            for call, origin in _queued_calls:
                try:
                    call()
                except Exception as e:  # pragma: no cover
                    raise RuntimeError(
                        f"neuron call failed lazily at initialization with error: {e}\n\n"
                        f"neuron call was originally invoked at:\n\n{origin}"
                    ) from e
            _queued_calls.clear()
        finally:
            delattr(_tls, "is_initializing")
        _initialized = True


def init() -> None:
    """Initialise the neuron runtime (idempotent)."""
    _lazy_init()


def _after_fork_in_child() -> None:
    global _initialized
    # The C++ layer marks the child as a bad fork (pthread_atfork) when the
    # parent had initialised; the Python flag follows.
    _initialized = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _drain_at_exit() -> None:
    # Runs before the interpreter tears down (atexit handlers registered later,
    # e.g. the user's, run first): waits for the work still queued on every
    # device, so no kernel runs while torch's C++ state is being destroyed.
    _C._drain_devices_at_exit()  # a no-op unless the backend initialised the devices


atexit.register(_drain_at_exit)


def _get_device_index(device: Any = None, optional: bool = True) -> int:
    """Index of a neuron device given as int, str, torch.device or None (current)."""
    if device is None:
        if not optional:
            raise ValueError("Expected a neuron device, got None")
        return _C._get_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"Expected a neuron device, but got: {device}")
        return _C._get_device() if device.index is None else device.index
    if isinstance(device, int):
        return _C._get_device() if device < 0 else device
    raise ValueError(f"Expected a neuron device (int, str or torch.device), got {device!r}")


def current_device() -> int:
    """Index of the calling thread's current neuron device."""
    _lazy_init()
    return int(_C._get_device())


def set_device(device: Any) -> None:
    """Set the calling thread's current neuron device."""
    idx = _get_device_index(device)
    _lazy_init()
    _C._set_device(idx)


class device:
    """Context manager that changes the current neuron device."""

    def __init__(self, device: Any):
        self.idx = -1 if device is None else _get_device_index(device)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            _lazy_init()
            self.prev_idx = _C._exchange_device(self.idx)
        return self

    def __exit__(self, *args: Any) -> bool:
        if self.idx >= 0:
            _C._exchange_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "neuron" else None)


def synchronize(device: Any = None) -> None:
    """Wait for all work queued on every stream of a neuron device."""
    _lazy_init()
    _C._synchronize(_get_device_index(device))


class _DeviceProperties:
    def __init__(self, index: int, props: dict):
        self.index = index
        self.name = props["name"]
        self.total_memory = int(props["total_memory"])
        self.compute_threads = props["compute_threads"]
        self.executor_threads = props["executor_threads"]
        self.physical_core = props["physical_core"]
        self.stream_priority_range = (
            props["stream_priority_least"],
            props["stream_priority_greatest"],
        )

    @property
    def peak_flops_fp32(self) -> float:
        """FLOP/s of this device's float32 matmul, measured once per process (for MFU)."""
        from ._peak_flops import peak_flops

        return peak_flops(self.index, torch.float32)

    @property
    def peak_flops_bf16(self) -> float:
        """FLOP/s of this device's bfloat16 matmul, measured once per process (for MFU)."""
        from ._peak_flops import peak_flops

        return peak_flops(self.index, torch.bfloat16)

    def __repr__(self) -> str:
        return (
            f"_NeuronDeviceProperties(name='{self.name}', total_memory="
            f"{self.total_memory // (1024 * 1024)}MB, compute_threads={self.compute_threads}, "
            f"physical_core={self.physical_core})"
        )


def get_device_properties(device: Any = None) -> _DeviceProperties:
    _lazy_init()
    idx = _get_device_index(device)
    if not 0 <= idx < device_count():
        raise AssertionError(f"Invalid neuron device index {idx}")
    return _DeviceProperties(idx, _C._get_device_properties(idx))


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """(major, minor) of the NeuronCore generation the software chip models."""
    get_device_properties(device)
    return (2, 0)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16, torch.float32]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def is_neuron_runtime_initialized() -> bool:
    return is_initialized()


def _sleep(microseconds: int) -> None:
    """Queue a kernel that keeps the current stream busy for ``microseconds``."""
    _lazy_init()
    _C._sleep(int(microseconds))
