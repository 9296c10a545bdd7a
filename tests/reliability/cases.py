"""The bad-input table of the reliability suite: each case does one thing a
hostile or careless user does through the public Python API, and says what
must happen — what CPU does for the same call (`cpu`: the same exception type,
or if CPU succeeds the same result bit for bit), or what CUDA does where CPU
has no counterpart (`raises`: exception type and a message fragment; `ok`: it
succeeds and a check holds). Never a crash, a hang or a silent wrong answer.

A case is Case(name, fn, expect): fn(device) -> value, device "neuron" or
"cpu". run.py runs them in worker processes and checks the device after each.
"""
from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch

N = "neuron"


@dataclass
class Case:
    name: str
    fn: Callable[[str], Any]
    # ("cpu",) | ("raises", exc_types, fragment) | ("ok", check(value) -> str|None)
    expect: tuple
    # Run in a forked child with a runtime of its own: for cases that corrupt
    # the allocator while their bug is open (a later free aborts the process at
    # an unrelated case), so a crash is charged to the case that caused it.
    isolate: bool = False


CASES: list[Case] = []


def case(name, expect, isolate=False):
    def deco(fn):
        CASES.append(Case(name, fn, expect, isolate))
        return fn
    return deco


def cpu():
    return ("cpu",)


def raises(types, fragment=None):
    return ("raises", types if isinstance(types, tuple) else (types,), fragment)


def ok(check=None):
    return ("ok", check or (lambda v: None))


def ndev():
    return torch.neuron.device_count()


# ---------------------------------------------------------------------------
# Factories.

for _n, _f in {
    "empty_negative": lambda d: torch.empty(-1, device=d),
    "empty_negative_2d": lambda d: torch.empty(3, -2, device=d),
    "zeros_negative": lambda d: torch.zeros((2, -5), device=d),
    "full_negative": lambda d: torch.full((-1,), 2.0, device=d),
    "empty_numel_overflow": lambda d: torch.empty(2**40, 2**40, device=d),
    "empty_int64_max": lambda d: torch.empty(2**63 - 1, dtype=torch.uint8, device=d),
    "ones_size_not_int": lambda d: torch.ones(2.5, device=d),
    "randn_int_dtype": lambda d: torch.randn(3, dtype=torch.int64, device=d),
    "rand_bool_dtype": lambda d: torch.rand(3, dtype=torch.bool, device=d),
    "randint_low_ge_high": lambda d: torch.randint(5, 5, (3,), device=d),
    "randperm_negative": lambda d: torch.randperm(-3, device=d),
    "arange_zero_step": lambda d: torch.arange(0, 10, 0, device=d),
    "arange_wrong_sign": lambda d: torch.arange(0, 10, -1, device=d),
    "arange_nan": lambda d: torch.arange(0, float("nan"), device=d),
    "arange_inf": lambda d: torch.arange(0, float("inf"), device=d),
    "linspace_negative_steps": lambda d: torch.linspace(0, 1, -1, device=d),
    "logspace_negative_steps": lambda d: torch.logspace(0, 1, -2, device=d),
    "eye_negative": lambda d: torch.eye(-1, device=d),
    "full_value_overflows_dtype": lambda d: torch.full((2,), 300, dtype=torch.uint8, device=d),
    "tensor_ragged": lambda d: torch.tensor([[1, 2], [3]], device=d),
    "empty_strided_negative_stride": lambda d: torch.empty_strided((2, 2), (-1, 1), device=d),
    "empty_strided_len_mismatch": lambda d: torch.empty_strided((2, 2), (1,), device=d),
    "zeros_dtype_string": lambda d: torch.zeros(2, dtype="float32", device=d),
    "linspace_ok": lambda d: torch.linspace(-3, 7, 11, device=d),
    "arange_float_ok": lambda d: torch.arange(0, 1, 0.1, device=d),
    "full_like_ok": lambda d: torch.full_like(torch.zeros(3, 2, device=d), 7.5),
    "tensor_from_list_ok": lambda d: torch.tensor([[1.5, -2.0], [3.25, 0.0]], device=d),
}.items():
    case(f"factory.{_n}", cpu())(_f)


