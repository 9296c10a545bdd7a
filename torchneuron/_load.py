"""Registers the ``neuron`` device with PyTorch: the body of ``import torchneuron``.

Run once, by the package's ``__init__`` when this process is to use torchneuron
(see ``_coexistence``).
"""
from __future__ import annotations

import torch

_BACKEND_NAME = "neuron"


def _check_privateuse1_slot() -> None:
    """Fail clearly when another backend holds PyTorch's single PrivateUse1 slot."""
    claimed = torch._C._get_privateuse1_backend_name()
    if claimed not in ("privateuseone", _BACKEND_NAME):
        raise RuntimeError(
            f"torchneuron cannot register the '{_BACKEND_NAME}' device: PyTorch's PrivateUse1 "
            f"backend slot is already claimed by the backend '{claimed}'. A process can load "
            f"only one PrivateUse1 backend; import torchneuron in a process without it, or "
            f"disable backend autoloading with TORCH_DEVICE_BACKEND_AUTOLOAD=0."
        )
    existing = getattr(torch, _BACKEND_NAME, None)
    if existing is not None and getattr(existing, "__name__", "") != "torchneuron.neuron":
        raise RuntimeError(
            f"torchneuron cannot register torch.{_BACKEND_NAME}: it is already provided by "
            f"'{getattr(existing, '__name__', existing)}' (another neuron backend). Use one "
            f"backend per process."
        )


_check_privateuse1_slot()

# Loads libtorchneuron_backend.so: guard, hooks, allocators, kernels.
from . import _C  # noqa: E402

if torch._C._get_privateuse1_backend_name() != _BACKEND_NAME:
    torch.utils.rename_privateuse1_backend(_BACKEND_NAME)

from . import neuron  # noqa: E402

if not hasattr(torch, _BACKEND_NAME):
    torch._register_device_module(_BACKEND_NAME, neuron)
from . import _global_state, _serialization, _storage  # noqa: E402

_storage.install(neuron)
_serialization.install()
_global_state.install()

if not hasattr(torch.Tensor, _BACKEND_NAME):
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )

from . import _multiprocessing  # noqa: E402

_multiprocessing.register_reducers()

# FlexAttention's hard-coded device list (the one shim of torch; see the file).
from . import _flex_attention_shim  # noqa: E402

_flex_attention_shim.install()

# torch.distributed's "neuron" backend (C++ in csrc/distributed).
from . import distributed  # noqa: E402

distributed.register()

from .neuron import (  # noqa: E402,F401
    Event,
    Stream,
    current_stream,
    device_count,
    empty_cache,
    is_available,
    is_neuron_runtime_initialized,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    synchronize,
)


from ._tracking import (  # noqa: E402,F401
    clear_host_waits,
    clear_op_tracking,
    get_executed_ops,
    get_fallback_ops,
    get_fusion_stats,
    get_host_waits,
    get_inline_ops,
    get_op_paths,
    get_result_copies,
    host_wait_counts,
    is_fusion_enabled,
    set_fusion_enabled,
)


from .kernels import nki_op  # noqa: E402,F401

__all__ = [
    "nki_op", "Event", "Stream", "clear_op_tracking", "current_stream", "device_count",
    "empty_cache", "get_executed_ops", "get_fallback_ops", "get_op_paths", "get_result_copies",
    "get_inline_ops", "get_host_waits", "host_wait_counts", "clear_host_waits",
    "is_available", "is_neuron_runtime_initialized", "max_memory_allocated",
    "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_stats",
    "memory_summary", "reset_accumulated_memory_stats", "reset_peak_memory_stats",
    "synchronize", "get_fusion_stats", "set_fusion_enabled", "is_fusion_enabled",
]
