"""Serial-equivalent kernels (csrc/core/SerialCompute.h).

A small kernel runs on one compute thread only where that computes the bits
it computes on the reference count (the executor thread's count, here every
core): the device's own passes reproduce the reference's split chunk by
chunk, listed ATen kernels split into independent parts
(csrc/aten/SerialKernels.h), and BLAS products are calibrated per geometry
(csrc/aten/SerialGemm.h). The tests hold each class to CPU eager's bits on
sizes where a wrong split would show (chunk boundaries off a vector pair,
ragged tails, transcendental ops whose vector and scalar forms differ) with
serial kernels on and off, check through the counter that the serial path is
really taken (and not where it must not be), and check in a child process
that a small training step then opens no OpenMP parallel region at all.
"""
import contextlib
import ctypes
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.nn.functional as F

import torchneuron
from torchneuron import _C

from conftest import requires_async

# Every test watches queued work run on the executor (its counters, its
# timing), so none runs under NEURON_LAUNCH_BLOCKING=1.
pytestmark = [pytest.mark.skipif(torch.get_num_threads() < 2,
                                 reason="one compute thread: nothing to run serially"),
              requires_async]


def bits(t):
    t = t.detach().cpu().contiguous()
    return t.view({torch.float32: torch.int32, torch.float64: torch.int64,
                   torch.float16: torch.int16, torch.bfloat16: torch.int16}[t.dtype])


def assert_same_bits(got, want):
    got = got.detach().cpu()
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert torch.equal(bits(got), bits(want))


@contextlib.contextmanager
def serial(enabled):
    before = _C._serial_kernels_enabled()
    _C._set_serial_kernels_enabled(enabled)
    try:
        yield
    finally:
        _C._set_serial_kernels_enabled(before)


def serial_runs():
    torch.neuron.synchronize()
    return _C._serial_kernels_run()


def check(fn, *inputs, serial_expected=True):
    """fn on CPU and on neuron with serial kernels on and off: CPU's bits
    either way; the serial path taken (or not) as expected when on, never
    when off. Returns the CPU results."""
    want = fn(*inputs)
    want = want if isinstance(want, (tuple, list)) else (want,)
    dev = [x.to("neuron") if isinstance(x, torch.Tensor) else x for x in inputs]
    for enabled in (True, False):
        with serial(enabled):
            fn(*dev)  # first calls of a kind may verify inline
            before = serial_runs()
            time.sleep(0.002)  # past the hot-team window of earlier work
            got = fn(*dev)
            ran = serial_runs() - before
        got = got if isinstance(got, (tuple, list)) else (got,)
        for g, w in zip(got, want):
            assert_same_bits(g, w)
        if not enabled:
            assert ran == 0
        elif serial_expected is not None:
            assert (ran > 0) == serial_expected, ran
    return want


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ---------------------------------------------------------------------------
# The device's own passes: R's chunks reproduced one after another.

# Sizes over GRAIN_SIZE whose 2-way split falls off a vector pair (50002,
# 65549, ...) or on one, and ragged tails.
SIZES = [32769, 65536, 65536 + 37, 100003, 131071, 200001]


@pytest.mark.parametrize("n", SIZES)
def test_lone_pointwise_ops_keep_bits(n):
    x = rand(n, seed=n)
    for fn in (torch.exp, torch.sigmoid, torch.tanh, F.silu, lambda t: torch.pow(t, 0.5 * 3)):
        check(fn, x)


@pytest.mark.parametrize("n", SIZES)
def test_fused_chains_keep_bits(n):
    x, y = rand(n, seed=n), rand(n, seed=n + 1)

    def chain(a, b):
        t = torch.tanh(a * 0.79788456 * (1 + 0.044715 * a * a))
        u = torch.exp(b - a) * torch.sigmoid(t)
        return 0.5 * a * (1 + t) + u, F.silu(u * b)

    check(chain, x, y)


def test_row_ops_and_repeat_steps_keep_bits():
    x = rand(96, 1024 + 3, seed=3)
    w = rand(1024 + 3, seed=4)

    def rms(a, b):
        v = (a * a).mean(-1, keepdim=True)
        return a * torch.rsqrt(v + 1e-6) * b

    check(rms, x, w)