@case("factory.empty_huge_oom", raises(torch.OutOfMemoryError, "out of memory"))
def _(d):
    # CUDA: torch.OutOfMemoryError; the device must stay usable afterwards.
    return torch.empty(2**50, dtype=torch.uint8, device=d)


@case("factory.pin_memory_on_device", raises(RuntimeError, "pinned"))
def _(d):
    # CUDA: "Only dense CPU tensors can be pinned" for a device tensor.
    return torch.empty(3, device=d, pin_memory=True)


@case("factory.bad_device_index", raises(RuntimeError, "device"))
def _(d):
    return torch.empty(3, device=f"{d}:7")


@case("factory.device_index_count", raises(RuntimeError, "device"))
def _(d):
    return torch.zeros(3, device=torch.device(d, ndev()))


@case("factory.device_negative_index", cpu())
def _(d):
    return torch.empty(3, device=f"{d}:-2")


@case("factory.device_garbage", raises(RuntimeError, "Invalid device string"))
def _(d):
    return torch.empty(3, device=f"{d}:x")


@case("factory.int8_index_overflow", raises(RuntimeError, "device"))
def _(d):
    # Device indices are int8 in c10: 300 must not wrap to a valid one.
    return torch.empty(3, device=f"{d}:300")


# ---------------------------------------------------------------------------
# Storages.

for _n, _f in {
    "untyped_negative": lambda d: torch.UntypedStorage(-1, device=d),
    "untyped_negative_511": lambda d: torch.UntypedStorage(-511, device=d),
    "resize_negative": lambda d: torch.zeros(4, device=d).untyped_storage().resize_(-1),
    "resize_negative_255": lambda d: torch.zeros(4, device=d).untyped_storage().resize_(-255),
    "tensor_resize_negative": lambda d: torch.zeros(4, device=d).resize_(-2),
    "untyped_ok_zero": lambda d: torch.UntypedStorage(0, device=d).nbytes(),
    "resize_grow_keeps_prefix": lambda d: _resize_grow(d),
}.items():
    case(f"storage.{_n}", cpu(), isolate="negative" in _n)(_f)


def _resize_grow(d):
    t = torch.arange(6.0, device=d)
    t.resize_(12)
    return t[:6].clone()


@case("storage.untyped_huge", raises(RuntimeError))
def _(d):
    # CPU: RuntimeError (cannot allocate); CUDA: torch.OutOfMemoryError (a RuntimeError).
    return torch.UntypedStorage(2**60, device=d)


@case("storage.negative_does_not_alias", ok(), isolate=True)
def _(d):
    # The class of the example: a storage made with a negative size
    # must not share bytes with the next allocation.
    try:
        s = torch.UntypedStorage(-256, device=d)
    except RuntimeError:
        return None
    t = torch.zeros(64, dtype=torch.uint8, device=d)
    s.fill_(7)
    if t.cpu().sum().item() != 0:
        raise AssertionError("a negative-size storage aliased another tensor")
    raise AssertionError("a negative-size storage was accepted")


# ---------------------------------------------------------------------------
# Views.

