"""What really happened on the device: op paths and host waits.

Every op records the path it took (``get_op_paths``), and every time the host
thread blocked on device work the backend records why, with the Python stack
that caused it (``get_host_waits``). ``set_sync_debug_mode`` makes such waits
warn or raise where they happen, as ``torch.cuda.set_sync_debug_mode`` does.
"""
from __future__ import annotations

from typing import Union

from . import _C

_MODES = {"default": 0, "warn": 1, "error": 2}


def get_op_paths() -> dict[str, dict[str, int]]:
    """Every op run on neuron since the last clear, with counts per path.

    ``native``: a dedicated kernel (factories, views, copies, whether queued or
    metadata only); ``async``: queued on the stream by the asynchronous generic
    path; ``inline``: run on the host thread after waiting for the stream (the
    first call of an argument kind, verified inline); ``fallback``: the
    synchronous generic path (waits for the stream, then runs the CPU kernel on
    device memory). The host waits behind ``inline`` and ``fallback`` are listed
    with their cause by ``get_host_waits``.
    """
    return dict(_C._executed_ops())


def get_executed_ops() -> dict[str, int]:
    """Ops run on neuron since the last clear, with how many times each ran."""
    return {op: sum(rec.values()) for op, rec in _C._executed_ops().items()}


def get_result_copies() -> dict[str, int]:
    """Per op, how many of its results the device copied into their outputs
    since the last clear: the op's kernel computed them in other memory (on
    the generic path, a result neither computed in its output's memory nor
    adopted as device memory), and a pass over each result's bytes followed
    that the op did not ask for. Ops with no copies are left out; the
    copies a ``.to()``/``copy_`` asks for are not these."""
    return dict(_C._result_copies())


def get_fallback_ops() -> list[str]:
    """Ops that ran on the synchronous path since the last clear, sorted."""
    return sorted(op for op, rec in _C._executed_ops().items() if rec["fallback"] > 0)


def get_inline_ops() -> list[str]:
    """Ops that ran inline on the host (after a wait) since the last clear, sorted."""
    return sorted(op for op, rec in _C._executed_ops().items() if rec["inline"] > 0)


def clear_op_tracking() -> None:
    """Forget the ops, fusion passes and host waits recorded so far."""
    _C._clear_op_tracking()
    _C._clear_fusion_stats()
    _C._clear_host_waits()


def get_fusion_stats() -> dict:
    """What ran fused since the last clear (README, "Adaptive eager fusion").

    ``{"passes": fused passes, "ops": ops they held, "by_op": {op: count},
    "blocked_list_passes": passes of foreach ops that walked each list index's
    tensors block by block, "list_loop_ops": ops of list passes computed in
    the pass's own loops instead of their CPU kernels (csrc/aten/ListLoop.h),
    "flat_loop_ops": float32 add/sub/mul/div of one size queued as a loop's
    step, "broadcast_loop_ops": the same ops with an operand broadcast along
    one run of dims, queued as a repeat step (csrc/aten/LoopStep.h)}``:
    passes are counted when they ran on the device (after a synchronize, all
    of them), loop steps when they were queued.
    An op counted here is also counted as ``async`` in ``get_op_paths()``.
    """
    return dict(_C._fusion_stats())


def set_fusion_enabled(enabled: bool) -> None:
    """Turn adaptive eager fusion on or off for ops queued from now on.

    On by default; ``TORCHNEURON_FUSION=0`` starts a process with it off.
    Fused and unfused results are bitwise equal: this is a debugging aid.
    """
    _C._set_fusion_enabled(bool(enabled))


def is_fusion_enabled() -> bool:
    """Whether ops queued now may run fused."""
    return bool(_C._fusion_enabled())


def get_host_waits() -> list[dict]:
    """The host waits since the last clear, oldest first (the newest 4096 kept).

    Each is ``{"cause", "op", "stack"}``: ``cause`` is one of ``synchronize``
    (asked for by the user), ``scalar_read`` (``.item()``, printing),
    ``copy_to_host``, ``copy_from_host`` (a blocking upload), ``data_dependent``
    (an op whose output shape depends on data), ``sync_path`` (an op without an
    asynchronous kernel), ``verification`` (the first call of an argument kind),
    ``allocator``, ``launch_queue`` (a launch found its stream holding
    ``NEURON_RT_QUEUE_DEPTH`` queued items, and waited for half of them, as a
    CUDA launch waits for a full launch queue; recorded, never flagged by the
    sync debug mode) or ``other``; ``op`` names what waited; ``stack`` is the Python
    stack as ``(filename, line, function)`` tuples, innermost last.
    """
    return list(_C._host_waits())


def host_wait_counts() -> dict[str, int]:
    """How many host waits of each cause since the last clear (never capped)."""
    return {k: v for k, v in _C._host_wait_counts().items() if v}


def clear_host_waits() -> None:
    _C._clear_host_waits()


def set_sync_debug_mode(debug_mode: Union[int, str]) -> None:
    """Warn (``"warn"``/1) or raise (``"error"``/2) at every host wait on the
    device that the user did not ask for by synchronizing; ``"default"``/0: off.
    Same names and numbers as ``torch.cuda.set_sync_debug_mode``."""
    if isinstance(debug_mode, str):
        if debug_mode not in _MODES:
            raise RuntimeError(
                f"invalid value of debug_mode {debug_mode!r}, expected one of "
                f"'default', 'warn', 'error'")
        debug_mode = _MODES[debug_mode]
    _C._set_sync_debug_mode(int(debug_mode))


def get_sync_debug_mode() -> int:
    return _C._get_sync_debug_mode()