def test_adamw_step_over_lists_keeps_bits():
    shapes = [(256, 256), (300, 217), (128,), (64, 100), (1000, 33), (257, 129)]
    params = [rand(*s, seed=i) for i, s in enumerate(shapes)]
    grads = [rand(*s, seed=100 + i) for i, s in enumerate(shapes)]
    results = {}
    for device, enabled in (("cpu", False), ("neuron", True), ("neuron", False)):
        ps = [torch.nn.Parameter(p.clone().to(device)) for p in params]
        opt = torch.optim.AdamW(ps, lr=1e-3)
        with serial(enabled):
            before = serial_runs() if device == "neuron" else 0
            for step in range(3):
                for p, g in zip(ps, grads):
                    p.grad = (g * (step + 1)).to(device)
                opt.step()
            ran = serial_runs() - before if device == "neuron" else 0
        results[(device, enabled)] = [p.detach().cpu() for p in ps]
        if device == "neuron":
            assert (ran > 0) == enabled
    for key in (("neuron", True), ("neuron", False)):
        for g, w in zip(results[key], results[("cpu", False)]):
            assert_same_bits(g, w)


# ---------------------------------------------------------------------------
# Listed ATen kernels.

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,length", [(4, 4, 64), (4, 2, 64), (2, 1, 100)])
def test_flash_attention_forward_and_backward_keep_bits(dtype, heads, kv_heads, length):
    q = rand(3, heads, length, 32, seed=1, dtype=dtype)
    k = rand(3, kv_heads, length, 32, seed=2, dtype=dtype)
    v = rand(3, kv_heads, length, 32, seed=3, dtype=dtype)
    g = rand(3, heads, length, 32, seed=4, dtype=dtype)

    def attention(q, k, v, g):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=heads != kv_heads)
        out.backward(g)
        return out, q.grad, k.grad, v.grad

    check(attention, q, k, v, g)


def test_flash_attention_of_one_head_is_not_serial():
    # batch x heads = 1: the reference computes its products outside a
    # parallel region, with every MKL thread: one thread would differ.
    q, k, v = (rand(1, 1, 300, 64, seed=s) for s in range(3))
    check(lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, True)[0], q, k, v, serial_expected=False)


@pytest.mark.parametrize("rows,cols", [(256, 256), (300, 1000), (7, 50000)])
def test_cross_entropy_forward_and_backward_keep_bits(rows, cols):
    logits = rand(rows, cols, seed=rows)
    target = torch.randint(0, cols, (rows,), generator=torch.Generator().manual_seed(cols))

    def loss(x, t):
        x = x.detach().requires_grad_()
        out = F.cross_entropy(x, t)
        out.backward()
        return out, x.grad

    check(loss, logits, target)


@pytest.mark.parametrize("shape,dims", [
    ((4, 64, 128), (0, 1)), ((300, 200), (0,)), ((7, 50, 333), (0, 1)), ((64, 1024), (0,)),
    ((33, 17, 129), (0, 2)), ((1000, 70), (1,))])
def test_reductions_to_many_values_keep_bits(shape, dims):
    x = rand(*shape, seed=sum(shape))
    check(lambda t: (t.sum(dims), t.mean(dims, keepdim=True)), x)


def test_reduction_to_one_value_is_not_serial():
    # two_pass_reduction: per-thread partial sums (thread-count dependent).
    x = rand(300000, seed=5).view(300, 1000)
    check(lambda t: t.sum((0, 1)), x, serial_expected=False)


@pytest.mark.parametrize("n,serial_expected", [
    (65536, True),        # 2 chunks of 32768: whole vector pairs
    (65536 + 128, True),  # 32832 each
    (100003, False),      # 50002: a chunk boundary inside a vector pair
])
def test_silu_backward_only_where_the_split_keeps_forms(n, serial_expected):
    x, g = rand(n, seed=1), rand(n, seed=2)
    check(lambda g, x: torch.ops.aten.silu_backward(g, x), g, x,
          serial_expected=serial_expected and torch.get_num_threads() == 2)