for _n, _f in {
    "as_strided_out_of_bounds": lambda d: torch.zeros(4, device=d).as_strided((10,), (1,)),
    "as_strided_offset_out_of_bounds": lambda d: torch.zeros(4, device=d).as_strided((2,), (1,), 3),
    "as_strided_negative_stride": lambda d: torch.zeros(4, device=d).as_strided((2,), (-1,)),
    "as_strided_negative_offset": lambda d: torch.zeros(4, device=d).as_strided((2,), (1,), -1),
    "as_strided_huge_stride": lambda d: torch.zeros(4, device=d).as_strided((2,), (2**62,)),
    # CPU grows the storage (the new bytes are uninitialised): compare what is defined.
    "set_beyond_storage": lambda d: _set_beyond(d, 0, (100,)),
    "set_offset_beyond_storage": lambda d: _set_beyond(d, 8, (1,)),
    "view_bad_shape": lambda d: torch.zeros(6, device=d).view(4, 2),
    "view_incompatible_strides": lambda d: torch.zeros(4, 6, device=d).t().view(24),
    "narrow_out_of_range": lambda d: torch.zeros(4, device=d).narrow(0, 3, 2),
    "select_out_of_range": lambda d: torch.zeros(4, device=d).select(0, 4),
    "index_out_of_range": lambda d: torch.zeros(4, device=d)[torch.tensor([5])],
    "unfold_bad_step": lambda d: torch.zeros(8, device=d).unfold(0, 2, 0),
    "expand_bad": lambda d: torch.zeros(2, 3, device=d).expand(3, 3),
    "as_strided_overlapping_ok": lambda d: torch.arange(6.0, device=d).as_strided((3, 3), (1, 1)).sum(1),
    "set_partial_ok": lambda d: torch.empty(0, device=d).set_(
        torch.arange(8.0, device=d).untyped_storage(), 2, (2, 2), (1, 2)) * 1,
    "transpose_contiguous_ok": lambda d: torch.arange(12.0, device=d).view(3, 4).t().contiguous(),
}.items():
    case(f"view.{_n}", cpu())(_f)


def _set_beyond(d, offset, size):
    st = torch.arange(4.0, device=d).untyped_storage()
    t = torch.empty(0, device=d).set_(st, offset, size, (1,))
    return t.shape, t.storage_offset(), st.nbytes(), t.untyped_storage().nbytes(), t.flatten()[:4 - offset].clone() if offset < 4 else None


# ---------------------------------------------------------------------------
# Copies.

def _same_device_msg():
    return raises(RuntimeError, "same device")


@case("copy.add_neuron_cpu_tensor", _same_device_msg())
def _(d):
    return torch.ones(3, device=d) + torch.ones(3)


@case("copy.add_across_devices", _same_device_msg())
def _(d):
    if ndev() < 2:
        raise RuntimeError("Expected all tensors to be on the same device (one device only)")
    return torch.ones(3, device=f"{d}:0") + torch.ones(3, device=f"{d}:1")


@case("copy.matmul_neuron_cpu", _same_device_msg())
def _(d):
    return torch.ones(3, 3, device=d) @ torch.ones(3, 3)


@case("copy.out_on_cpu", raises(RuntimeError, "device"))
def _(d):
    # CUDA: torch.add(cuda, cuda, out=cpu) raises (out= on another device).
    out = torch.empty(3)
    return torch.add(torch.ones(3, device=d), 1, out=out)


@case("copy.nonzero_out_on_cpu", raises(RuntimeError, "device"))
def _(d):
    out = torch.empty(0, dtype=torch.long)
    return torch.nonzero(torch.ones(3, device=d), out=out)


def _cross_copy(d):
    src = torch.arange(12.0).view(3, 4).t()  # non-contiguous CPU source
    dst = torch.zeros(4, 3, device=d)
    dst.copy_(src)
    back = torch.zeros(3, 4).t()             # non-contiguous CPU target
    back.copy_(dst)
    return back


for _n, _f in {
    "cross_device_noncontiguous": _cross_copy,
    "copy_broadcast": lambda d: torch.zeros(2, 3, device=d).copy_(torch.arange(3.0, device=d)),
    "copy_bad_shape": lambda d: torch.zeros(2, 3, device=d).copy_(torch.zeros(4, device=d)),
    "copy_dtype_convert": lambda d: torch.zeros(3, dtype=torch.int32, device=d).copy_(
        torch.tensor([1.7, -2.5, 1e10], device=d)),
    "copy_complex_to_float": lambda d: torch.zeros(2, device=d).copy_(
        torch.tensor([1 + 2j, 3 - 1j], device=d)),
    "copy_overlapping_self": lambda d: _overlap(d),
    "copy_expanded_target": lambda d: torch.zeros(3, device=d).expand(2, 3).copy_(
        torch.ones(2, 3, device=d)),
    "add_inplace_expanded": lambda d: torch.zeros(3, 1, device=d).expand(3, 4).add_(1),
    "index_put_overlap": lambda d: _index_put_overlap(d),
    "masked_fill_overlap": lambda d: _masked_fill_overlap(d),
    "to_dtype_nonfinite": lambda d: torch.tensor([float("nan"), float("inf")], device=d).to(torch.int32),
    "inplace_wrong_dtype": lambda d: torch.zeros(3, dtype=torch.int64, device=d).add_(1.5),
    "bool_sub": lambda d: torch.ones(3, dtype=torch.bool, device=d) - torch.ones(3, dtype=torch.bool, device=d),
    "uint64_add": lambda d: torch.ones(3, dtype=torch.uint64, device=d) + 1,
}.items():
    case(f"copy.{_n}", cpu())(_f)


