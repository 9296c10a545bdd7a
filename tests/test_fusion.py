"""Adaptive eager fusion (csrc/aten/Fusion.h): queued pointwise ops run as one
pass, and the results are bitwise those of unfused execution and of CPU.

Every case holds the stream with a long kernel first, so the ops behind it
are queued when the device reaches them (what a host running ahead of the
device gives): the fusion statistics then show that they did fuse, and the
values show that fusing changed nothing. A case that counts fused ops also
checks that the device was still held once the host had queued them, and runs
again with a longer hold when it was not (a host slowed by other load): the
count then measures fusion, not the host's speed. Sizes cross ATen's
per-thread split (32768 elements) with ragged ends, so that vector tails fall
inside chains.
"""
import math
import os
import random
import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import torchneuron
from conftest import NEURON, chrome_trace_events, requires_async

SIZES = [7, 2049, 4096, 32768, 32769, 65536 + 13, 200003]


HOLD_US = 50_000  # 50 ms: the ops queued next wait behind it


class Hold:
    """A long kernel on the stream, so that the ops queued next wait behind it.

    ended(), asked once they are queued, says whether the device got past the
    kernel first (a host slowed by other load or a garbage collection): the
    ops then did not all wait behind it, and a count of fused ops would
    measure the host's speed rather than fusion."""

    def __init__(self, us=HOLD_US):
        torch.neuron.synchronize()
        torch.neuron._sleep(us)
        self._mark = torch.neuron.Event()
        self._mark.record()  # completes when the kernel ends

    def ended(self):
        return self._mark.query()


def hold_stream():
    return Hold()


def queued_behind_hold(body, make_args=tuple, tries=4):
    """body(*make_args())'s result, its ops queued behind a Hold (the
    arguments made before it); run again, with new arguments and a hold twice
    as long, while the device got past the hold before body() returned.
    Fusion statistics are cleared before each try."""
    for attempt in range(tries):
        args = make_args()
        torchneuron.clear_op_tracking()
        hold = Hold(HOLD_US << attempt)
        out = body(*args)
        if not hold.ended():
            return out
        torch.neuron.synchronize()
    pytest.fail(f"the host never queued the ops within a {HOLD_US << (tries - 1)} us hold")


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


@pytest.fixture
def fusion_on():
    was = torchneuron.is_fusion_enabled()
    torchneuron.set_fusion_enabled(True)
    torchneuron.clear_op_tracking()
    yield
    torchneuron.set_fusion_enabled(was)


def run_neuron(fn, inputs, fused, counted=False):
    """fn on copies of inputs on the device, queued behind a hold. counted:
    the caller reads fusion statistics of this run, so every op must have
    been queued before the hold ended (queued_behind_hold)."""
    torchneuron.set_fusion_enabled(fused)

    def make_args():
        return [t.to(NEURON) for t in inputs]

    try:
        if counted:
            # A first call of a kind on the generic path queues work of its
            # own between the chain's items, which no pass joins: with fusion
            # off, unary ops of these sizes take their direct paths instead,
            # so the unfused run does not make those first calls (the gelu
            # chain at 4096 made 3 passes, split at tanh, whenever no earlier
            # test had called tanh there). One uncounted run makes them.
            fn(*make_args())
            torch.neuron.synchronize()
            out = queued_behind_hold(fn, make_args)
        else:
            args = make_args()
            hold_stream()
            out = fn(*args)
        return [o.cpu() for o in (out if isinstance(out, (list, tuple)) else [out])]
    finally:
        torchneuron.set_fusion_enabled(True)


def assert_bitwise(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x.view(-1).view(torch.uint8) if x.dtype != torch.bool else x,
                           y.view(-1).view(torch.uint8) if y.dtype != torch.bool else y)


