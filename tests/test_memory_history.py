"""Memory history and snapshots of the caching allocator (torch.neuron.memory),
checked against memory_stats and read with PyTorch's own torch.cuda._memory_viz."""
import gc
import inspect
import pickle
import subprocess
import sys

import pytest
import torch
from torch.cuda import _memory_viz

from conftest import requires_async, run_python

MiB = 1 << 20
THIS_FILE = __file__.rsplit("/", 1)[-1]


@pytest.fixture
def quiet_gc():
    """Exact accounting: no garbage from earlier tests is collected mid-test."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


@pytest.fixture
def history(quiet_gc):
    torch.neuron.synchronize()
    torch.neuron.memory._record_memory_history(stacks="python", clear_history=True)
    yield
    torch.neuron.memory._record_memory_history(enabled=None)


def _trace(snapshot, device=0):
    return snapshot["device_traces"][device]


def _names(frames):
    return {(f["filename"].rsplit("/", 1)[-1], f["name"]) for f in frames}


def _entries(trace, action, addr=None):
    return [e for e in trace if e["action"] == action and (addr is None or e["addr"] == addr)]


def test_memory_module_mirrors_torch_cuda_memory():
    import torch.neuron.memory as m
    from torch.neuron.memory import _dump_snapshot, _record_memory_history, _snapshot  # noqa: F401

    assert m is torch.neuron.memory
    for name in ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "reset_peak_memory_stats", "empty_cache",
                 "mem_get_info", "memory_summary", "memory_snapshot"):
        assert callable(getattr(m, name)), name
    cuda_params = list(inspect.signature(torch.cuda.memory._record_memory_history).parameters)
    assert list(inspect.signature(m._record_memory_history).parameters) == cuda_params
    with pytest.raises(ValueError, match="enabled"):
        m._record_memory_history(enabled="everything")
    with pytest.raises(ValueError, match="context"):
        m._record_memory_history(context="sometimes")
    with pytest.raises(ValueError, match="stacks"):
        m._record_memory_history(stacks="cpp")
    with pytest.raises(ValueError, match="skip_actions"):
        m._record_memory_history(skip_actions=["nap"])


def test_history_records_allocs_and_frees_with_python_frames(history):
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron")
    ptr = x.data_ptr()
    del x
    trace = _trace(torch.neuron.memory._snapshot())
    (alloc,) = _entries(trace, "alloc", ptr)
    assert alloc["size"] == 3 * MiB and alloc["stream"] == 0  # the default stream, as CUDA's 0
    here = (THIS_FILE, "test_history_records_allocs_and_frees_with_python_frames")
    assert here in _names(alloc["frames"])
    (requested,) = _entries(trace, "free_requested", ptr)
    (completed,) = _entries(trace, "free_completed", ptr)
    assert trace.index(alloc) < trace.index(requested) < trace.index(completed)
    assert requested["size"] == completed["size"] == 3 * MiB
    # context="all" (the default) keeps the stack of frees too
    assert here in _names(requested["frames"])
    times = [e["time_us"] for e in trace]
    assert times == sorted(times) and times[0] > 1_600_000_000_000_000  # microseconds since 1970
    assert trace[-1]["action"] == "snapshot"


def test_first_allocation_of_a_segment_records_the_segment(history):
    torch.neuron.empty_cache()
    torch.neuron.memory._record_memory_history(stacks="python", clear_history=True)
    # Larger than any free block left in segments that hold live tensors: a
    # segment of its own.
    x = torch.empty(100 * MiB, dtype=torch.uint8, device="neuron")
    ptr = x.data_ptr()
    del x
    torch.neuron.empty_cache()
    trace = _trace(torch.neuron.memory._snapshot())
    actions = [e["action"] for e in trace if e.get("addr") == ptr]
    assert actions == ["segment_alloc", "alloc", "free_requested", "free_completed",
                       "segment_free"]
    (seg,) = _entries(trace, "segment_alloc", ptr)
    assert seg["size"] == 100 * MiB
    assert (THIS_FILE, "test_first_allocation_of_a_segment_records_the_segment") in _names(
        seg["frames"])


def _check_against_stats(snapshot, device):
    """The snapshot's segments and blocks add up to the allocator's statistics."""
    st = torch.neuron.memory_stats(device)
    segs = [s for s in snapshot["segments"] if s["device"] == device]
    blocks = [b for s in segs for b in s["blocks"]]
    active = [b for b in blocks if b["state"] in ("active_allocated", "active_pending_free")]
    allocated = [b for b in blocks if b["state"] == "active_allocated"]
    assert len(segs) == st["segment.all.current"]
    assert sum(s["total_size"] for s in segs) == st["reserved_bytes.all.current"]
    assert sum(b["size"] for b in allocated) == st["allocated_bytes.all.current"]
    assert sum(s["allocated_size"] for s in segs) == st["allocated_bytes.all.current"]
    assert len(allocated) == st["allocation.all.current"]
    assert sum(b["size"] for b in active) == st["active_bytes.all.current"]
    assert sum(s["active_size"] for s in segs) == st["active_bytes.all.current"]
    assert sum(b["requested_size"] for b in allocated) == st["requested_bytes.all.current"]
    split_free = [b for s in segs if len(s["blocks"]) > 1 for b in s["blocks"]
                  if b["state"] == "inactive"]
    assert len(split_free) == st["inactive_split.all.current"]
    assert sum(b["size"] for b in split_free) == st["inactive_split_bytes.all.current"]
    for pool in ("small", "large"):
        assert sum(s["total_size"] for s in segs if s["segment_type"] == pool) == \
            st[f"reserved_bytes.{pool}_pool.current"]
    for s in segs:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
        address = s["address"]
        for b in s["blocks"]:  # blocks tile the segment in address order
            assert b["address"] == address
            address += b["size"]
    return segs


def test_snapshot_segments_and_blocks_agree_with_memory_stats(history, two_devices):
    here = (THIS_FILE, "test_snapshot_segments_and_blocks_agree_with_memory_stats")
    live = [torch.empty(n, dtype=torch.uint8, device="neuron")
            for n in (1, 700, 4096, 300_000, 2_500_000, 12_000_000, 30 * MiB)]
    live += [torch.empty(5000, dtype=torch.uint8, device="neuron:1")]
    del live[2]  # a free block inside a split small segment
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        live.append(torch.empty(1000, device="neuron"))
    snap = torch.neuron.memory._snapshot()
    for device in (0, 1):
        _check_against_stats(snap, device)
    blocks = {b["address"]: (s, b) for s in snap["segments"] for b in s["blocks"]}
    for t in live:
        seg, b = blocks[t.data_ptr()]
        assert seg["device"] == t.device.index
        assert b["state"] == "active_allocated"
        assert b["requested_size"] == t.untyped_storage().nbytes()
        assert b["size"] >= b["requested_size"] and b["size"] % 512 == 0
        assert here in _names(b["frames"])
        assert seg["segment_type"] == ("small" if b["size"] <= MiB else "large")
    assert blocks[live[0].data_ptr()][0]["stream"] == 0  # the default stream, as CUDA's
    assert blocks[live[-1].data_ptr()][0]["stream"] != 0  # the side stream's own segment
    assert all(s["segment_pool_id"] == (0, 0) and s["is_expandable"] is False
               for s in snap["segments"])


@requires_async
def test_record_stream_block_is_pending_free_until_the_stream_is_done(history):
    side = torch.neuron.Stream()
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron")
    ptr = x.data_ptr()
    with torch.neuron.stream(side):
        torch.neuron._sleep(200_000)
    x.record_stream(side)
    del x
    snap = torch.neuron.memory._snapshot()
    (b,) = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == ptr]
    assert b["state"] == "active_pending_free"
    _check_against_stats(snap, 0)
    assert _entries(_trace(snap), "free_requested", ptr)
    assert not _entries(_trace(snap), "free_completed", ptr)
    side.synchronize()
    for _ in range(100):  # the event recorded at free time may complete a moment later
        trace = _trace(torch.neuron.memory._snapshot())
        if _entries(trace, "free_completed", ptr):
            break
    assert _entries(trace, "free_completed", ptr)


def test_recording_off_records_nothing(quiet_gc):
    torch.neuron.memory._record_memory_history(enabled=None)
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron")
    del x
    y = torch.empty(1000, device="neuron")
    snap = torch.neuron.memory._snapshot()
    assert all(t == [] for t in snap["device_traces"])
    (b,) = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == y.data_ptr()]
    assert b["frames"] == []
    # "state" keeps stacks of live blocks but no history
    torch.neuron.memory._record_memory_history(enabled="state", stacks="python")
    try:
        z = torch.empty(1000, device="neuron")
        snap = torch.neuron.memory._snapshot()
    finally:
        torch.neuron.memory._record_memory_history(enabled=None)
    assert all(t == [] for t in snap["device_traces"])
    (b,) = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == z.data_ptr()]
    assert (THIS_FILE, "test_recording_off_records_nothing") in _names(b["frames"])


def test_turning_history_off_forgets_it(quiet_gc):
    torch.neuron.memory._record_memory_history(stacks="python")
    torch.empty(1000, device="neuron")
    assert _trace(torch.neuron.memory._snapshot())
    torch.neuron.memory._record_memory_history(enabled=None)
    torch.empty(1000, device="neuron")
    assert _trace(torch.neuron.memory._snapshot()) == []


def test_max_entries_keeps_the_newest(history):
    torch.neuron.memory._record_memory_history(stacks="python", max_entries=6, clear_history=True)
    keep = [torch.empty(1000 + i, device="neuron") for i in range(10)]
    trace = _trace(torch.neuron.memory._snapshot())
    assert len(trace) == 6
    allocs = [e["addr"] for e in trace if e["action"] == "alloc"]
    assert len(allocs) >= 4  # the rest: segment_alloc entries a new segment may add
    assert allocs == [t.data_ptr() for t in keep][-len(allocs):]
    assert trace[-1]["action"] == "snapshot"


def test_skip_actions_and_context_levels(history):
    torch.neuron.memory._record_memory_history(
        stacks="python", context="alloc", skip_actions=["free_requested"], clear_history=True)
    x = torch.empty(1000, device="neuron")
    ptr = x.data_ptr()
    del x
    trace = _trace(torch.neuron.memory._snapshot())
    assert _entries(trace, "alloc", ptr) and not _entries(trace, "free_requested", ptr)
    (completed,) = _entries(trace, "free_completed", ptr)
    assert completed["frames"] == []  # context="alloc": stacks on allocations only
    assert _entries(trace, "alloc", ptr)[0]["frames"]
    torch.neuron.memory._record_memory_history(stacks="python", context="state", clear_history=True)
    y = torch.empty(1000, device="neuron")
    trace = _trace(torch.neuron.memory._snapshot())
    assert _entries(trace, "alloc", y.data_ptr())[0]["frames"] == []


def test_legacy_boolean_signature(quiet_gc):
    torch.neuron.memory._record_memory_history(True, trace_alloc_max_entries=100,
                                               trace_alloc_record_context=True)
    try:
        x = torch.empty(1000, device="neuron")
        trace = _trace(torch.neuron.memory._snapshot())
        (alloc,) = _entries(trace, "alloc", x.data_ptr())
        assert (THIS_FILE, "test_legacy_boolean_signature") in _names(alloc["frames"])
    finally:
        torch.neuron.memory._record_memory_history(False)
    assert _trace(torch.neuron.memory._snapshot()) == []


def test_cpp_stacks_name_the_allocator(history):
    torch.neuron.memory._record_memory_history(stacks="all", clear_history=True)
    x = torch.empty(1000, device="neuron")
    trace = _trace(torch.neuron.memory._snapshot())
    (alloc,) = _entries(trace, "alloc", x.data_ptr())
    names = [f["name"] for f in alloc["frames"]]
    assert any("NeuronCachingAllocator" in n or "torchneuron" in n for n in names), names[:20]
    assert (THIS_FILE, "test_cpp_stacks_name_the_allocator") in _names(alloc["frames"])


def _replay_backwards(snapshot, device):
    """Undoes the trace from the snapshot's state, event by event, the way
    pytorch.org/memory_viz (MemoryViz.js) draws the allocator at each event:
    fails where the trace and the state disagree (a freed block that was never
    live, a block outside every segment, a segment freed twice)."""
    segs = {s["address"]: s["total_size"] for s in snapshot["segments"] if s["device"] == device}
    live = {b["address"]: b["size"] for s in snapshot["segments"] if s["device"] == device
            for b in s["blocks"] if b["state"] in ("active_allocated", "active_pending_free")}

    def inside_a_segment(addr):
        return any(a <= addr < a + n for a, n in segs.items())

    for e in reversed(snapshot["device_traces"][device]):
        a = e.get("addr")
        if e["action"] == "free_completed":
            assert a not in live, e
            live[a] = e["size"]
        elif e["action"] == "free_requested":
            assert a in live, e
        elif e["action"] == "alloc":
            assert live.pop(a, None) is not None, e
        elif e["action"] == "segment_free":
            assert a not in segs, e
            segs[a] = e["size"]
        elif e["action"] == "segment_alloc":
            assert segs.pop(a, None) == e["size"], e
            assert not any(a <= b < a + e["size"] for b in live), e
        if e["action"].startswith("segment"):
            assert all(inside_a_segment(b) for b in live), e


def test_dump_snapshot_renders_with_memory_viz(history, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = torch.neuron.memory._snapshot()["segments"]
    for _ in range(3):
        loss = model(torch.randn(32, 64, device="neuron")).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    big = torch.empty(40 * MiB, dtype=torch.uint8, device="neuron")
    del big
    torch.neuron.empty_cache()  # segment_free events
    keep = torch.empty(25 * MiB, dtype=torch.uint8, device="neuron")  # noqa: F841
    path = tmp_path / "snapshot.pickle"
    torch.neuron.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        data = pickle.load(f)
    actions = {e["action"] for e in _trace(data)}
    assert {"alloc", "free_requested", "free_completed", "segment_alloc",
            "segment_free"} <= actions
    _replay_backwards(data, 0)

    stats = _memory_viz.segsum(data)  # raises on any segment whose blocks do not add up
    assert f"segments: {len(data['segments'])}" in stats
    text = _memory_viz.trace(data)
    assert "cudaMalloc(" in text and "cudaFree(" in text and "del " in text
    flame = _memory_viz.memory(data, format_flamegraph=lambda lines: lines)
    assert f"{THIS_FILE}:" in flame and "test_dump_snapshot_renders_with_memory_viz" in flame
    assert "active_allocated" in _memory_viz.segments(data, format_flamegraph=lambda lines: lines)
    assert "only_after" in _memory_viz.compare(before, data["segments"],
                                               format_flamegraph=lambda lines: lines)
    for html in (_memory_viz.trace_plot(data), _memory_viz.segment_plot(data),
                 _memory_viz.trace_plot(data, plot_segments=True, filter_freed=True)):
        assert "MemoryViz.js" in html and "snapshot.pickle" in html
    # PyTorch's command line reads the file as written
    for command, expected in (("stats", "total_reserved"), ("trace", "entries")):
        out = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", command, str(path)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert expected in out.stdout, out.stdout


def test_oom_with_history_records_an_oom_entry(history):
    free, total = torch.neuron.mem_get_info()
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(total + 64 * MiB, dtype=torch.uint8, device="neuron")
    msg = str(info.value)
    assert "torch.neuron.memory._record_memory_history()" in msg
    assert "torch.neuron.memory._dump_snapshot(" in msg
    assert "fragmented" not in msg  # too big for the device, not a fragmentation problem
    trace = _trace(torch.neuron.memory._snapshot())
    (oom,) = _entries(trace, "oom")
    assert oom["size"] >= total + 64 * MiB
    assert 0 < oom["device_free"] <= total and "addr" not in oom
    assert (THIS_FILE, "test_oom_with_history_records_an_oom_entry") in _names(oom["frames"])
    # MemoryViz-style readers accept the entry
    assert "raise OutOfMemoryError" in _memory_viz.trace(torch.neuron.memory._snapshot())


def test_oom_message_names_fragmentation():
    # A 64 MiB arena: six 10 MiB tensors (a segment each), every other one
    # freed; the retry releases the three cached segments, leaving 34 MiB free
    # in pieces of at most 10 MiB, so 20 MiB cannot be placed.
    out = run_python("""
        import torch, torchneuron
        MiB = 1 << 20
        t = [torch.empty(10 * MiB, dtype=torch.uint8, device="neuron") for _ in range(6)]
        del t[4], t[2], t[0]
        try:
            torch.empty(20 * MiB, dtype=torch.uint8, device="neuron")
        except torch.OutOfMemoryError as e:
            print("MSG", e)
        print("RETRIES", torch.neuron.memory_stats()["num_alloc_retries"])
    """, env={"NEURON_RT_MEMORY_PER_CORE": "64M"})
    assert out.returncode == 0, out.stderr
    msg = out.stdout
    assert "MSG Neuron out of memory. Tried to allocate 20.00 MiB" in msg, msg
    assert "of which 34.00 MiB is free, but its largest free range is 10.00 MiB" in msg, msg
    assert "fragmented" in msg and "torch.neuron.memory._record_memory_history()" in msg
    assert "RETRIES 1" in msg


def test_allocations_on_other_python_threads_record_their_frames(history):
    # Ops release the GIL while they run: the allocator takes it back to read
    # the calling thread's frames, on whichever Python thread it is.
    import threading

    made = []

    def worker_allocates():
        made.append(torch.empty(1000, device="neuron"))

    t = threading.Thread(target=worker_allocates)
    t.start()
    t.join()
    trace = _trace(torch.neuron.memory._snapshot())
    (alloc,) = _entries(trace, "alloc", made[0].data_ptr())
    names = _names(alloc["frames"])
    assert (THIS_FILE, "worker_allocates") in names
    assert (THIS_FILE, "test_allocations_on_other_python_threads_record_their_frames") not in names


def test_memory_summary_is_cudas_table(monkeypatch):
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron")  # noqa: F841
    ours = torch.neuron.memory.memory_summary()
    stats = torch.neuron.memory_stats()
    # CUDA's own function on the same statistics gives the same table, but for
    # the device's name in the labels.
    monkeypatch.setattr(torch.cuda.memory, "memory_stats", lambda device=None: stats)
    theirs = torch.cuda.memory.memory_summary(device=0)
    renamed = (theirs.replace("GPU reserved memory", "Reserved memory    ")
               .replace("GPU reserved segments", "Reserved segments    ")
               .replace("Oversize GPU segments", "Oversize segments    "))
    assert ours.splitlines()[4:] == renamed.splitlines()[4:]
    assert "neuron OOMs: " in ours and "nrtMalloc retries: " in ours
    assert all(len(line) == 77 for line in ours.splitlines()), ours
    short = torch.neuron.memory_summary(abbreviated=True)
    assert "from large pool" not in short and "Allocated memory" in short