# A class value out of range with num_classes given: checked by the queued kernel
# (CUDA's device-side assert), so it raises at the next synchronize, with CPU's message.
@case("copy.one_hot_bad", raises(RuntimeError, "Class values must be smaller than num_classes"))
def _one_hot_bad(d):
    out = torch.nn.functional.one_hot(torch.tensor([5], device=d), 3)
    torch.neuron.synchronize()
    return out


def _overlap(d):
    x = torch.arange(6.0, device=d)
    x[1:].copy_(x[:-1])  # partial overlap: CPU refuses
    return x


def _index_put_overlap(d):
    x = torch.arange(6.0, device=d)
    x[torch.tensor([0, 1], device=d)] = x[1:3]  # partial overlap
    return x


def _masked_fill_overlap(d):
    x = torch.zeros(3, 1, device=d).expand(3, 3)
    return x.masked_fill_(torch.ones(3, 3, dtype=torch.bool, device=d), 1.0)


# ---------------------------------------------------------------------------
# Devices.

@case("device.set_device_out_of_range", raises(RuntimeError, "device"))
def _(d):
    torch.neuron.set_device(7)


@case("device.set_device_negative_noop", ok(lambda v: None if v == 0 else f"current device {v}"))
def _(d):
    # CUDA: torch.cuda.set_device(-1) is a no-op.
    try:
        torch.neuron.set_device(-1)
    except (RuntimeError, ValueError):
        pass
    return torch.neuron.current_device()


@case("device.properties_out_of_range", raises((AssertionError, RuntimeError, ValueError)))
def _(d):
    # CUDA: AssertionError "Invalid device id".
    return torch.neuron.get_device_properties(7)


@case("device.synchronize_out_of_range", raises((RuntimeError, ValueError, AssertionError)))
def _(d):
    torch.neuron.synchronize(9)


@case("device.mem_get_info_out_of_range", raises((RuntimeError, ValueError, AssertionError)))
def _(d):
    return torch.neuron.mem_get_info(9)


@case("device.memory_stats_out_of_range", raises((RuntimeError, ValueError, AssertionError)))
def _(d):
    return torch.neuron.memory_allocated(9)


@case("device.guard_out_of_range", raises(RuntimeError, "device"))
def _(d):
    with torch.neuron.device(7):
        return torch.zeros(1, device=d)


@case("device.to_out_of_range", raises(RuntimeError, "device"))
def _(d):
    return torch.ones(2).to(f"{d}:5")


# ---------------------------------------------------------------------------
# Generators.

@case("rng.cpu_generator_on_device", raises(RuntimeError, "generator"))
def _(d):
    # CUDA: "Expected a 'cuda' device type for generator but found 'cpu'".
    return torch.randn(3, device=d, generator=torch.Generator())


@case("rng.device_generator_on_cpu", raises(RuntimeError))
def _(d):
    return torch.randn(3, generator=torch.Generator(device=d))


@case("rng.generator_bad_device", raises(RuntimeError, "device"))
def _(d):
    return torch.Generator(device=f"{d}:7").initial_seed()


@case("rng.set_state_wrong_size", raises(RuntimeError))
def _(d):
    torch.neuron.set_rng_state(torch.zeros(5, dtype=torch.uint8))


@case("rng.set_state_wrong_dtype", raises((RuntimeError, TypeError)))
def _(d):
    g = torch.Generator(device=d)
    g.set_state(torch.zeros(g.get_state().numel(), dtype=torch.float32))