@requires_async
@pytest.mark.parametrize("n", SIZES)
def test_gelu_chain_fuses_and_keeps_cpus_bits(fusion_on, n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    ref = [gelu_tanh(x)]
    unfused = run_neuron(gelu_tanh, [x], fused=False)  # first calls of a kind verify, inline
    fused = run_neuron(gelu_tanh, [x], fused=True, counted=True)
    stats = torchneuron.get_fusion_stats()
    assert_bitwise(fused, ref)
    assert_bitwise(unfused, ref)
    if n < 4096:  # below kMinFusibleElements ops run alone
        assert stats["ops"] == 0, stats
        return
    # mul(0.5, x), pow, mul, add, mul, tanh, add, mul: all fused (sizes up to
    # GRAIN_SIZE begin with a pass of the two independent ops).
    assert stats["ops"] == 8 and 1 <= stats["passes"] <= 2, stats
    assert stats["by_op"].get("aten::tanh") == 1, stats


# ---------------------------------------------------------------------------
# Random chains: ops of the fusible list and others, dtypes, scalars (Python
# and 0-dim device tensors), in-place ops, views that keep or break
# contiguity, broadcasts (columns, values per row, either operand repeated),
# and aliasing a pass cannot allow (shifted slices, a row of a tensor the
# pass writes read at every row).

def _unary(x, rng):
    ops = [torch.tanh, torch.exp, torch.sigmoid, torch.neg, torch.sin, torch.cos, torch.relu,
           torch.square, torch.sign, torch.abs,
           lambda t: torch.sqrt(torch.abs(t)), lambda t: torch.rsqrt(torch.abs(t) + 1),
           lambda t: torch.log(torch.abs(t) + 1), lambda t: torch.reciprocal(t + 3),
           lambda t: torch.clamp(t, -0.5, 0.7), torch.nn.functional.silu]
    return rng.choice(ops)(x)


def _binary(x, y, s, rng):
    ops = [lambda: x + y, lambda: x - y * 0.5, lambda: x * y, lambda: x / (y.abs() + 1),
           lambda: torch.add(x, y, alpha=1.5), lambda: torch.maximum(x, y),
           lambda: torch.minimum(x, y), lambda: torch.pow(x, 3), lambda: torch.pow(x.abs(), 0.5),
           lambda: torch.where(x > y, x, y), lambda: torch.addcmul(x, x, y, value=0.3),
           lambda: torch.addcdiv(x, y, x.abs() + 1, value=-0.2), lambda: torch.lerp(x, y, 0.3),
           lambda: x * s, lambda: x + s, lambda: x - 2.5, lambda: 0.5 * x,
           lambda: (x > 0.1).to(x.dtype) * y]
    return rng.choice(ops)()


def random_chain(seed):
    """A program of pointwise steps over a pool of tensors; returns a callable."""
    rng = random.Random(seed)
    steps = [rng.randrange(9) for _ in range(rng.randrange(4, 14))]
    choices = [rng.random() for _ in range(64)]

    def program(x, y, s):
        r = random.Random(seed + 1)
        pool = [x, y]
        outs = []
        for i, kind in enumerate(steps):
            a, b = r.choice(pool), r.choice(pool)
            if kind <= 2:
                v = _unary(a, r)
            elif kind <= 5:
                v = _binary(a, b, s, r)
            elif kind == 6:  # in place on a fresh tensor of the pool
                v = a * 1.0
                v.mul_(b).add_(0.25)
            elif kind == 8:  # broadcasts over the elements as rows
                m = a.numel()
                rows = next((d for d in (3, 2, 5, 7, 11, 13) if m % d == 0), 1)
                am, bm = a.view(rows, m // rows), b.view(rows, m // rows)
                if choices[i] < 0.3:
                    v = am * bm[:1]                  # a column operand: a view of b's first row
                elif choices[i] < 0.45:
                    v = bm[:1] - am                  # the repeated operand first
                elif choices[i] < 0.65:
                    v = am / (bm[:, :1].abs() + 1)   # a value per row
                elif choices[i] < 0.85:
                    # A row of what the pass writes, read at every row: may
                    # never share that pass.
                    w = a + b
                    v = am * w.view(rows, m // rows)[:1] + w.view(rows, m // rows)
                else:
                    v = am + bm[:, :1]               # a strided value per row
                v = v.reshape(-1)
            else:  # views: a reshape keeps contiguity, a transpose or shift does not
                m = a.numel()
                if choices[i] < 0.4 and m % 2 == 0:
                    v = a.view(2, m // 2).t().contiguous().view(-1) + b
                elif choices[i] < 0.7:
                    # Two views one element apart: a write through one and a
                    # read through the other may never share a pass.
                    buf = torch.cat([a, a[:1]])
                    buf[:m].mul_(2.0)
                    v = buf[1:] + b
                else:
                    v = (a.view(-1, 1) * 2.0).view(-1) - b
            pool.append(v)
            outs.append(v)
        return outs

    return program


@requires_async
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_random_chains_fused_unfused_and_cpu_are_bitwise_equal(fusion_on, dtype):
    fused_ops = repeat_steps = 0
    for seed in range(24):
        n = SIZES[seed % len(SIZES)]
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, generator=g).to(dtype)
        y = torch.randn(n, generator=g).to(dtype)
        s = torch.tensor(0.75, dtype=dtype)
        program = random_chain(seed)
        ref = program(x, y, s)
        unfused = run_neuron(program, [x, y, s], fused=False)
        torchneuron.clear_op_tracking()
        fused = run_neuron(program, [x, y, s], fused=True)
        fused_ops += torchneuron.get_fusion_stats()["ops"]
        repeat_steps += torchneuron.get_fusion_stats()["broadcast_loop_ops"]
        try:
            assert_bitwise(fused, ref)
            assert_bitwise(unfused, ref)
        except AssertionError:
            pytest.fail(f"seed {seed}, n {n}, {dtype}: fused/unfused/CPU differ")
    assert fused_ops > 24, "the chains never fused: the test would prove nothing"
    if dtype == torch.float32 and torchneuron._C._list_loops_available():
        assert repeat_steps > 0, "no broadcast ran as a repeat step"


# ---------------------------------------------------------------------------
# Row reductions in passes (Fusion.h): sum and mean over the rows of a
# contiguous tensor join a pass whose threads' chunks are whole rows, and ops
# after them read their results per row in the same blocks.

def layer_norm_rows(x):
    mean = x.mean(-1, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keepdim=True)
    return centered * torch.rsqrt(var + 1e-5)


def rms_norm_rows(x):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)


def normalized_exp(x):
    e = torch.exp(x - 1.0)
    return e / e.sum(-1, keepdim=True), e.sum(-1)


def centered_twice(x):
    m = x.mean(-1, keepdim=True)
    return x - m, (x - m) * (x - m), m


def rows_stay_whole(rows, length):
    """Whether the device's split of rows * length elements among its
    threads (at::parallel_for over GRAIN_SIZE) cuts no row."""
    n = rows * length
    threads = min(torch.get_num_threads(), -(-n // 32768))
    return (-(-n // threads)) % length == 0 and (512 * length // math.gcd(512, length)) <= 65536


@requires_async
@pytest.mark.parametrize("chain", [layer_norm_rows, rms_norm_rows, normalized_exp, centered_twice])
@pytest.mark.parametrize("rows,length", [(64, 1024), (1024, 768), (128, 48), (63, 1024),
                                         (9, 1000)])
def test_row_reductions_fuse_with_their_rows_and_keep_cpus_bits(fusion_on, chain, rows, length):
    x = torch.randn(rows, length, generator=torch.Generator().manual_seed(rows + length))
    ref = chain(x)
    ref = list(ref) if isinstance(ref, tuple) else [ref]
    unfused = run_neuron(chain, [x], fused=False)
    fused = run_neuron(chain, [x], fused=True, counted=True)
    stats = torchneuron.get_fusion_stats()
    assert_bitwise(fused, ref)
    assert_bitwise(unfused, ref)
    row_ops = stats["by_op"].get("aten::mean.dim", 0) + stats["by_op"].get(
        "aten::sum.dim_IntList", 0)
    if rows_stay_whole(rows, length) and torchneuron._C._list_loops_available():
        # The first statistic and the ops reading it per row share a pass.
        assert row_ops >= 1 and stats["broadcast_loop_ops"] >= 1, stats
        if chain is layer_norm_rows:
            assert row_ops == 2, stats  # both statistics
    elif not rows_stay_whole(rows, length):
        assert row_ops == 0, stats


@requires_async
def test_row_reductions_in_passes_respect_writes_to_their_results(fusion_on):
    # What a pass writes may not be a row op's input unless it is the very
    # range the row op reads; a per-row value another op of the pass writes
    # (not the row op that computes it) may not be read per row in it.
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(3))

    def program(x):
        m = x.mean(-1, keepdim=True)
        y = x - m
        ym = y.mean(-1, keepdim=True)          # a row op over what the pass wrote
        big = x.new_zeros(64 * 1024 + 64)
        stats = big[:64].view(64, 1)
        z = y * 2.0
        stats.copy_(z.sum(-1, keepdim=True))   # a per-row value written by a copy
        u = x - stats                          # ... read per row: not in the copy's pass
        w = big[64:].view(64, 1024).add_(z)    # a full-size write beside it
        return [m, y, ym, z, u, w, big]

    ref = program(x)
    fused = run_neuron(program, [x], fused=True)
    unfused = run_neuron(program, [x], fused=False)
    assert_bitwise(fused, ref)
    assert_bitwise(unfused, ref)

    # Per-row values at the end of memory an earlier op of the pass writes
    # in full: its last block writes them after the first block would read.
    x = torch.randn(256, 1024, generator=torch.Generator().manual_seed(4))

    def late_rows(x):
        big = x * 1.0
        big.add_(x)
        return [big, x - big.view(-1)[-256:].view(256, 1)]

    assert_bitwise(run_neuron(late_rows, [x], fused=True), late_rows(x))


def _optimizer_steps(make_opt, sizes, steps=3):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n)) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p)
    dev = [torch.nn.Parameter(p.detach().to(NEURON)) for p in params]
    for p, q in zip(params, dev):
        q.grad = p.grad.to(NEURON)
    opt_cpu, opt_dev = make_opt(params), make_opt(dev)
    for _ in range(steps):
        opt_cpu.step()
        hold_stream()
        opt_dev.step()
    torch.neuron.synchronize()
    for p, q in zip(params, dev):
        assert torch.equal(p.detach(), q.detach().cpu())


@requires_async
@pytest.mark.parametrize("sizes", [[1000 + 37 * i for i in range(40)],  # each op on one thread
                                   [40000, 70001, 5, 3000],             # some split by elements
                                   [300007, 2 * 65536 + 1, 33000]],     # several blocks a chunk
                         ids=["small", "mixed", "large"])
def test_foreach_optimizer_steps_queue_one_item_per_call(fusion_on, sizes):
    # PyTorch's default AdamW on a PrivateUse1 device takes the foreach path.
    _optimizer_steps(lambda ps: torch.optim.AdamW(ps, lr=1e-2), sizes)
    paths = torchneuron.get_op_paths()
    assert paths["aten::_foreach_lerp_.Scalar"]["async"] == 3, paths
    assert paths["aten::_foreach_addcdiv_.ScalarList"]["async"] == 3, paths
    assert paths["aten::_foreach_sqrt.out"]["async"] == 3, paths  # the functional form too
    assert "aten::lerp_.Scalar" not in paths  # not one dispatch per parameter
    # The step's foreach calls run in one pass, index by index (the values
    # above are CPU's bits); lists with a large tensor walk each index block
    # by block.
    stats = torchneuron.get_fusion_stats()
    assert stats["by_op"].get("aten::_foreach_lerp_.Scalar", 0) >= 2, stats
    assert stats["by_op"].get("aten::_foreach_sqrt.out", 0) >= 2, stats
    if max(sizes) > 32768:
        assert stats["blocked_list_passes"] >= 2, stats
    else:
        assert stats["blocked_list_passes"] == 0, stats
    # SGD with momentum and weight decay, too.
    torchneuron.clear_op_tracking()
    _optimizer_steps(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-2,
                                                nesterov=True), sizes)
    assert any(op.startswith("aten::_foreach_add_") for op in torchneuron.get_op_paths())


@requires_async
def test_blocked_list_passes_split_each_tensor_as_its_kernel_does(fusion_on):
    # pow with a float exponent and sigmoid have a vector form (Sleef) and a
    # scalar form (libm) that differ in the last bit for some values, and a
    # kernel computes the last < 16 elements of each thread's chunk with the
    # scalar form: a blocked list pass that split a tensor anywhere but where
    # at::parallel_for does would move those elements to the vector form.
    # 70014 elements make two chunks of 35007 on 2 threads, each with a
    # 15-element tail (on more threads, more chunks: still tails).
    if torch.get_num_threads() < 2:
        pytest.skip("one compute thread: a tensor is one chunk")
    g = torch.Generator().manual_seed(0)
    xs = [torch.rand(70014, generator=g) * 4 + 0.25 for _ in range(24)]

    def program(ts):
        torch._foreach_mul_(ts, 1.5)
        torch._foreach_pow_(ts, 1.7)
        torch._foreach_sigmoid_(ts)

    ref = [x.clone() for x in xs]
    program(ref)
    dev = [x.to(NEURON) for x in xs]
    program([d.clone() for d in dev])  # a kind of call is verified the first time: not fused
    torch.neuron.synchronize()
    dev = queued_behind_hold(lambda ts: program(ts) or ts, lambda: ([d.clone() for d in dev],))
    assert_bitwise([d.cpu() for d in dev], ref)
    stats = torchneuron.get_fusion_stats()
    assert stats["blocked_list_passes"] >= 1 and stats["by_op"].get(
        "aten::_foreach_pow_.Scalar", 0) >= 1, stats
    # The inputs give the two forms something to disagree on: the test can fail.
    # (One element alone takes the scalar form; followed by 16 more, the vector form.)
    tails = torch.cat([x[35007 - 15:35007] * 1.5 for x in xs])
    scalar = torch.cat([torch.pow(v.reshape(1), 1.7) for v in tails])
    vector = torch.pow(torch.cat([tails, torch.ones(16)]), 1.7)[: tails.numel()]
    assert not torch.equal(scalar, vector)


@requires_async
@pytest.mark.parametrize("n", [5, 40000])
def test_foreach_lists_aliased_across_indices_keep_serial_order(fusion_on, n):
    # Index 1 reads what index 0 writes (and a second call writes what the
    # first one's other index reads): neither the threads nor a pass may
    # reorder them.
    def program(a, b, c):
        torch._foreach_add_([a, b], [c, a])
        torch._foreach_mul_([b, c], [a, b])
        torch._foreach_lerp_([c, a], [a, b], 0.25)
        return [a, b, c]

    g = torch.Generator().manual_seed(n)
    inputs = [torch.randn(n, generator=g) for _ in range(3)]
    ref = program(*[t.clone() for t in inputs])
    for fused in (True, False):
        assert_bitwise(run_neuron(program, inputs, fused=fused), ref)


def test_foreach_lists_over_two_devices_run_each_index_on_its_device(two_devices):
    # One queued item cannot hold tensors of two devices: such calls (in
    # place and functional) run the composite kernel, each index's op on its
    # own device, as CUDA does, with CPU's values.
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(n, generator=g) for n in (5, 70001)]
    ys = [torch.randn(n, generator=g) for n in (5, 70001)]
    devs = [torch.device("neuron", 0), torch.device("neuron", 1)]
    a, b = [x.to(d) for x, d in zip(xs, devs)], [y.to(d) for y, d in zip(ys, devs)]
    out = torch._foreach_add(a, b, alpha=2.0)
    assert [o.device for o in out] == devs
    assert_bitwise([o.cpu() for o in out], torch._foreach_add(xs, ys, alpha=2.0))
    torch._foreach_lerp_(a, b, 0.3)
    torch._foreach_lerp_(xs, ys, 0.3)
    assert_bitwise([t.cpu() for t in a], xs)
    assert_bitwise([t.cpu() for t in torch._foreach_sqrt([t.abs() for t in a])],
                   torch._foreach_sqrt([t.abs() for t in xs]))


