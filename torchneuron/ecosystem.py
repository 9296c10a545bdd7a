"""Calls that tools of the ecosystem lack a hook for (README, "The ecosystem").

``max_memory()`` is the memory budget Hugging Face's ``device_map="auto"``
needs: accelerate's ``get_max_memory`` probes CUDA, NPU, XPU, MLU, MUSA, SDAA
and HPU by name and has no branch for ``neuron`` (nor a generic one through
``torch.accelerator``), so ``from_pretrained(..., device_map="auto")`` alone
places every weight on the CPU. Passing this budget gives the placement by
free memory that ``"auto"`` gives on CUDA::

    model = AutoModelForCausalLM.from_pretrained(
        path, device_map="auto", max_memory=torchneuron.ecosystem.max_memory())
"""
from __future__ import annotations

import torch


def _host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def max_memory(include_cpu: bool = True) -> dict[int | str, int]:
    """Bytes each neuron device can still take, keyed as accelerate keys devices.

    A device's budget is its free arena memory plus what its caching allocator
    holds unused (what transformers adds for CUDA's allocator); ``"cpu"`` is
    the host's available memory, the offload budget accelerate gives CUDA.
    """
    budget: dict[int | str, int] = {}
    for index in range(torch.neuron.device_count()):
        free, _total = torch.neuron.mem_get_info(index)
        cached = torch.neuron.memory_reserved(index) - torch.neuron.memory_allocated(index)
        budget[index] = int(free + max(cached, 0))
    if include_cpu:
        host = _host_available_bytes()
        if host is not None:
            budget["cpu"] = host
    return budget


__all__ = ["max_memory"]