@case("rng.set_state_on_device_tensor", raises((RuntimeError, TypeError)))
def _(d):
    g = torch.Generator(device=d)
    g.set_state(g.get_state().to(d))


@case("rng.manual_seed_overflow", cpu())
def _(d):
    return torch.Generator(device=d).manual_seed(2**70)


@case("rng.state_roundtrip_ok", ok(lambda v: None if v else "replay differs"))
def _(d):
    g = torch.Generator(device=d).manual_seed(3)
    s = g.get_state()
    a = torch.randn(5, device=d, generator=g).cpu()
    g.set_state(s)
    b = torch.randn(5, device=d, generator=g).cpu()
    return torch.equal(a, b)


# ---------------------------------------------------------------------------
# Streams and events.

def _prio_in_range(v):
    return None if -10 <= v <= 0 else f"priority {v} not clamped"


@case("stream.priority_very_high", ok(_prio_in_range))
def _(d):
    # CUDA clamps any priority into the device's range.
    return torch.neuron.Stream(priority=-100).priority


@case("stream.priority_very_low", ok(lambda v: None if v == 0 else f"priority {v}"))
def _(d):
    return torch.neuron.Stream(priority=100).priority


@case("stream.priority_int_min", ok(_prio_in_range))
def _(d):
    return torch.neuron.Stream(priority=-2**31).priority


@case("stream.priority_overflow", raises((RuntimeError, OverflowError, TypeError, ValueError)))
def _(d):
    return torch.neuron.Stream(priority=2**70)


@case("stream.bad_device", raises((RuntimeError, ValueError), "device"))
def _(d):
    return torch.neuron.Stream(device=7)


# torch.cuda.Event raises RuntimeError; the generic torch.Event (which
# torch.neuron.Event is, as for any accelerator) raises ValueError.
EVENT_ERRORS = (RuntimeError, ValueError)


@case("event.elapsed_not_recorded", raises(EVENT_ERRORS, "record"))
def _(d):
    # CUDA: "Both events must be recorded before calculating elapsed time."
    a, b = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    return a.elapsed_time(b)


@case("event.elapsed_without_timing", raises(EVENT_ERRORS, "timing"))
def _(d):
    a, b = torch.neuron.Event(), torch.neuron.Event()
    a.record()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


@case("event.elapsed_one_recorded", raises(EVENT_ERRORS, "record"))
def _(d):
    a, b = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    a.record()
    return a.elapsed_time(b)


@case("event.query_before_record", ok(lambda v: None if v is True else f"query {v}"))
def _(d):
    # CUDA: an event never recorded counts as complete.
    return torch.neuron.Event().query()


@case("event.sync_before_record_ok", ok())
def _(d):
    torch.neuron.Event().synchronize()


@case("event.wait_before_record_ok", ok())
def _(d):
    torch.neuron.current_stream().wait_event(torch.neuron.Event())
    return torch.ones(2, device=d).sum().item()


@case("event.elapsed_ok", ok(lambda v: None if v >= 0 else f"elapsed {v}"))
def _(d):
    a, b = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    a.record()
    torch.neuron._sleep(1000)
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


@case("stream.wait_other_device_stream_ok", ok())
def _(d):
    if ndev() < 2:
        return None
    # Device 0's stream waits on a busy stream of device 1; an event after
    # the wait may only complete once device 1's work has. (Reading x on
    # device 1's own current stream would need that stream to wait too, as
    # with CUDA: x.sum() there is not ordered after s1 by device 0's wait.)
    s1 = torch.neuron.Stream(device=1)
    with torch.neuron.stream(s1):
        torch.neuron._sleep(20000)
        x = torch.ones(4, device=f"{d}:1") * 2
    waiter = torch.neuron.current_stream(0)
    waiter.wait_stream(s1)
    after = torch.neuron.Event()
    after.record(waiter)
    after.synchronize()
    if not s1.query():
        raise AssertionError("device 0's stream passed its wait before device 1's stream finished")
    torch.neuron.current_stream(1).wait_stream(s1)
    if x.sum().item() != 8:
        raise AssertionError("cross-device wait lost the result")


