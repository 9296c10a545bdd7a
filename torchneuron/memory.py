"""``torch.neuron.memory``: the caching allocator's statistics, history and
snapshots, with ``torch.cuda.memory``'s names and formats.

Snapshots are the dicts ``torch.cuda.memory._snapshot`` returns, so PyTorch's
tools read them unchanged: ``python -m torch.cuda._memory_viz trace_plot
snapshot.pickle -o plot.html``, or drop the file on https://pytorch.org/memory_viz::

    torch.neuron.memory._record_memory_history(max_entries=100_000)
    train()  # ... or the code that runs out of memory
    torch.neuron.memory._dump_snapshot("snapshot.pickle")
    torch.neuron.memory._record_memory_history(enabled=None)

The allocator gathers stacks in C++ (``torch::CapturedTraceback``, Python
frames included) and symbolizes them only when a snapshot is taken.
"""
from __future__ import annotations

import atexit
import inspect
import pickle
import sys
from typing import Any

from . import _C, _device
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

__all__ = [
    "empty_cache", "max_memory_allocated", "max_memory_reserved", "mem_get_info",
    "memory_allocated", "memory_reserved", "memory_snapshot", "memory_stats",
    "memory_summary", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
    "reset_peak_memory_stats",
]


def _record_memory_history(enabled: str | bool | None = "all", *args: Any, **kwargs: Any) -> None:
    """Records the stack of every allocation and a history of the allocator's
    actions on every neuron device (``torch.cuda.memory._record_memory_history``).

    Args:
        enabled: ``None`` stops recording (and forgets the history); ``"state"``
            keeps stacks of live allocations only; ``"all"`` also keeps the
            history of alloc/free/segment/OOM events.
        context: which stacks to keep: ``None`` none, ``"state"`` of live
            allocations, ``"alloc"`` also on alloc events, ``"all"`` also on frees.
        stacks: ``"python"`` Python and TorchScript frames; ``"all"`` C++ frames too.
        max_entries: events kept per device (the newest).
        device: ignored, as on CUDA: every device records.
        clear_history: forget the events recorded so far.
        skip_actions: event kinds not to record (``"alloc"``, ``"free_requested"``,
            ``"free_completed"``, ``"segment_alloc"``, ``"segment_free"``, ``"oom"``,
            ``"snapshot"``).

    CUDA's legacy form ``_record_memory_history(True, trace_alloc_max_entries=...)``
    is accepted too. ``compile_context``, ``global_record_annotations`` and the
    pinned host allocator's history are not supported.
    """
    if isinstance(enabled, bool):
        return _record_memory_history_legacy(enabled, *args, **kwargs)
    return _record_memory_history_impl(enabled, *args, **kwargs)


def _record_memory_history_impl(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
    record_pinned_host_memory: bool = False,
    record_cuda: bool = True,
) -> None:
    if compile_context or global_record_annotations or record_pinned_host_memory:
        raise NotImplementedError(
            "torch.neuron.memory._record_memory_history: compile_context, "
            "global_record_annotations and record_pinned_host_memory are not supported "
            "on neuron; leave them False")
    if not record_cuda:
        # CUDA's "host allocator only", which neuron does not record: nothing to record.
        enabled = None
    _device._lazy_init()
    _C._memory_record_history(enabled, context, stacks, max_entries, clear_history,
                              list(skip_actions or []))
    global _stop_at_exit_registered
    if enabled is not None and not _stop_at_exit_registered:
        # Tensors freed while the interpreter finalizes must not gather Python stacks.
        atexit.register(_C._memory_record_history, None, None, "python", 1, True, [])
        _stop_at_exit_registered = True


_stop_at_exit_registered = False


def _record_memory_history_legacy(
    enabled: bool,
    record_context: bool = True,
    trace_alloc_max_entries: int = 1,
    trace_alloc_record_context: bool = False,
    device: Any = None,
    record_context_cpp: bool = False,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
    record_pinned_host_memory: bool = False,
    record_cuda: bool = True,
) -> None:
    """CUDA's pre-2.1 boolean signature, mapped to the string one."""
    if trace_alloc_record_context:
        context = "alloc"
    elif record_context:
        context = "state"
    else:
        context = None
    _record_memory_history_impl(
        ("all" if trace_alloc_max_entries > 1 else "state") if enabled else None,
        context, "all" if record_context_cpp else "python", trace_alloc_max_entries, device,
        clear_history, compile_context, global_record_annotations, skip_actions,
        record_pinned_host_memory, record_cuda)


_record_memory_history.__signature__ = inspect.signature(_record_memory_history_impl)  # type: ignore[attr-defined]


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """The allocator's state and history on every device, as
    ``torch.cuda.memory._snapshot`` returns it: ``{"segments": [...],
    "device_traces": [[...] per device]}``. ``device`` is ignored, as on CUDA."""
    _device._lazy_init()
    snapshot = _C._memory_snapshot()
    if augment_with_fx_traces:
        from torch._utils import _augment_memory_snapshot_stack_traces

        snapshot = _augment_memory_snapshot_stack_traces(snapshot)
    return snapshot


def _dump_snapshot(filename: str = "dump_snapshot.pickle",
                   augment_with_fx_traces: bool = False) -> None:
    """Pickles ``_snapshot()`` to ``filename`` for https://pytorch.org/memory_viz or
    ``python -m torch.cuda._memory_viz``."""
    snapshot = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)


def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list[dict[str, Any]]:
    """The segments of ``_snapshot()`` (``torch.cuda.memory_snapshot``)."""
    if mempool_id is not None:
        raise NotImplementedError("torch.neuron has no memory pools; pass mempool_id=None")
    return _snapshot()["segments"]
