"""Caching allocator statistics and control for ``torch.neuron``.

The allocator lives in C++ (a ``c10::DeviceAllocator``), so these functions
are thin wrappers over ``torch.accelerator``'s memory API with CUDA's names
and key layout (``allocated_bytes.all.current`` ...).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from . import _device


def _index(device: Any) -> int:
    _device._lazy_init()
    return _device._get_device_index(device)


def memory_stats(device: Any = None) -> "OrderedDict[str, Any]":
    return torch.accelerator.memory_stats(_index(device))


def memory_allocated(device: Any = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def reset_max_memory_allocated(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    """Release every cached, unused block of every neuron device to the runtime."""
    if _device.is_initialized():
        torch.accelerator.empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device's memory arena."""
    return torch.accelerator.get_memory_info(_index(device))


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    stats = memory_stats(device)

    def fmt(n: int) -> str:
        for unit in ("B", "KiB", "MiB", "GiB"):
            if abs(n) < 1024 or unit == "GiB":
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
            n /= 1024
        return str(n)

    lines = [f"neuron memory summary, device {_index(device)}"]
    for key in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"):
        cur = stats.get(f"{key}.all.current", 0)
        peak = stats.get(f"{key}.all.peak", 0)
        lines.append(f"  {key:<16} current {fmt(cur):>12}   peak {fmt(peak):>12}")
    for key in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free"):
        lines.append(f"  {key:<16} {stats.get(key, 0)}")
    return "\n".join(lines)