# ---------------------------------------------------------------------------
# Serialization.

def _saved(t):
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def _truncated(d, frac):
    data = _saved(torch.arange(64.0, device=d))
    return torch.load(io.BytesIO(data[: int(len(data) * frac)]), weights_only=True)


for _frac in (0.1, 0.5, 0.9):
    case(f"serialize.truncated_{int(_frac * 100)}", cpu())(lambda d, f=_frac: _truncated(d, f))


@case("serialize.garbage", cpu())
def _(d):
    return torch.load(io.BytesIO(b"\x80\x02not a checkpoint" * 10), weights_only=True)


@case("serialize.map_location_bad_index", raises(RuntimeError, "device"))
def _(d):
    # CUDA: "Attempting to deserialize object on CUDA device 7 but device_count() is ...".
    data = _saved(torch.arange(4.0, device=d))
    return torch.load(io.BytesIO(data), map_location=f"{d}:7", weights_only=True)


@case("serialize.map_location_garbage", raises(RuntimeError))
def _(d):
    data = _saved(torch.arange(4.0))
    return torch.load(io.BytesIO(data), map_location="nosuchdevice:0", weights_only=True)


@case("serialize.roundtrip_view_ok", cpu())
def _(d):
    base = torch.arange(12.0, device=d)
    data = _saved({"a": base[2:8].view(2, 3), "b": base})
    got = torch.load(io.BytesIO(data), weights_only=True)
    if got["a"].device.type != torch.device(d).type:
        raise AssertionError(f"loaded on {got['a'].device}")
    return got["a"].cpu() + got["b"].cpu()[:1]


class _LongView:
    """Pickles as a tensor view longer than its storage (a crafted file)."""

    def __init__(self, storage):
        self.storage = storage

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, (1000,), (1,), False, OrderedDict()))


@case("serialize.view_longer_than_storage", cpu())
def _(d):
    # CPU refuses (the view would read past its storage); so must neuron,
    # not hand out the bytes of whatever lies behind the storage.
    st = torch.storage.TypedStorage(wrap_storage=torch.arange(4.0, device=d).untyped_storage(),
                                    dtype=torch.float32, _internal=True)
    buf = io.BytesIO()
    torch.save(_LongView(st), buf)
    t = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    return t.sum()


# ---------------------------------------------------------------------------
# Environment configuration: each in a fresh child process (the runtime reads
# its configuration once). (variable, value, expectation):
#   "bad": device_count() is 0 or raises (never negative) and the first device
#          use raises RuntimeError naming the variable (not an out-of-memory
#          error that happens to mention it);
#   N (int): accepted, device_count() == N and the device computes.
ENV_CASES = [
    ("NEURON_RT_NUM_CORES", "abc", "bad"),
    ("NEURON_RT_NUM_CORES", "-1", "bad"),
    ("NEURON_RT_NUM_CORES", "128", "bad"),
    ("NEURON_RT_NUM_CORES", "300", "bad"),
    ("NEURON_RT_NUM_CORES", "1", 1),
    ("NEURON_RT_VISIBLE_CORES", "7", "bad"),
    ("NEURON_RT_VISIBLE_CORES", "0,0", "bad"),
    ("NEURON_RT_VISIBLE_CORES", "1-0", "bad"),
    ("NEURON_RT_VISIBLE_CORES", "1", 1),
    ("NEURON_RT_MEMORY_PER_CORE", "12Q", "bad"),
    ("NEURON_RT_MEMORY_PER_CORE", "1M", "bad"),
    ("NEURON_RT_MEMORY_PER_CORE", "99999999999T", "bad"),
    ("NEURON_RT_EXECUTOR_THREADS", "0", "bad"),
    ("NEURON_RT_EXECUTOR_THREADS", "100000", "bad"),
    ("NEURON_RT_COMPUTE_THREADS", "0", "bad"),
    ("NEURON_RT_QUEUE_DEPTH", "10", "bad"),
    ("NEURON_LAUNCH_BLOCKING", "2", "bad"),
]
