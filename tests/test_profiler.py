"""The device timeline in torch.profiler.

A small training step (MLP forward, backward on the autograd engine's device
thread, AdamW, a dtype conversion, H2D and D2H copies, work on a side stream
and on a second device) is profiled with CPU + PrivateUse1 activities, and the
exported Chrome trace, key_averages() and the legacy profiler are checked
against what the step must have done on the device.
"""
import threading

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import torchneuron
from conftest import NEURON, chrome_trace_events

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(NEURON)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _train_step(model, opt, side_stream=None):
    x = torch.randn(16, 32).to(NEURON)            # H2D
    y = torch.randn(16, 8).to(NEURON)
    loss = F.mse_loss(model(x), y)
    loss.backward()                               # autograd's device thread
    opt.step()
    opt.zero_grad(set_to_none=True)
    half = model[0].weight.detach().to(torch.float16)  # conversion copy
    if side_stream is not None:
        side_stream.wait_stream(torch.neuron.current_stream())
        with torch.neuron.stream(side_stream):
            side = torch.mm(half.float(), half.float().t())
        torch.neuron.current_stream().wait_stream(side_stream)
        side.cpu()
    return loss.detach().cpu(), half.cpu()        # D2H


@pytest.fixture(scope="module")
def profiled():
    model, opt = _model()
    side = torch.neuron.Stream()
    _train_step(model, opt, side)                 # warm-up: first calls run inline
    torch.neuron.synchronize()
    torchneuron._C._drain_activity_records()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        _train_step(model, opt, side)
        if torch.neuron.device_count() > 1:
            (torch.ones(64, device="neuron:1") * 2).cpu()
        with torch.profiler.record_function("user_scope"):
            torch.neuron._sleep(100)              # a kernel no aten op launched
    return prof, chrome_trace_events(prof), side.stream_id, threading.get_native_id()


