"""List loops (csrc/aten/ListLoop.h): a list pass computes runs of foreach
mul_/div_/add_/lerp_/addcmul_/addcdiv_/sqrt over float32 lists in loops of its own
instead of calling each op's CPU kernel, with CPU's bits.

The ops are queued behind a long kernel, so they reach the device together
and run as one list pass (test_fusion.py's Hold); the fusion statistics show
how many ops the loops computed, and the values are compared with CPU bit for
bit. The inputs make the cases the loops must reproduce exactly: products
fused into an add (ATen's kernels use FMAs there), ragged ends (a kernel's
last < 32 elements take its scalar form), lists of small tensors and of
tensors split among threads and in blocks, and special values.
"""
import pytest
import torch

import torchneuron
from conftest import NEURON, cpu_has_flag, requires_async
from test_fusion import assert_bitwise, queued_behind_hold


# Where the loops may run (ATen's AVX2 or AVX-512 build, a CPU with
# AVX-512F), they are on only if their first use found them computing ATen's
# bits (ListLoop.cpp, loopsMatchAten): a loop that drifted from ATen turns
# them off with a warning, and this fails.
LOOPS_EXPECTED = (torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
                  and cpu_has_flag("avx512f"))

pytestmark = [
    requires_async,
    pytest.mark.skipif(not LOOPS_EXPECTED,
                       reason="no list loops here: ATen runs its DEFAULT build (no FMA) or the CPU lacks AVX-512F"),
]


def test_loops_pass_their_check_against_aten():
    assert torchneuron._C._list_loops_available()

SMALL = [1000 + 37 * i for i in range(12)]  # each tensor's op on one thread
LARGE = [70001, 5, 300007, 33000]          # split among threads, in blocks


def every_overload(ps, ms, vs, gs, ds):
    """Each overload a loop computes, in one list pass (15 ops)."""
    k = len(ps)
    torch._foreach_mul_(ps, 0.9987)                                        # mul_.Scalar
    torch._foreach_lerp_(ms, gs, 0.1)                                      # lerp_, |w| < 0.5
    torch._foreach_lerp_(vs, gs, 0.7)                                      # lerp_, |w| >= 0.5
    torch._foreach_mul_(vs, [0.5 + 0.01 * i for i in range(k)])            # mul_.ScalarList
    torch._foreach_addcmul_(vs, gs, gs, value=0.3)                         # addcmul_.Scalar
    torch._foreach_addcmul_(ms, gs, vs, [0.1 - 0.03 * i for i in range(k)])  # .ScalarList
    torch._foreach_add_(ds, vs, alpha=0.37)                                # add_.List
    torch._foreach_add_(ds, 1e-3)                                          # add_.Scalar
    torch._foreach_add_(ds, [0.25 * i for i in range(k)])                  # add_.ScalarList
    torch._foreach_div_(ds, [1.5 + i for i in range(k)])                   # div_.ScalarList
    torch._foreach_div_(ds, 1.7)                                           # div_.Scalar
    torch._foreach_div_(ms, ds)                                            # div_.List
    torch._foreach_mul_(ms, gs)                                            # mul_.List
    torch._foreach_addcdiv_(ps, ms, ds, value=-0.01)                       # addcdiv_.Scalar
    torch._foreach_addcdiv_(ps, ms, vs, [1e-3 * (i + 1) for i in range(k)])  # .ScalarList
    return ps + ms + vs + gs + ds