@requires_async
def test_foreach_ops_touching_shifted_views_at_one_index_are_not_blocked(fusion_on):
    # At index 0 the second call reads b, which overlaps what the first call
    # writes (a) one element off. Walked block by block, the second call would
    # read elements of a the first call has not scaled yet: the pass must run
    # each op on the whole index instead (and still give CPU's bits).
    n = 300_001  # two chunks, each several blocks

    def program(base, c, d, e):
        a, b = base[:n], base[1:n + 1]
        torch._foreach_mul_([a, c], 1.5)
        torch._foreach_add_([d, e], [b, c])
        return [base, c, d, e]

    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(n + 1, generator=g)] + [torch.randn(n, generator=g) for _ in range(3)]
    ref = program(*[t.clone() for t in inputs])
    run_neuron(program, inputs, fused=True)  # the first call of a kind runs inline
    assert_bitwise(run_neuron(program, inputs, fused=True, counted=True), ref)
    stats = torchneuron.get_fusion_stats()
    assert stats["passes"] == 1 and stats["ops"] == 2, stats  # one pass, index by index
    assert stats["blocked_list_passes"] == 0, stats


@requires_async
def test_synchronizing_calls_and_events_end_a_pass(fusion_on):
    x = torch.randn(50_000).to(NEURON)
    ((x * 2 + 1) * 3 - 1).cpu()  # first calls of these kinds verify, inline

    def queue():
        a = x * 2
        b = a + 1
        e = torch.neuron.Event()
        e.record()
        c = b * 3
        return c - 1

    d = queued_behind_hold(queue)
    torch.neuron.synchronize()
    stats = torchneuron.get_fusion_stats()
    assert stats["passes"] == 2 and stats["ops"] == 4, stats
    assert torch.equal(d.cpu(), (x.cpu() * 2 + 1) * 3 - 1)
    # A host read drains what is queued: nothing is left to fuse after it.
    torchneuron.clear_op_tracking()
    hold_stream()
    y = x * 2
    y.sum().item()
    z = y + 1
    torch.neuron.synchronize()
    assert torchneuron.get_fusion_stats()["ops"] == 0
    assert torch.equal(z.cpu(), x.cpu() * 2 + 1)


