"""Streams, priorities, thread-local current streams, events and ordering."""
import ast
import threading

import torch

import torchneuron  # noqa: F401
from conftest import LAUNCH_BLOCKING, assert_same, requires_async, run_python


def test_default_and_current_stream():
    s = torch.neuron.current_stream()
    assert s == torch.neuron.default_stream()
    assert s.stream_id == 0 and s.device_index == 0
    assert torch.accelerator.current_stream().stream_id == 0


def test_priorities_are_accepted_and_clamped():
    least, greatest = torchneuron._C._stream_priority_range(0)
    assert greatest <= least
    for prio in (-1000, -1, 0, 1, 1000):
        s = torch.neuron.Stream(priority=prio)
        assert greatest <= s.priority <= least
    assert torch.neuron.Stream(priority=-1).priority == max(greatest, -1)
    assert torch.neuron.Stream(priority=0).priority == least
    # torch.Stream (FSDP2 creates Stream(priority=-1)).
    t = torch.Stream(device="neuron", priority=-1)
    assert t.device_type == torch.neuron.Stream().device_type


def test_streams_come_from_a_round_robin_pool():
    ids = {torch.neuron.Stream().stream_id for _ in range(40)}
    assert 1 < len(ids) <= 32


def test_stream_context_sets_and_restores():
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        assert torch.accelerator.current_stream().stream_id == s.stream_id
    assert torch.neuron.current_stream().stream_id == 0
    with s:  # torch.Stream's own context manager
        assert torch.neuron.current_stream() == s
    assert torch.neuron.current_stream().stream_id == 0


def test_current_stream_is_thread_local():
    s = torch.neuron.Stream()
    seen = {}
    with torch.neuron.stream(s):
        t = threading.Thread(target=lambda: seen.setdefault("id", torch.neuron.current_stream().stream_id))
        t.start()
        t.join()
        assert torch.neuron.current_stream() == s
    assert seen["id"] == 0


@requires_async
def test_query_and_synchronize_observe_async_work():
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        torch.neuron._sleep(200_000)
    assert not s.query()
    s.synchronize()
    assert s.query()


def test_events_record_query_elapsed():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    assert isinstance(start, torch.neuron.Event) and isinstance(start, torch.Event)
    start.record()
    torch.neuron._sleep(50_000)
    end.record()
    if not LAUNCH_BLOCKING:
        assert not end.query()
    end.synchronize()
    assert end.query()
    assert start.elapsed_time(end) >= 40.0  # milliseconds


def test_wait_stream_orders_work_across_streams():
    cpu = torch.randn(100_000)
    x = cpu.to("neuron")
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    with torch.neuron.stream(s1):
        torch.neuron._sleep(100_000)
        a = x * 2  # queued behind the sleep
    s2.wait_stream(s1)
    with torch.neuron.stream(s2):
        b = a + 1
    ev = s2.record_event()
    ev.synchronize()
    assert_same(b, cpu * 2 + 1)


@requires_async
def test_event_wait_blocks_a_stream():
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    with torch.neuron.stream(s1):
        torch.neuron._sleep(100_000)
    ev = torch.neuron.Event()
    ev.record(s1)
    ev.wait(s2)
    with torch.neuron.stream(s2):
        torch.neuron._sleep(1)
    assert not s2.query()
    s2.synchronize()
    assert s1.query()


def test_async_ops_are_ordered_on_the_current_stream():
    cpu = torch.randn(1000)
    x = cpu.to("neuron")
    y = x
    for i in range(20):
        y = y * 1.5 + i
    ref = cpu
    for i in range(20):
        ref = ref * 1.5 + i
    assert_same(y, ref)


def test_streams_on_second_device(two_devices):
    s = torch.neuron.Stream(device=1)
    assert s.device_index == 1
    with torch.neuron.stream(s):
        assert torch.neuron.current_device() == 1
        x = torch.ones(10, device="neuron:1") * 4
    assert torch.neuron.current_device() == 0
    s.synchronize()
    assert_same(x, torch.full((10,), 4.0))
    assert torch.neuron.current_stream(1).stream_id == 0


def test_torch_event_and_stream_generic_api():
    s = torch.Stream(device="neuron")
    e = torch.Event(device="neuron", enable_timing=True)
    with s:
        x = torch.ones(4, device="neuron") + 1
        e.record()
    e.synchronize()
    s.synchronize()
    assert_same(x, torch.full((4,), 2.0))


def test_concurrent_threads_and_streams():
    errors = []

    def work(seed):
        try:
            g = torch.Generator().manual_seed(seed)
            a = torch.randn(32, 32, generator=g)
            x = a.to("neuron")
            s = torch.neuron.Stream() if seed % 2 else None
            ref = ((a @ a).tanh() * 2 + a).sum(0).softmax(0)
            for _ in range(40):
                with torch.neuron.stream(s):
                    z = ((x @ x).tanh() * 2 + x).sum(0).softmax(0)
                if not torch.equal(z.cpu(), ref):  # CPU's kernels: the same bits
                    errors.append(seed)
                    return
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_module_level_stream_helpers():
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        torch.neuron._sleep(100_000)
        x = torch.ones(8, device="neuron") * 3
    torch.neuron.wait_stream(side)
    y = x + 1  # ordered after side's work
    ev = torch.neuron.record_event()
    torch.neuron.wait_event(ev)
    ev.synchronize()
    torch.neuron.current_stream().synchronize()  # (the wait itself was queued after ev)
    assert torch.neuron.query()
    assert_same(y, torch.full((8,), 4.0))


QUEUE_PROGRAM = """
import time, torch, torchneuron
x = torch.zeros(64, device="neuron")
for _ in range(10):
    x.add_(1)  # the first calls of a kind run inline; these are queued
torch.neuron.synchronize()
torch.neuron.set_sync_debug_mode("error")  # a full queue is not a synchronizing call
torchneuron.clear_op_tracking()
torch.neuron._sleep(300_000)  # the stream is busy for 300 ms
start = time.perf_counter()
for _ in range(3000):
    x.add_(1)
print("host_s", time.perf_counter() - start)
print("waits", torchneuron.host_wait_counts())
torch.neuron.set_sync_debug_mode("default")
print("value", x[0].item())
"""


@requires_async
def test_a_full_launch_queue_makes_the_host_wait_and_loses_nothing():
    # As a CUDA launch waits while the launch queue is full: past
    # NEURON_RT_QUEUE_DEPTH queued items a launch waits until half have run,
    # so a loop that never synchronizes cannot grow host memory without bound.
    def run(env):
        r = run_python(QUEUE_PROGRAM, env=env)
        assert r.returncode == 0, r.stderr
        out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        return float(out["host_s"]), ast.literal_eval(out["waits"]), float(out["value"])

    host_s, waits, value = run({"NEURON_RT_QUEUE_DEPTH": "512"})
    assert value == 3010.0
    assert waits.get("launch_queue", 0) >= 1, waits
    assert host_s > 0.15, host_s  # it waited for the sleeping kernel
    # The default depth holds all 3000: the host only queued.
    host_s, waits, value = run({"NEURON_RT_QUEUE_DEPTH": "16384"})
    assert value == 3010.0
    assert "launch_queue" not in waits, waits
    assert host_s < 0.15, host_s
