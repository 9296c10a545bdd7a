"""``torch_neuronx``: AWS TorchNeuron's documented top-level API, on torchneuron.

Scripts written for AWS's package (``import torch_neuronx``, its memory and
op-tracking functions, ``torch.compile(backend="neuron")`` through
``torch_neuronx.neuron_dynamo_backend``) run unchanged, and tools that test for
the module (Hugging Face accelerate and transformers) treat the device as
AWS's ``neuron``. ``torchneuron._coexistence`` makes this module answer to the
name ``torch_neuronx``; which package a process uses is decided there.

``nki_op`` is torchneuron's (the same decorator over ``torch.library.custom_op``;
the kernels it launches are C++ against torchneuron's kernel ABI, as NKI is
Trainium's language). Not provided: ``wrap_nki`` (NKI's own higher-order op)
and the pre-release ``NeuronProfiler`` (``torch.profiler`` with
``ProfilerActivity.PrivateUse1`` records the device timeline).
"""
from __future__ import annotations

import torch

import torchneuron as _torchneuron

from . import neuron_dynamo_backend  # noqa: F401
from .neuron_dynamo_backend import get_dynamo_metrics, reset_dynamo_metrics

__version__ = f"{_torchneuron.__version__}+torchneuron"

# Allocator statistics, also under torch.neuron.
memory_stats = torch.neuron.memory_stats
memory_allocated = torch.neuron.memory_allocated
max_memory_allocated = torch.neuron.max_memory_allocated
memory_reserved = torch.neuron.memory_reserved
max_memory_reserved = torch.neuron.max_memory_reserved
reset_peak_memory_stats = torch.neuron.reset_peak_memory_stats
reset_accumulated_memory_stats = torch.neuron.reset_accumulated_memory_stats
memory_summary = torch.neuron.memory_summary
empty_cache = torch.neuron.empty_cache

# Execution control.
synchronize = torch.neuron.synchronize
Stream = torch.neuron.Stream
Event = torch.neuron.Event
is_neuron_runtime_initialized = _torchneuron.is_neuron_runtime_initialized

# Custom kernels as PyTorch ops.
nki_op = _torchneuron.nki_op

# Op tracking: which ops ran, and which ran on the synchronous path.
get_executed_ops = _torchneuron.get_executed_ops
get_fallback_ops = _torchneuron.get_fallback_ops
clear_op_tracking = _torchneuron.clear_op_tracking

_NOT_PROVIDED = {
    "wrap_nki": "NKI kernels are Trainium's; torchneuron's software NeuronCore has no NKI "
                "compiler (torch_neuronx.nki_op takes C++ kernels: torchneuron.kernels)",
    "NeuronProfiler": "use torch.profiler.profile(activities=[ProfilerActivity.CPU, "
                      "ProfilerActivity.PrivateUse1]): it records the neuron device timeline",
}


def _autoload() -> None:
    """AWS's ``torch.backends`` entry point name; torchneuron registered at import."""


def __getattr__(name: str):
    if name in _NOT_PROVIDED:
        raise AttributeError(
            f"torch_neuronx.{name} is not provided by torchneuron's torch_neuronx "
            f"compatibility module: {_NOT_PROVIDED[name]}")
    raise AttributeError(f"module 'torch_neuronx' has no attribute '{name}'")


__all__ = [
    "Event", "Stream", "clear_op_tracking", "empty_cache", "get_dynamo_metrics",
    "get_executed_ops", "get_fallback_ops", "is_neuron_runtime_initialized",
    "max_memory_allocated", "nki_op", "max_memory_reserved", "memory_allocated", "memory_reserved",
    "memory_stats", "memory_summary", "reset_accumulated_memory_stats",
    "reset_dynamo_metrics", "reset_peak_memory_stats", "synchronize",
]