def test_every_work_item_is_on_its_stream_lane_with_a_duration(profiled):
    _, events, side_id, _ = profiled
    work = [e for e in events if e.get("cat") in DEVICE_CATS]
    assert len(work) > 20, [e["name"] for e in work]
    lanes = {(e["pid"], e["tid"]) for e in work}
    for e in work:
        assert e["ph"] == "X"
        assert e["pid"] == e["args"]["device"], e
        assert e["tid"] == e["args"]["stream"], e
        assert e["dur"] > 0, e
    assert (0, 0) in lanes                        # default stream of neuron:0
    side_mm = [e for e in work if e["tid"] == side_id and e["name"].startswith("aten::mm")]
    assert side_mm, "the side stream's mm is not on the side stream's lane"
    if torch.neuron.device_count() > 1:
        assert any(pid == 1 for pid, _ in lanes)
    names = {(e["pid"], e["args"]["name"]) for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert (0, "neuron:0") in names
    threads = {(e["pid"], e["tid"], e["args"]["name"]) for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert (0, 0, "stream 0") in threads
    assert (0, side_id, f"stream {side_id}") in threads


def test_copies_carry_their_bytes_and_kind(profiled):
    _, events, _, _ = profiled
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    names = {e["name"] for e in copies}
    assert any(n.startswith("Memcpy HtoD") for n in names), names
    assert any(n.startswith("Memcpy DtoH") for n in names), names
    assert any("converting" in n for n in names), names
    for e in copies:
        assert e["args"]["kind"] == "copy"
        assert e["args"]["bytes"] > 0, e
    h2d = [e for e in copies if e["name"].startswith("Memcpy HtoD")]
    assert {16 * 32 * 4, 16 * 8 * 4} <= {e["args"]["bytes"] for e in h2d}
    for e in events:
        if e.get("cat") == "kernel":
            assert e["args"]["kind"] in ("kernel", "host"), e


def _ops_by_external_id(events):
    return {e["args"]["External id"]: e for e in events
            if e.get("cat") in ("cpu_op", "user_annotation") and "External id" in e.get("args", {})}


def test_every_work_item_links_to_the_cpu_op_that_launched_it(profiled):
    _, events, _, main_tid = profiled
    ops = _ops_by_external_id(events)
    flows = {}
    for e in events:
        if e.get("cat") == "ac2g":
            flows.setdefault(e["id"], {})[e["ph"]] = e
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") == "privateuse1_runtime"}
    work = [e for e in events if e.get("cat") in DEVICE_CATS]
    op_of = {}
    for e in work:
        op = ops.get(e["args"].get("External id"))
        assert op is not None, f"{e['name']} has no CPU op: {e['args']}"
        op_of[id(e)] = op
        # The arrow: starts on the launch, inside the op, ends on the work.
        launch = launches[e["args"]["correlation"]]
        flow = flows[e["args"]["correlation"]]
        assert flow["f"]["pid"] == e["pid"] and flow["f"]["tid"] == e["tid"]
        assert flow["s"]["pid"] == op["pid"] and flow["s"]["tid"] == op["tid"]
        assert op["ts"] <= launch["ts"] <= op["ts"] + op["dur"], (e["name"], op["name"])
        assert launch["ts"] <= e["ts"], (e["name"], launch, e)
        assert launch["args"]["External id"] == op["args"]["External id"]
        # An op's kernel is named after the op (its out= or in-place form).
        if e.get("cat") == "kernel" and op.get("cat") == "cpu_op":
            assert e["name"].split(".")[0] == op["name"].split(".")[0], (e["name"], op["name"])
    # Work no op launched is stamped with the enclosing record_function.
    sleep = [e for e in work if e["name"] == "torchneuron::_sleep"]
    assert [op_of[id(e)]["name"] for e in sleep] == ["user_scope"]
    assert op_of[id(sleep[0])]["cat"] == "user_annotation"
    copy_ops = {op_of[id(e)]["name"] for e in work if e.get("cat") == "gpu_memcpy"}
    assert copy_ops == {"aten::_copy_from"}, copy_ops  # the backend's copy kernel
    kernels = {op_of[id(e)]["name"] for e in work}
    assert {"aten::addmm", "aten::mm", "aten::threshold_backward"} <= kernels, kernels
    # Backward ops run on the autograd engine's device thread; their work must
    # be correlated there too.
    backward = [op_of[id(e)] for e in work if op_of[id(e)]["name"] == "aten::threshold_backward"]
    assert backward and all(op["tid"] != main_tid for op in backward)


def test_key_averages_give_device_time_per_op(profiled):
    prof, events, _, _ = profiled
    averages = prof.key_averages()
    # Ops are CPU rows; each work item also has a row of its own (device
    # type PrivateUse1), as CUDA kernels do.
    ops = {r.key: r for r in averages if r.device_type == DeviceType.CPU}
    work_rows = [r for r in averages if r.device_type == DeviceType.PrivateUse1]
    for name in ("aten::mm", "aten::addmm", "aten::_copy_from"):
        assert ops[name].self_device_time_total > 0, name
        assert ops[name].device_time_total >= ops[name].self_device_time_total
    assert ops["aten::linear"].device_time_total >= ops["aten::addmm"].device_time_total
    assert ops["aten::linear"].self_device_time_total == 0
    # Every device microsecond is credited once to the op that launched it,
    # and once to its own row.
    work_us = sum(e["dur"] for e in events if e.get("cat") in DEVICE_CATS)
    credited = sum(r.self_device_time_total for r in ops.values())
    assert credited == pytest.approx(work_us, rel=0.01, abs=2.0)
    assert sum(r.self_device_time_total for r in work_rows) == pytest.approx(
        work_us, rel=0.01, abs=2.0)
    table = averages.table(sort_by="self_device_time_total", row_limit=5)
    assert "Self NEURON" in table, table


@pytest.mark.parametrize("use_kineto", [False, True])
def test_legacy_profiler_gives_device_times(use_kineto):
    model, opt = _model()
    _train_step(model, opt)
    torch.neuron.synchronize()
    with torch.autograd.profiler.profile(use_device="neuron", use_kineto=use_kineto) as prof:
        _train_step(model, opt)
    rows = {r.key: r for r in prof.key_averages()}
    for name in ("aten::addmm", "aten::mm"):
        assert rows[name].device_time_total > 0, (name, use_kineto)
    assert torchneuron._C._drain_activity_records() == 0


def test_profiling_off_records_nothing():
    model, opt = _model()
    torchneuron._C._drain_activity_records()
    _train_step(model, opt)
    torch.neuron.synchronize()
    assert torchneuron._C._drain_activity_records() == 0
    # A CPU-only trace asks for no device activity: no session, no records.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _train_step(model, opt)
    assert not [e for e in chrome_trace_events(prof) if e.get("cat") in DEVICE_CATS]
    assert torchneuron._C._drain_activity_records() == 0
    # After a device trace, recording is off again.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        _train_step(model, opt)
    assert [e for e in chrome_trace_events(prof) if e.get("cat") in DEVICE_CATS]
    _train_step(model, opt)
    torch.neuron.synchronize()
    assert torchneuron._C._drain_activity_records() == 0


def test_work_queued_between_traces_is_in_neither():
    model, opt = _model()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]):
        _train_step(model, opt)
    torch.neuron._sleep(20000)                    # still running when the next trace starts
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        torch.ones(4, device=NEURON).cpu()
    names = [e["name"] for e in chrome_trace_events(prof) if e.get("cat") in DEVICE_CATS]
    assert "torchneuron::_sleep" not in names
    assert any(n.startswith("Memcpy DtoH") for n in names), names


def test_scheduled_traces_each_hold_their_own_steps():
    model, opt = _model()
    _train_step(model, opt)
    traces = []

    def on_trace_ready(prof):
        traces.append([e for e in chrome_trace_events(prof) if e.get("cat") in DEVICE_CATS])

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                 schedule=torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=2),
                 on_trace_ready=on_trace_ready) as prof:
        for _ in range(6):
            _train_step(model, opt)
            prof.step()
    assert len(traces) == 2
    # One active step each: the same work, none of the warm-up or waiting steps'.
    names = [sorted(e["name"] for e in t) for t in traces]
    assert names[0] and names[0] == names[1], names
    assert torchneuron._C._drain_activity_records() == 0
