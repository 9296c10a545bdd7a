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
    """The allocator's statistics as a table, laid out as ``torch.cuda.memory_summary``
    (current, peak, total allocated and total freed of each metric, per pool unless
    ``abbreviated``)."""
    device = _index(device)
    stats = memory_stats(device)

    def size(n: int, pref: float) -> str:
        # As CUDA: the unit follows the first row of the metric, values truncate.
        units = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"]
        unit = units[0]
        for nxt in units[1:]:
            if pref < 768 * 1024:
                break
            unit, n, pref = nxt, n // 1024, pref / 1024
        return f"{n:6d} {unit}"

    def count(n: int, pref: float) -> str:
        units = [" ", "K", "M"]
        unit = units[0]
        for nxt in units[1:]:
            if pref < 750 * 1000:
                break
            unit, n, pref = nxt, n // 1000, pref / 1000
        return f"{n:7d} {unit} "

    def row(name: str, prefix: str, fmt, pref: dict[str, int]) -> str:
        cells = [fmt(stats.get(prefix + k, 0), pref[k]) for k in ("current", "peak", "allocated", "freed")]
        return f" {name:<21} | " + " | ".join(cells) + " "

    rule, double = "-" * 75, "=" * 75
    lines = [
        double,
        f" {'':16} PyTorch neuron memory summary, device ID {device:<15d} ",
        rule,
        f"  {'':8} neuron OOMs: {stats.get('num_ooms', 0):<12d} | {'':6} nrtMalloc retries: "
        f"{stats.get('num_alloc_retries', 0):<8d}  ",
        double,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]
    metrics = [
        ("allocated_bytes", "Allocated memory", size),
        ("active_bytes", "Active memory", size),
        ("requested_bytes", "Requested memory", size),
        ("reserved_bytes", "Reserved memory", size),
        ("inactive_split_bytes", "Non-releasable memory", size),
        ("allocation", "Allocations", count),
        ("active", "Active allocs", count),
        ("segment", "Reserved segments", count),
        ("inactive_split", "Non-releasable allocs", count),
    ]
    for key, name, fmt in metrics:
        lines.append(rule)
        pools = [("all", name)]
        if not abbreviated:
            pools += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
        pref = {k: stats.get(f"{key}.all.{k}", 0) for k in ("current", "peak", "allocated", "freed")}
        for pool, label in pools:
            lines.append(row(label, f"{key}.{pool}.", fmt, pref))
    for key, name in (("oversize_allocations", "Oversize allocations"),
                      ("oversize_segments", "Oversize segments")):
        lines.append(rule)
        lines.append(row(name, f"{key}.", count,
                         {k: stats.get(f"{key}.{k}", 0) for k in ("current", "peak", "allocated", "freed")}))
    lines.append(double)
    return "|" + "|\n|".join(lines) + "|\n"