def make_inputs(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    lists = [[torch.randn(n, generator=g) for n in sizes] for _ in range(5)]
    # Special values, also among the last elements (a kernel's scalar form).
    for t in lists[3]:
        for i, v in zip((0, -1, -3, t.numel() // 2), (float("inf"), float("nan"), -0.0, 1e-40)):
            t[i] = v
    return lists


def run_device(program, inputs, loops=True):
    """program on device copies of inputs, queued behind a hold; its results on CPU."""
    torchneuron._C._set_list_loops_enabled(loops)
    try:
        dev = lambda: [[t.to(NEURON) for t in lst] for lst in inputs]  # noqa: E731
        program(*dev())  # a kind of call is verified the first time: not fused
        torch.neuron.synchronize()
        out = queued_behind_hold(program, dev)
        return [t.cpu() for t in out]
    finally:
        torchneuron._C._set_list_loops_enabled(True)


@pytest.mark.parametrize("sizes", [SMALL, LARGE], ids=["small", "large"])
def test_every_overload_in_one_pass_gives_cpus_bits(sizes):
    inputs = make_inputs(sizes)
    ref = every_overload(*[[t.clone() for t in lst] for lst in inputs])
    out = run_device(every_overload, inputs)
    stats = torchneuron.get_fusion_stats()
    assert_bitwise(out, ref)
    assert stats["list_loop_ops"] == 15 and stats["ops"] == 15, stats
    if max(sizes) > 32768:
        assert stats["blocked_list_passes"] == 1, stats
    # Loops off: the ops' own kernels in the same pass, the same bits.
    off = run_device(every_overload, inputs, loops=False)
    stats = torchneuron.get_fusion_stats()
    assert_bitwise(off, ref)
    assert stats["list_loop_ops"] == 0 and stats["ops"] == 15, stats


def functional_forms(ps, ms, vs, gs, ds):
    """The functional overloads an optimizer calls (SGD's weight decay and
    Nesterov step, Adam's weight decay): each queues its out= form, which a
    loop computes into the fresh results (8 ops)."""
    k = len(ps)
    g1 = torch._foreach_add(gs, ps, alpha=1e-2)                           # add.List
    g2 = torch._foreach_mul(g1, 0.9)                                      # mul.Scalar
    g3 = torch._foreach_addcmul(g2, ms, vs, value=0.5)                    # addcmul.Scalar
    g4 = torch._foreach_lerp(g3, ms, 0.25)                                # lerp.Scalar
    g5 = torch._foreach_div(g4, [2.0 + i for i in range(k)])              # div.ScalarList
    g6 = torch._foreach_addcdiv(g5, ms, ds, [-0.1] * k)                   # addcdiv.ScalarList
    g7 = torch._foreach_add(g6, 1.5)                                      # add.Scalar
    torch._foreach_add_(ps, g7, alpha=-0.1)                               # in place, reads them
    return [*ps, *g1, *g2, *g3, *g4, *g5, *g6, *g7]


@pytest.mark.parametrize("sizes", [SMALL, LARGE], ids=["small", "large"])
def test_functional_forms_compute_into_fresh_results_with_cpus_bits(sizes):
    inputs = make_inputs(sizes, seed=1)
    for t in inputs[4]:
        t.abs_().add_(0.5)  # divisors
    ref = functional_forms(*[[t.clone() for t in lst] for lst in inputs])
    out = run_device(functional_forms, inputs)
    stats = torchneuron.get_fusion_stats()
    assert_bitwise(out, ref)
    assert stats["list_loop_ops"] == 8 and stats["ops"] == 8, stats
    assert stats["by_op"].get("aten::_foreach_add.List_out") == 1, stats
    paths = torchneuron.get_op_paths()
    assert "aten::add.Tensor" not in paths, paths  # one call per list, not per tensor


def adam_denominator(ps, ms, vs, gs, ds):
    """Adam's step around its square root: the root joins the loop run
    instead of ending it (5 ops; the out= form, then the in-place one)."""
    k = len(ps)
    torch._foreach_addcmul_(vs, gs, gs, value=0.001)
    roots = torch._foreach_sqrt(vs)                                       # sqrt.out
    torch._foreach_div_(roots, [0.9 + 0.01 * i for i in range(k)])
    torch._foreach_sqrt_(ds)                                              # sqrt_
    torch._foreach_addcdiv_(ps, ms, roots, [-1e-3] * k)
    return ps + vs + list(roots) + ds


@pytest.mark.parametrize("sizes", [SMALL, LARGE], ids=["small", "large"])
def test_sqrt_runs_in_the_loop_with_cpus_bits(sizes):
    # ATen's float sqrt is MKL's, not IEEE's correctly rounded root (a
    # loop of _mm512_sqrt_ps differs in the last bit and in NaN's sign):
    # the loop hands its tiles to the same call. ds holds negative numbers,
    # signed zeros, infinities, NaN and subnormals, also in the last elements.
    inputs = make_inputs(sizes, seed=2)
    inputs[2] = [v.abs() for v in inputs[2]]
    for t in inputs[4]:
        for i, v in zip((0, 1, -1, -2, -3, -4, -5, t.numel() // 2),
                        (-1.5, -0.0, 0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -1e-40)):
            t[i] = v
    ref = adam_denominator(*[[t.clone() for t in lst] for lst in inputs])
    out = run_device(adam_denominator, inputs)
    stats = torchneuron.get_fusion_stats()
    assert_bitwise(out, ref)
    assert stats["list_loop_ops"] == 5 and stats["ops"] == 5, stats
    # The root by its kernel, in the same pass: the same bits (and no loop
    # at all: the roots' kernels split the others into runs of one op, which
    # their own kernels compute).
    torchneuron._C._set_sqrt_loops_enabled(False)
    try:
        off = run_device(adam_denominator, inputs)
    finally:
        torchneuron._C._set_sqrt_loops_enabled(True)
    stats = torchneuron.get_fusion_stats()
    assert_bitwise(off, ref)
    assert stats["list_loop_ops"] == 0 and stats["ops"] == 5, stats


def test_the_inputs_tell_a_fused_multiply_add_apart():
    # What makes the test above able to fail: on these values, rounding the
    # product before the add (what a loop without FMAs computes) differs from
    # ATen's kernels, in the vector body and in the scalar tail alike.
    gen = torch.Generator().manual_seed(1)
    g, v = torch.randn(4099, generator=gen), torch.randn(4099, generator=gen)
    separate = v + (0.3 * g) * g
    assert not torch.equal(torch.addcmul(v, g, g, value=0.3), separate)
    assert not torch.equal(torch.addcmul(v[-20:], g[-20:], g[-20:], value=0.3), separate[-20:])
    assert not torch.equal(torch.add(v, g, alpha=0.37), v + 0.37 * g)
    assert not torch.equal(torch.lerp(v, g, 0.1), v + 0.1 * (g - v))
    # ... and ATen's sqrt from the correctly rounded root (what a loop of
    # _mm512_sqrt_ps would give), on positive values and in NaN's sign.
    import numpy as np
    x = torch.cat([g.abs(), -g.abs()[:3]])
    with np.errstate(invalid="ignore"):
        rounded = torch.from_numpy(np.sqrt(x.numpy()))
    assert not torch.equal(torch.sqrt(x).view(torch.int32), rounded.view(torch.int32))


@pytest.mark.parametrize("sizes", [SMALL, LARGE], ids=["small", "large"])
def test_adam_family_steps_give_cpus_bits(sizes):
    # PyTorch's optimizers as users run them (foreach by default on neuron).
    makers = [lambda ps: torch.optim.AdamW(ps, lr=1e-2),
              lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1),
              lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-2,
                                         nesterov=True),
              lambda ps: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.5)]
    for make in makers:
        torch.manual_seed(0)
        cpu = [torch.nn.Parameter(torch.randn(n)) for n in sizes]
        dev = [torch.nn.Parameter(p.detach().to(NEURON)) for p in cpu]
        opt_cpu, opt_dev = make(cpu), make(dev)
        torchneuron.clear_op_tracking()
        for _ in range(3):
            grads = [torch.randn(n) for n in sizes]
            for p, q, gr in zip(cpu, dev, grads):
                p.grad, q.grad = gr, gr.to(NEURON)
            opt_cpu.step()
            opt_dev.step()
        torch.neuron.synchronize()
        assert_bitwise([q.detach().cpu() for q in dev], [p.detach() for p in cpu])
        if isinstance(opt_cpu, torch.optim.AdamW):
            assert torchneuron.get_fusion_stats()["list_loop_ops"] > 0


def test_a_scalar_aten_refuses_still_raises_at_the_op():
    # addcmul converts its value to float and raises on overflow: a loop must
    # not compute the op with an infinite value instead.
    xs = [torch.ones(40000), torch.ones(3)]
    with pytest.raises(RuntimeError, match="cannot be converted to type float"):
        torch._foreach_addcmul_(xs, xs, xs, value=1e39)
    dev = [x.to(NEURON) for x in xs]
    with pytest.raises(RuntimeError, match="cannot be converted to type float"):
        torch._foreach_mul_(dev, 2.0)
        torch._foreach_addcmul_(dev, dev, dev, value=1e39)
        torch.neuron.synchronize()
    # The device keeps working, the ops before the error applied once.
    torch._foreach_add_(dev, 1.0)
    assert_bitwise([d.cpu() for d in dev], [torch.full((40000,), 3.0), torch.full((3,), 3.0)])


FLAT_SIZES = [1, 15, 17, 100, 4095, 4096 + 17, 70001]  # vector body and tails; small and fusible


@pytest.mark.parametrize("loops", [True, False], ids=["loop", "kernel"])
def test_flat_float_ops_run_as_loop_steps_with_cpus_bits(loops):
    # add/sub/mul/div on dense float32 tensors of one size (functional,
    # in place, out=) are queued as a list loop's step instead of ATen's
    # kernel behind a TensorIterator; the same bits either way.
    gen = torch.Generator().manual_seed(3)
    calls = [
        lambda x, y: x + y,
        lambda x, y: torch.add(x, y, alpha=0.37),
        lambda x, y: torch.sub(x, y, alpha=3),
        lambda x, y: x - y,
        lambda x, y: x * y,
        lambda x, y: x / y,
        lambda x, y: x.clone().add_(y, alpha=-1.7e-3),
        lambda x, y: x.clone().div_(y),
        lambda x, y: torch.mul(x, y, out=torch.empty_like(x)),
        # A CPU scalar second, converted to float as TensorIterator converts it.
        lambda x, y: x * 2.5,
        lambda x, y: x + 1e-3,
        lambda x, y: x - 7,
        lambda x, y: x / 1.7,
        lambda x, y: torch.sub(x, 1e-5, alpha=3),
        lambda x, y: x.clone().mul_(torch.tensor(3.3, dtype=torch.float64)),
        lambda x, y: x * (2 ** 60 + 1),
        lambda x, y: x * 1e39,
        # A float32 device 0-dim second, read when the step runs.
        lambda x, y: x * y[0],
        lambda x, y: torch.add(x, y[-1], alpha=0.37),
        lambda x, y: x.clone().div_(y[0]),
        lambda x, y: x - y.mul(3.0)[0],  # written by the op queued just before
    ]
    torchneuron._C._set_list_loops_enabled(loops)
    try:
        torchneuron.clear_op_tracking()
        for n in FLAT_SIZES:
            x, y = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
            special = (float("inf"), float("nan"), -0.0, 1e-40, 3e38, float("-inf"))
            for i, v in enumerate(special[:n]):
                x[i] = v
                y[-1 - i] = v
            for call in calls:
                assert_bitwise([call(x.to(NEURON), y.to(NEURON)).cpu()], [call(x, y)])
        torch.neuron.synchronize()
        counted = torchneuron.get_fusion_stats()["flat_loop_ops"]
    finally:
        torchneuron._C._set_list_loops_enabled(True)
    # One call queues two flat ops (y.mul(3.0), then the subtraction).
    assert counted == (len(FLAT_SIZES) * (len(calls) + 1) if loops else 0)


def test_flat_ops_the_loop_does_not_take_keep_atens_behaviour():
    # A device 0-dim operand of another dtype or first, another dtype, a
    # broadcast (a repeat step instead), an operand overlapping the output:
    # ATen's kernel. An alpha beyond float's range raises at the op, as on CPU.
    x = torch.randn(100)
    d = x.to(NEURON)
    torchneuron.clear_op_tracking()
    assert_bitwise([(d * d[3].double()).cpu(), (d[3] * d).cpu(), (d.double() + d.double()).cpu(),
                    (d + d[:1]).cpu()],
                   [x * x[3].double(), x[3] * x, x.double() + x.double(), x + x[:1]])
    for t in (x, d):  # an operand overlapping the output: CPU's error at the op
        c = t.clone()
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            c.mul_(c[5])
    torch.neuron.synchronize()
    assert torchneuron.get_fusion_stats()["flat_loop_ops"] == 0
    assert torchneuron.get_fusion_stats()["broadcast_loop_ops"] == 1  # d + d[:1]
    with pytest.raises(RuntimeError, match="cannot be converted to type float"):
        torch.add(x, x, alpha=1e39)
    with pytest.raises(RuntimeError, match="cannot be converted to type float"):
        torch.add(d, d, alpha=1e39)
        torch.neuron.synchronize()
    assert_bitwise([(d + d).cpu()], [x + x])  # the device keeps working


# (output shape, broadcast operand's shape): a value per row (rows of 16 or
# more), a column operand, a run of broadcast dims in the middle, size-1
# dims of the output, stretches with ragged vector tails, a single row.
REPEAT_SHAPES = [
    ((4, 64, 128), (4, 64, 1)),
    ((7, 300), (7, 1)),
    ((5, 1, 40), (5, 1, 1)),
    ((100,), (1,)),
    ((4, 64, 128), (128,)),
    ((3, 17, 33), (3, 1, 33)),
    ((4, 4, 64, 32), (1, 1, 64, 32)),
    ((2, 3, 5, 24), (2, 1, 1, 24)),
    ((2, 40, 1000), (2, 1, 1000)),  # fusible size, several chunks
]


def _repeat_inputs(out_shape, b_shape, gen):
    x, b = torch.randn(out_shape, generator=gen), torch.randn(b_shape, generator=gen)
    special = (float("inf"), float("nan"), -0.0, 1e-40, 3e38, float("-inf"), 0.0)
    for i, v in enumerate(special):
        x.view(-1)[i * 7 % x.numel()] = v
        b.view(-1)[-1 - i % b.numel()] = v
    return x, b


@pytest.mark.parametrize("loops", [True, False], ids=["loop", "kernel"])
def test_broadcast_float_ops_run_as_repeat_steps_with_cpus_bits(loops):
    # mul/div and add/sub with alpha 1 on float32 where one operand repeats
    # along one run of broadcast dims (either operand): each element is one
    # IEEE operation in ATen's kernel and in the repeat step alike.
    calls = [
        lambda x, b: x * b,
        lambda x, b: b * x,       # the repeated operand first
        lambda x, b: x / b,
        lambda x, b: b / x,
        lambda x, b: x + b,
        lambda x, b: b - x,
        lambda x, b: torch.sub(x, b, alpha=1),
        lambda x, b: x.clone().mul_(b),
        lambda x, b: x.clone().sub_(b),
        lambda x, b: torch.div(x, b, out=torch.empty_like(x)),
    ]
    gen = torch.Generator().manual_seed(5)
    torchneuron._C._set_list_loops_enabled(loops)
    try:
        torchneuron.clear_op_tracking()
        for out_shape, b_shape in REPEAT_SHAPES:
            x, b = _repeat_inputs(out_shape, b_shape, gen)
            for call in calls:
                assert_bitwise([call(x.to(NEURON), b.to(NEURON)).cpu()], [call(x, b)])
        torch.neuron.synchronize()
        stats = torchneuron.get_fusion_stats()
    finally:
        torchneuron._C._set_list_loops_enabled(True)
    # A value per row cannot be the first operand (b * x, b / x, b - x).
    rows = sum(1 for o, b in REPEAT_SHAPES if b[-1] == 1)
    expected = len(REPEAT_SHAPES) * len(calls) - 3 * rows
    assert stats["broadcast_loop_ops"] == (expected if loops else 0)
    assert stats["flat_loop_ops"] == 0


def test_broadcasts_the_repeat_step_does_not_take_keep_atens_behaviour():
    # alpha other than 1 (a product fused into the add: ATen's row tails may
    # round it apart), two runs of broadcast dims, short stretches, a
    # non-contiguous or non-float operand: ATen's kernel, the same bits.
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(4, 6, 40, generator=gen)
    mul = lambda x, b: x * b  # noqa: E731
    cases = [
        (lambda x, b: torch.add(x, b, alpha=0.5), x, torch.randn(4, 6, 1, generator=gen)),
        (mul, x, torch.randn(1, 6, 1, generator=gen)),                     # two runs
        (mul, torch.randn(4, 6, 8, generator=gen), torch.randn(8, generator=gen)),       # short
        (mul, torch.randn(4, 6, 8, generator=gen), torch.randn(4, 6, 1, generator=gen)),  # rows: 8
        (mul, torch.randn(40, 6, 4, generator=gen).transpose(0, 2),                      # strided
         torch.randn(4, 6, 1, generator=gen)),
        (lambda x, b: x * b[..., :1], x, torch.randn(4, 6, 2, generator=gen)),  # not contiguous
        (mul, x.double(), torch.randn(4, 6, 1, generator=gen, dtype=torch.double)),
        (mul, x.bfloat16(), torch.randn(4, 6, 1, generator=gen).bfloat16()),
    ]
    torchneuron.clear_op_tracking()
    for call, a, b in cases:
        assert_bitwise([call(a.to(NEURON), b.to(NEURON)).cpu().contiguous()],
                       [call(a, b).contiguous()])
    torch.neuron.synchronize()
    assert torchneuron.get_fusion_stats()["broadcast_loop_ops"] == 0


def test_broadcast_chains_fuse_with_cpus_bits():
    # RMSNorm's tail and a centred square (x * rstd[..., None] * w, then
    # (y - m) ** 2 as a product): repeat steps and flat steps in one pass.
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(64, 1024, generator=gen)
    rstd, w, m = (torch.rand(64, 1, generator=gen) + 0.5, torch.randn(1024, generator=gen),
                  torch.randn(64, 1, generator=gen))

    def chain(x, rstd, w, m):
        y = w * (x * rstd)
        c = y - m
        return [y, c * c / rstd]

    ref = chain(x, rstd, w, m)
    args = (x.to(NEURON), rstd.to(NEURON), w.to(NEURON), m.to(NEURON))
    out = queued_behind_hold(lambda: chain(*args))
    torch.neuron.synchronize()
    stats = torchneuron.get_fusion_stats()
    assert_bitwise([t.cpu() for t in out], ref)
    assert stats["broadcast_loop_ops"] == 4 and stats["flat_loop_ops"] == 1
    assert stats["passes"] == 1 and stats["ops"] == 5, stats


def test_a_broadcast_operand_the_pass_writes_ends_the_pass():
    # The pass writes, block by block, the very bytes a broadcast operand
    # reads at every block (a bool result viewed as float32 columns): the op
    # must wait for the whole write, not join the pass.
    n = 4 * 16384
    gen = torch.Generator().manual_seed(8)
    a, x = torch.randn(n, generator=gen), torch.randn(4, n // 4, generator=gen)

    def chain(a, x):
        flags = torch.empty(n, dtype=torch.bool, device=a.device)
        torch.gt(a, 0, out=flags)
        return [x * flags.view(torch.float32)]

    ref = chain(a, x)
    ad, xd = a.to(NEURON), x.to(NEURON)
    for _ in range(3):
        out = queued_behind_hold(lambda: chain(ad, xd))
        torch.neuron.synchronize()
        stats = torchneuron.get_fusion_stats()
        assert stats["broadcast_loop_ops"] == 1
        assert "aten::mul.Tensor" not in stats["by_op"], stats
        assert torch.equal(out[0].cpu().view(torch.int32), ref[0].view(torch.int32))
