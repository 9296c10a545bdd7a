"""The direct paths of add, sub, mul, div, relu, sum, mean, mm, addmm, fill_,
zero_ and common unary ops (csrc/aten/DirectOp.h).

Each hot op checks its arguments on the host and queues CPU's kernel over
device memory, skipping the generic path's boxing, keys and Meta pass. The
tests hold them to CPU's bits over dtypes and layouts, to CPU's exceptions
for the calls they hand to the generic path, and to asynchrony: with the
generic path made synchronous (the debugging switch TORCHNEURON_ASYNC=0
flips), a direct op still returns while a long kernel holds the stream.
"""
import os

import pytest
import torch
import torch.nn.functional as F

import torchneuron

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def on(t):
    return t.to("neuron")


def same(neuron_result, cpu_result):
    got = neuron_result.cpu()
    assert got.dtype == cpu_result.dtype
    assert got.shape == cpu_result.shape
    assert got.stride() == cpu_result.stride()
    assert torch.equal(got, cpu_result) or (
        got.isnan().equal(cpu_result.isnan())
        and torch.equal(got.nan_to_num(), cpu_result.nan_to_num()))


def layouts(shape, dtype):
    """(cpu, neuron) pairs of one input in the same layout: contiguous,
    transposed, strided-sliced and channels-last (made on each device, since
    a copy to neuron makes a non-dense tensor contiguous)."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(shape, generator=g).to(dtype)
    views = [lambda t: t, lambda t: t.transpose(0, -1), lambda t: t[..., ::2]]
    if base.dim() == 4:
        views.append(lambda t: t.contiguous(memory_format=torch.channels_last))
    for view in views:
        x, nx = view(base), view(on(base))
        assert nx.stride() == x.stride()
        yield x, nx


BINARY = {
    "add": lambda a, b: torch.add(a, b, alpha=2),
    "sub": lambda a, b: torch.sub(a, b, alpha=3),
    "mul": torch.mul,
    "div": torch.div,
}


@pytest.mark.parametrize("dtype", DTYPES + [torch.int32, torch.int64, torch.complex64])
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_ops_match_cpu(op, dtype):
    f = BINARY[op]
    g = torch.Generator().manual_seed(3)
    a = (torch.randn(6, 7, generator=g) * 10).to(dtype)
    b = (torch.randn(6, 7, generator=g) * 10).to(dtype)
    if not (dtype.is_floating_point or dtype.is_complex):
        b = b.masked_fill(b == 0, 3)  # integer division by zero is not the point here
    same(f(on(a), on(b)), f(a, b))                       # functional, same shape
    same(f(on(a), on(b[0])), f(a, b[0]))                 # broadcast
    same(f(on(a.t()), on(b.t())), f(a.t(), b.t()))       # transposed operands
    same(f(on(a), 3), f(a, 3))                           # a Python scalar
    if f(a, b).dtype == dtype:                           # in place where CPU allows it
        x, nx = a.clone(), on(a)
        getattr(x, op + "_")(b)
        getattr(nx, op + "_")(on(b))
        same(nx, x)
    if op in ("add", "sub") and dtype.is_floating_point:  # a float alpha
        same(getattr(torch, op)(on(a), on(b), alpha=0.25), getattr(torch, op)(a, b, alpha=0.25))
    out, nout = torch.empty(6, 7, dtype=f(a, b).dtype), on(torch.empty(6, 7, dtype=f(a, b).dtype))
    getattr(torch, op)(a, b, out=out)
    getattr(torch, op)(on(a), on(b), out=nout)
    same(nout, out)


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_ops_on_flat_operands_match_cpu(op):
    """Calls whose device operands are all contiguous of the output's shape
    or 0-dim run over 1-D views (Pointwise.cpp's FlatOperand): storage
    offsets, 0-dim device operands, mixed dtypes and outputs that are slices
    of larger buffers must come out as on CPU, and nothing outside them may
    change."""
    f = BINARY[op]
    g = torch.Generator().manual_seed(5)
    base = torch.randn(6, 5, 7, generator=g)
    other = torch.randn(5, 5, 7, generator=g) + 4  # no zero divisors
    a, na = base[1:], on(base)[1:]                 # contiguous, storage offset 35
    assert na.is_contiguous() and na.storage_offset() == 35
    same(f(na, on(other)), f(a, other))
    for scalar in (torch.tensor(2.5), torch.tensor(3, dtype=torch.int64),
                   torch.tensor(0.5, dtype=torch.float64)):
        same(f(na, on(scalar)), f(a, scalar))      # a 0-dim device operand
        same(f(on(scalar), na), f(scalar, a))
    ints = (other * 3).to(torch.int32)
    same(f(na, on(ints)), f(a, ints))              # promotion, same shape
    same(f(on(ints), na), f(ints, a))
    buf, nbuf = torch.zeros(7, 5, 7), on(torch.zeros(7, 5, 7))
    getattr(torch, op)(a, other, out=buf[1:6])     # out= a slice
    getattr(torch, op)(na, on(other), out=nbuf[1:6])
    same(nbuf, buf)
    x, nx = base.clone(), on(base)
    getattr(x[2:4], op + "_")(other[:2])           # in place on a slice
    getattr(nx[2:4], op + "_")(on(other)[:2])
    same(nx, x)


SCALARS = [0.3, -2, True, 1e300, float("nan"), 2**40, 3 + 2j,
           torch.tensor(0.3, dtype=torch.float64), torch.tensor(-1.5, dtype=torch.float16),
           torch.tensor(7, dtype=torch.int16)]


def outcome(fn):
    try:
        return fn()
    except (RuntimeError, TypeError) as e:
        return e


def same_outcome(neuron, cpu):
    if isinstance(cpu, Exception):
        assert type(neuron) is type(cpu) and str(neuron) == str(cpu), (neuron, cpu)
    else:
        assert not isinstance(neuron, Exception), neuron
        if cpu.dtype == torch.complex32:  # no comparison kernels: compare exactly widened
            assert neuron.dtype == cpu.dtype
            neuron, cpu = on(neuron.cpu().to(torch.complex64)), cpu.to(torch.complex64)
        same(neuron, cpu)


@pytest.mark.parametrize("n", [64, 8192])  # queued alone / fusible
@pytest.mark.parametrize("dtype", DTYPES + [torch.int32, torch.int64, torch.uint8, torch.bool,
                                            torch.complex64])
@pytest.mark.parametrize("op", sorted(BINARY))
def test_scalar_operands_match_cpu(op, dtype, n):
    # A Python number or CPU scalar tensor reaches CPU's kernel in the dtype
    # it computes in (HostScalar.h); Half and BFloat16 keep it as given.
    f = BINARY[op]
    g = torch.Generator().manual_seed(5)
    a = (torch.randn(n, generator=g) * 10).to(dtype)
    for s in SCALARS:
        same_outcome(outcome(lambda: f(on(a), s)), outcome(lambda: f(a, s)))
        x, nx = a.clone(), on(a)
        same_outcome(outcome(lambda: getattr(nx, op + "_")(s)),
                     outcome(lambda: getattr(x, op + "_")(s)))
        same_outcome(outcome(lambda: nx), outcome(lambda: x))  # nothing written on failure
        for out_dtype in (dtype, torch.float64):
            out, nout = torch.empty(n, dtype=out_dtype), on(torch.empty(n, dtype=out_dtype))
            cpu = outcome(lambda: getattr(torch, op)(a, s, out=out))
            same_outcome(outcome(lambda: getattr(torch, op)(on(a), s, out=nout)), cpu)


@pytest.mark.parametrize("call", [
    lambda a, b: a.bool() - b.bool(),                    # sub of bools
    lambda a, b: torch.sub(a.long(), b.long(), alpha=0.5),  # float alpha, integer tensors
    lambda a, b: a.long().div_(b.long()),                # true division cannot stay integral
    lambda a, b: torch.add(a, b[:2]),                    # shapes do not broadcast
])
def test_bad_binary_calls_raise_as_cpu_and_the_device_keeps_working(call):
    a, b = torch.randn(4, 3), torch.randn(4, 3) + 5
    with pytest.raises(RuntimeError) as cpu_err:
        call(a, b)
    with pytest.raises(RuntimeError) as neuron_err:
        call(on(a), on(b))
    assert str(neuron_err.value) == str(cpu_err.value)
    same(on(a) / on(b), a / b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64,), (3, 5, 7), (2, 3, 4, 5), (70, 70)])
def test_relu_matches_cpu(dtype, shape):
    for x, nx in layouts(shape, dtype):
        same(torch.relu(nx), torch.relu(x))
        same(nx.clone().relu_(), x.clone().relu_())
        x, nx = x.clone(), nx.clone()
        x.relu_()
        nx.relu_()
        same(nx, x)


UNARY = ["exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "neg", "abs",
         "reciprocal", "log1p", "expm1"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", UNARY + ["silu"])
def test_unary_ops_match_cpu(op, dtype):
    # Values over each op's domain and outside it (NaN results), signed
    # zeros, infinities and tiny values; contiguous, transposed, sliced,
    # offset (a contiguous slice) and channels-last inputs (made on each
    # device), and a large one the direct path leaves to fusion. Bits and
    # strides are compared, NaNs included.
    f = getattr(F, op) if op == "silu" else getattr(torch, op)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-30, -1e-30])
    views = [lambda t: t, lambda t: t.transpose(0, -1), lambda t: t[..., ::2], lambda t: t[1:],
             lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t]
    for shape in [(64,), (3, 5, 7), (2, 3, 4, 5), (70, 70), (5000,)]:
        base = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 4
        base.view(-1)[:7] = special
        base = base.to(dtype)
        for view in views:
            x, nx = view(base), view(on(base))
            got, want = f(nx).cpu(), f(x)
            assert got.stride() == want.stride(), (op, dtype, shape)
            assert torch.equal(bits(got), bits(want)), (op, dtype, shape)


def test_unary_ops_on_other_dtypes_take_the_generic_path():
    x = torch.tensor([-3, 0, 4], dtype=torch.int32)
    same(torch.exp(on(x)), torch.exp(x))       # promoted to float
    same(torch.neg(on(x)), torch.neg(x))       # stays integral
    same(torch.abs(on(x)), torch.abs(x))
    z = torch.randn(4, dtype=torch.complex64)
    same(torch.abs(on(z)), torch.abs(z))       # a real result
    with pytest.raises(RuntimeError) as cpu_err:
        torch.neg(torch.tensor([True]))
    with pytest.raises(RuntimeError) as neuron_err:
        torch.neg(on(torch.tensor([True])))
    assert str(neuron_err.value) == str(cpu_err.value)


def test_relu_keeps_nan_and_signed_zero_as_cpu():
    x = torch.tensor([float("nan"), -0.0, 0.0, -1.0, float("inf"), -float("inf")])
    for got, want in [(torch.relu(on(x)).cpu(), torch.relu(x)),
                      (on(x).relu_().cpu(), x.clone().relu_())]:
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(torch.signbit(got), torch.signbit(want))


def test_relu_inplace_on_a_slice_touches_only_the_slice():
    x = torch.randn(8, 8)
    nx = on(x)
    nx[:, 1::3].relu_()
    want = x.clone()
    want[:, 1::3].relu_()
    same(nx, want)


def test_relu_inplace_on_overlapping_memory_raises_as_cpu():
    x = torch.randn(1, 4).expand(3, 4)
    with pytest.raises(RuntimeError) as cpu_err:
        x.relu_()
    with pytest.raises(RuntimeError) as neuron_err:
        on(torch.randn(1, 4)).expand(3, 4).relu_()
    assert str(neuron_err.value).split("\n")[0] == str(cpu_err.value).split("\n")[0]


def bits(t):
    return t.contiguous().view(-1).view(torch.uint8) if t.dtype != torch.bool else t


@pytest.mark.parametrize("dtype", DTYPES + [torch.int32, torch.bool, torch.complex64])
@pytest.mark.parametrize("shape", [(64,), (3, 5, 7), (2, 3, 4, 5), (70, 70)])
def test_fill_and_zero_match_cpu(dtype, shape):
    # Bits are compared: -0.0 and NaN payloads included.
    values = [0, 7, True] if dtype in (torch.int32, torch.bool) else [2.5, -0.0, 7, float("inf"), float("nan"), 1e-40]
    for x, nx in layouts(shape, torch.float32):
        x, nx = x.to(dtype), nx.to(dtype)
        for value in values:
            a, na = x.clone(), nx.clone()
            a.fill_(value)
            na.fill_(value)
            assert torch.equal(bits(na.cpu()), bits(a))
        a, na = x.clone(), nx.clone()
        a.zero_()
        na.zero_()
        assert torch.equal(bits(na.cpu()), bits(a)) and na.stride() == a.stride()
    # Factories that end in them, and an expanded tensor (CPU fills it as is).
    same(torch.zeros(shape, dtype=dtype, device="neuron"), torch.zeros(shape, dtype=dtype))
    same(torch.ones(shape, dtype=dtype, device="neuron"), torch.ones(shape, dtype=dtype))
    same(torch.full(shape, 3, dtype=dtype, device="neuron"), torch.full(shape, 3, dtype=dtype))
    base, nbase = torch.randn(1, 4).to(dtype), on(torch.randn(1, 4)).to(dtype)
    nbase.copy_(base)
    base.expand(3, 4).fill_(1)
    nbase.expand(3, 4).fill_(1)
    base.expand(3, 4).zero_()
    nbase.expand(3, 4).zero_()
    same(nbase, base)


@pytest.mark.parametrize("call", [
    lambda t: t.half().fill_(1e10),        # out of Half's range
    lambda t: t.fill_(complex(1, 2)),      # a complex value into a real tensor
    # out of int32's range, after a fill of the same kind (through the generic
    # path, that one was verified and this one queued: it failed on the
    # device and was reported at a later call)
    lambda t: t.int().fill_(3).fill_(2.0 ** 40),
])
def test_bad_fills_raise_as_cpu_and_the_device_keeps_working(call):
    with pytest.raises(RuntimeError) as cpu_err:
        call(torch.zeros(5))
    with pytest.raises(RuntimeError) as neuron_err:
        call(on(torch.zeros(5)))
    assert str(neuron_err.value) == str(cpu_err.value)
    same(on(torch.ones(3)).fill_(2), torch.ones(3).fill_(2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim,keepdim", [
    (None, False), ((), False), (0, False), (-1, True), ((0, 2), False), ((2, 0), True),
    ((-1, -2, 0), False)])
def test_sum_matches_cpu(dtype, dim, keepdim):
    for x, nx in layouts((6, 5, 33), dtype):
        if dim is None:
            same(nx.sum(), x.sum())
        else:
            same(nx.sum(dim, keepdim=keepdim), x.sum(dim, keepdim=keepdim))
            same(nx.sum(dim, keepdim=keepdim, dtype=dtype),
                 x.sum(dim, keepdim=keepdim, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim,keepdim", [
    (None, False), ((), True), (0, False), (-1, True), ((1, 2), False), ((-1, -2, 0), True)])
def test_mean_matches_cpu(dtype, dim, keepdim):
    # Contiguous float and double inputs reduced over trailing dims take the
    # row kernel (test_row_sums.py); the rest the generic path.
    for x, nx in layouts((6, 5, 33), dtype):
        if dim is None:
            same(nx.mean(), x.mean())
        else:
            same(nx.mean(dim, keepdim=keepdim), x.mean(dim, keepdim=keepdim))


def test_sum_of_integers_and_to_another_dtype_matches_cpu():
    x = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    same(on(x).sum(), x.sum())
    same(on(x).sum(1), x.sum(1))
    y = torch.randn(4, 6)
    same(on(y).sum(0, dtype=torch.float64), y.sum(0, dtype=torch.float64))


@pytest.mark.parametrize("call,error", [
    (lambda t: t.sum(3), IndexError),
    (lambda t: t.sum((0, 0)), RuntimeError),
    (lambda t: t.sum((1, -1)), RuntimeError),
])
def test_bad_sum_dims_raise_as_cpu_and_the_device_keeps_working(call, error):
    x = torch.randn(4, 5)
    with pytest.raises(error) as cpu_err:
        call(x)
    with pytest.raises(error) as neuron_err:
        call(on(x))
    assert str(neuron_err.value) == str(cpu_err.value)
    same(on(x).sum(0), x.sum(0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k,m", [(1, 1, 1), (8, 8, 8), (5, 17, 3), (64, 33, 40)])
def test_mm_and_addmm_match_cpu(dtype, n, k, m):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(k, m, generator=g).to(dtype)
    bt = torch.randn(m, k, generator=g).to(dtype).t()  # a transposed operand
    same(torch.mm(on(a), on(b)), torch.mm(a, b))
    same(torch.mm(on(a), on(bt)), torch.mm(a, bt))
    same(torch.mm(on(b.t()), on(a.t())), torch.mm(b.t(), a.t()))
    for bias in (torch.randn(m, generator=g), torch.randn(n, m, generator=g),
                 torch.randn(1, m, generator=g), torch.randn(n, 1, generator=g)):
        bias = bias.to(dtype)
        same(torch.addmm(on(bias), on(a), on(b)), torch.addmm(bias, a, b))
        for beta, alpha in ((0.5, 2), (0, 1.5), (2, -1)):
            same(torch.addmm(on(bias), on(a), on(bt), beta=beta, alpha=alpha),
                 torch.addmm(bias, a, bt, beta=beta, alpha=alpha))


def test_linear_matches_cpu():
    g = torch.Generator().manual_seed(2)
    x, w, b = (torch.randn(8, 16, generator=g), torch.randn(12, 16, generator=g),
               torch.randn(12, generator=g))
    same(F.linear(on(x), on(w), on(b)), F.linear(x, w, b))
    same(F.linear(on(x), on(w)), F.linear(x, w))


@pytest.mark.parametrize("call", [
    lambda a, b: torch.mm(a, b.t()),                     # inner sizes differ
    lambda a, b: torch.mm(a, b.double()),                # dtypes differ
    lambda a, b: torch.mm(a, b[0]),                      # not a matrix
    lambda a, b: torch.addmm(torch.zeros(3, 1, device=a.device), a, b[:, :4]),  # bias too small
    lambda a, b: torch.addmm(a[:, :1], a, b.half()),     # dtypes differ
])
def test_bad_matmuls_raise_as_cpu_and_the_device_keeps_working(call):
    a, b = torch.randn(6, 5), torch.randn(5, 7)
    with pytest.raises(RuntimeError) as cpu_err:
        call(a, b)
    with pytest.raises(RuntimeError) as neuron_err:
        call(on(a), on(b))
    assert str(neuron_err.value) == str(cpu_err.value)
    same(torch.mm(on(a), on(b)), torch.mm(a, b))


@pytest.mark.skipif(os.environ.get("NEURON_LAUNCH_BLOCKING") == "1", reason="observes asynchrony")
def test_direct_ops_queue_even_with_the_generic_path_synchronous():
    # With the generic path inline, only a direct path can return while the
    # stream is busy: this fails for an op that lost its direct path.
    x, w, b, m = torch.randn(8, 16), torch.randn(4, 16), torch.randn(4), torch.randn(8, 8)
    nx, nw, nb, nm = on(x), on(w), on(b), on(m)
    torch.neuron.synchronize()
    torchneuron._C._set_async_path(False)
    torchneuron.clear_op_tracking()
    try:
        torch.neuron._sleep(300_000)
        y = [torch.relu(nx), nx.sum(), nx.sum(1, keepdim=True), nx.mean(),
             nx.mean(-1, keepdim=True), torch.mm(nm, nm),
             F.linear(nx, nw, nb), nx + nx, nx - 1, nx * nx, nx / 3,
             torch.empty_like(nx).fill_(2.5), torch.empty_like(nx).zero_(),
             *[getattr(torch, op)(nx) for op in UNARY], F.silu(nx)]
        nm.relu_()
        assert not torch.neuron.current_stream().query()
        # And each op was queued (a synchronous op early in the list would
        # drain the stream, and the ops after it could still pass the check
        # above).
        paths = torchneuron.get_op_paths()
        assert all(p["fallback"] == 0 and p["inline"] == 0 for p in paths.values()), paths
    finally:
        torchneuron._C._set_async_path(True)
    want = [torch.relu(x), x.sum(), x.sum(1, keepdim=True), x.mean(), x.mean(-1, keepdim=True),
            torch.mm(m, m), F.linear(x, w, b),
            x + x, x - 1, x * x, x / 3, torch.full_like(x, 2.5), torch.zeros_like(x),
            *[getattr(torch, op)(x) for op in UNARY], F.silu(x)]
    for got, ref in zip(y, want):
        same(got, ref)
    same(nm, m.relu())


@pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs two neuron devices")
def test_direct_ops_on_another_device_keep_the_current_one():
    # The direct paths switch the current device only when the operands are
    # elsewhere (OnDevice): results land on the operands' device, in its
    # memory, and the caller's current device is what it was.
    x = torch.randn(64, 8)
    w = torch.randn(8, 8)
    dev = "neuron:1"
    torch.neuron.set_device(0)
    try:
        a, b = x.to(dev), w.to(dev)
        before = torch.neuron.memory_allocated(1)
        results = {
            "add": (a + a, x + x), "mul": (a * 2, x * 2), "relu": (torch.relu(a), torch.relu(x)),
            "sum": (a.sum(0), x.sum(0)), "mm": (a @ b, x @ w),
            "addmm": (torch.addmm(a[0], a, b), torch.addmm(x[0], x, w)),
        }
        assert torch.neuron.memory_allocated(1) > before
        for name, (got, want) in results.items():
            assert got.device == torch.device(dev), name
            same(got, want)
            assert torch.neuron.current_device() == 0, name
        a.add_(1)
        assert torch.neuron.current_device() == 0
        same(a, x + 1)
    finally:
        torch.neuron.set_device(0)