@requires_async
def test_profiler_shows_the_pass_of_each_fused_op(fusion_on):
    x = torch.randn(70_000).to(NEURON)
    (x * 2 + 1).cpu()  # first calls of these kinds (verification) out of the trace
    torch.neuron.synchronize()
    for attempt in range(4):  # as queued_behind_hold, a trace per try
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            hold = Hold(HOLD_US << attempt)
            y = (x * 2 + 1) * 3
            ended = hold.ended()
            torch.neuron.synchronize()
        if not ended:
            break
    assert not ended, "the host never queued the ops within the hold"
    events = chrome_trace_events(prof)
    fused = [e for e in events if e.get("cat") == "kernel" and "fused pass" in e.get("args", {})]
    assert [e["name"] for e in fused] == ["aten::mul.Tensor", "aten::add.Tensor", "aten::mul.Tensor"]
    assert {e["args"]["fused ops"] for e in fused} == {3}
    assert len({e["args"]["fused pass"] for e in fused}) == 1
    assert torch.equal(y.cpu(), (x.cpu() * 2 + 1) * 3)


def test_environment_turns_fusion_off():
    code = ("import torch, torchneuron\n"
            "x = torch.randn(50000).to('neuron')\n"
            "torch.neuron._sleep(50000)\n"
            "y = (x * 2 + 1) * 3\n"
            "torch.neuron.synchronize()\n"
            "print(torchneuron.is_fusion_enabled(), torchneuron.get_fusion_stats()['ops'])\n")
    env = dict(os.environ, TORCHNEURON_FUSION="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "0"]