# ---------------------------------------------------------------------------
# BLAS products: calibrated geometries.

def operands(m, k, n, layout, dtype, device):
    a, b = rand(m, k, seed=m, dtype=dtype).to(device), rand(k, n, seed=n, dtype=dtype).to(device)
    if layout == "transposed":
        return a.t().contiguous().t(), b.t().contiguous().t()
    if layout == "sliced":
        return torch.nn.functional.pad(a, (0, 3))[:, :k], b
    return a, b


@pytest.mark.parametrize("m,k,n", [(256, 128, 256), (64, 256, 128), (5, 300, 7), (1, 64, 64)])
@pytest.mark.parametrize("layout", ["plain", "transposed", "sliced"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_small_products_keep_bits(m, k, n, layout, dtype):
    cpu_a, cpu_b = operands(m, k, n, layout, dtype, "cpu")
    want = cpu_a @ cpu_b
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        splits = not torch.equal(bits(cpu_a @ cpu_b), bits(want))
    finally:
        torch.set_num_threads(threads)
    a, b = operands(m, k, n, layout, dtype, "neuron")
    for enabled in (True, False):
        with serial(enabled):
            a @ b
            torch.neuron.synchronize()
            time.sleep(0.002)  # past the hot-team window of the operands' kernels
            before, planned = serial_runs(), _C._gemm_plans_made()
            got = a @ b
            ran, planned = serial_runs() - before, _C._gemm_plans_made() - planned
        assert_same_bits(got, want)
        # Serial where the product is a planned BLAS call (Gemm.h) whose
        # geometry keeps its bits on one thread (CPU's product shows whether
        # it does); ATen's kernel runs the others.
        # Products under 2^15 multiply-adds (kSerialMinWork) are not split
        # by MKL anyway and take no scope.
        serial_expected = enabled and not splits and m * k * n >= 2 ** 15
        assert ran == (planned if serial_expected else 0)


def _differs_on_one_thread(m, k, n):
    """Whether CPU's product of this geometry has other bits on one thread."""
    a, b = rand(m, k, seed=11), rand(k, n, seed=12)
    many = a @ b
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = a @ b
    finally:
        torch.set_num_threads(threads)
    return not torch.equal(bits(many), bits(one))


def test_a_geometry_split_by_threads_is_refused():
    # Long inner dimensions are what MKL splits between threads; the first
    # geometry that shows it on this machine must keep the reference's bits.
    candidates = [(128, 1024, 128), (64, 4096, 64), (32, 16384, 32), (16, 65536, 16)]
    found = next((c for c in candidates if _differs_on_one_thread(*c)), None)
    if found is None:
        pytest.skip("MKL splits none of these products' inner dimensions here")
    m, k, n = found
    a, b = rand(m, k, seed=11), rand(k, n, seed=12)
    tried, agreed = _C._serial_gemm_geometries()
    check(lambda a, b: a @ b, a, b, serial_expected=False)
    tried2, agreed2 = _C._serial_gemm_geometries()
    assert tried2 > tried and agreed2 == agreed


# ---------------------------------------------------------------------------
# The hot team: after a long kernel on every thread, small kernels use them.

def test_small_kernels_keep_every_thread_while_the_team_is_hot():
    # A large product (over 2^24 multiply-adds: every thread, milliseconds
    # here) leaves the compute team spinning; an eligible kernel queued right
    # behind it computes on every thread, and once the window (1 ms) has
    # passed it runs on one again. Its bits are CPU's either way.
    big = rand(1024, 1024, seed=1).to("neuron")
    x = rand(65536, seed=2)
    want, xd = torch.exp(x), x.to("neuron")
    with serial(True):
        torch.exp(xd)
        time.sleep(0.005)
        before = serial_runs()
        big @ big
        hot_result = torch.exp(xd)
        hot = serial_runs() - before
        time.sleep(0.005)
        before = serial_runs()
        cold_result = torch.exp(xd)
        cold = serial_runs() - before
    assert (hot, cold) == (0, 1)
    assert_same_bits(hot_result, want)
    assert_same_bits(cold_result, want)


# ---------------------------------------------------------------------------
# A whole small step: no parallel region once every kernel qualifies.

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
typedef void (*par_fn)(void (*)(void*), void*, unsigned, unsigned);
extern int omp_get_max_threads(void);
static long total;
void GOMP_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned flags) {
  static par_fn real;
  if (!real) real = (par_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
  if (threads != 1 && omp_get_max_threads() > 1) __atomic_add_fetch(&total, 1, __ATOMIC_RELAXED);
  real(fn, data, threads, flags);
}
long regions_total(void) { return __atomic_load_n(&total, __ATOMIC_RELAXED); }
"""

CHILD = textwrap.dedent(r"""
    import ctypes, sys, torch, torchneuron
    import torch.nn as nn, torch.nn.functional as F
    from torchneuron import _C
    counter = ctypes.CDLL(None).regions_total
    counter.restype = ctypes.c_long

    class Block(nn.Module):
        # A decoder block of the tiny Llama's sizes: RMSNorm, grouped-query
        # causal attention, a SiLU-gated MLP, a vocabulary head.
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(256, 128)
            self.q, self.o = nn.Linear(128, 128, bias=False), nn.Linear(128, 128, bias=False)
            self.k, self.v = nn.Linear(128, 64, bias=False), nn.Linear(128, 64, bias=False)
            self.gate, self.up = nn.Linear(128, 256, bias=False), nn.Linear(128, 256, bias=False)
            self.down = nn.Linear(256, 128, bias=False)
            self.w = nn.Parameter(torch.ones(128))
            self.head = nn.Linear(128, 256, bias=False)

        def norm(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w

        def forward(self, ids):
            x = self.emb(ids)
            h = self.norm(x)
            q = self.q(h).view(4, 64, 4, 32).transpose(1, 2)
            k = self.k(h).view(4, 64, 2, 32).transpose(1, 2)
            v = self.v(h).view(4, 64, 2, 32).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.o(a.transpose(1, 2).reshape(4, 64, 128))
            h = self.norm(x)
            x = x + self.down(F.silu(self.gate(h)) * self.up(h))
            return self.head(self.norm(x))

    def run(device, steps):
        torch.manual_seed(0)
        model = Block().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(1)).to(device)
        losses, regions = [], []
        for _ in range(steps):
            before = counter()
            logits = model(ids)
            loss = F.cross_entropy(logits.view(-1, 256), ids.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.detach().cpu())
            if device == "neuron":
                torch.neuron.synchronize()
            regions.append(counter() - before)
        return losses, [p.detach().cpu() for p in model.parameters()], regions

    cpu_losses, cpu_params, _ = run("cpu", 6)
    _C._set_serial_kernels_enabled(sys.argv[1] == "1")
    losses, params, regions = run("neuron", 6)
    same = all(torch.equal(a.view(torch.int32), b.view(torch.int32))
               for a, b in zip(losses + params, cpu_losses + cpu_params))
    print("RESULT", int(same), sum(regions[3:]))
""")


def _step_in_child(tmp_path, enabled):
    src, lib = tmp_path / "regions.c", tmp_path / "regions.so"
    src.write_text(SHIM)
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-o", str(lib),
                    str(src), "-ldl", "-lgomp"], check=True)
    env = dict(os.environ, LD_PRELOAD=str(lib))
    out = subprocess.run([sys.executable, "-c", CHILD, "1" if enabled else "0"], env=env,
                         capture_output=True, text=True, timeout=300)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line is not None, out.stdout + out.stderr
    _, same, regions = line.split()
    return same == "1", int(regions)


def test_a_small_training_step_opens_no_parallel_region(tmp_path):
    same, regions = _step_in_child(tmp_path, enabled=True)
    assert same
    assert regions == 0
    # The instrument can fail: without serial kernels the same steps open
    # the compute team's regions.
    same, regions = _step_in_child(tmp_path, enabled=False)
    assert same
    assert regions > 0
