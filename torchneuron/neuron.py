"""The ``torch.neuron`` device module (shaped like ``torch.cuda``).

Registered with ``torch._register_device_module('neuron', ...)`` when
torchneuron is imported (or autoloaded by torch).
"""
from __future__ import annotations

import sys
from typing import Any

from ._device import (  # noqa: F401
    _get_device_index,
    _is_in_bad_fork,
    _lazy_call,
    _lazy_init,
    _sleep,
    current_device,
    device,
    device_count,
    device_of,
    get_amp_supported_dtype,
    get_device_capability,
    get_device_name,
    get_device_properties,
    init,
    is_available,
    is_bf16_supported,
    is_initialized,
    is_neuron_runtime_initialized,
    set_device,
    synchronize,
)
from ._memory import (  # noqa: F401
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
)
from . import memory  # noqa: F401  (torch.neuron.memory, like torch.cuda.memory)
from .memory import memory_snapshot  # noqa: F401
from ._random import (  # noqa: F401
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from ._tracking import get_sync_debug_mode, set_sync_debug_mode  # noqa: F401
from ._streams import (  # noqa: F401
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    query,
    record_event,
    set_stream,
    stream,
    wait_event,
    wait_stream,
)


# `import torch.neuron.memory` / `from torch.neuron.memory import ...` find the
# submodule here: torch.neuron is this module, not a package.
sys.modules.setdefault("torch.neuron.memory", memory)


def __getattr__(name: str) -> Any:
    # `_initialized` is read as a module attribute by torch (checkpointing,
    # DeviceMesh); it must follow the live state.
    if name == "_initialized":
        from . import _device

        return _device.is_initialized()
    # Inductor looks these up to register the device: the lookup registers
    # neuron with Inductor (torchneuron/compiler; it imports Inductor, so only
    # when Inductor asks).
    from .compiler import INDUCTOR_LOOKUPS, registration_lookup

    if name in INDUCTOR_LOOKUPS:
        return registration_lookup(name)
    raise AttributeError(f"module 'torch.neuron' has no attribute '{name}'")


__all__ = [
    "Event", "Stream", "StreamContext", "current_device", "current_stream",
    "default_stream", "device", "device_count", "device_of", "empty_cache",
    "get_amp_supported_dtype", "get_device_capability", "get_device_name",
    "get_device_properties", "get_rng_state", "get_rng_state_all", "init",
    "initial_seed", "is_available", "is_bf16_supported", "is_initialized",
    "manual_seed", "manual_seed_all", "max_memory_allocated", "max_memory_reserved",
    "mem_get_info", "memory_allocated", "memory_reserved", "memory_snapshot",
    "memory_stats", "memory_summary", "reset_accumulated_memory_stats", "reset_peak_memory_stats",
    "seed", "seed_all", "set_device", "set_rng_state", "set_rng_state_all",
    "set_stream", "stream", "synchronize", "query", "record_event", "wait_event",
    "wait_stream", "set_sync_debug_mode", "get_sync_debug_mode",
]
