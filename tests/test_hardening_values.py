"""Regression tests for wrong values, missing checks and late errors (hardening issue).

Every case runs on CPU and on ``neuron`` and must agree: the same exception type and
message where CPU raises, bitwise the same values otherwise. Neuron cases run several
times, because the first call of a kind of arguments is checked inline and later ones
are queued: both must behave as CPU does.
"""
import collections
import io
import re
import time
import warnings

import pytest
import torch
import torch.nn.functional as F

import torchneuron

from conftest import LAUNCH_BLOCKING, requires_async

N = torch.device("neuron")
REPEAT = 3


def outcome(fn, device):
    """('ok', cpu values) or ('raise', type, message) of fn(device), synchronized."""
    try:
        r = fn(device)
        if device.type == "neuron":
            torch.neuron.synchronize()
        return ("ok", tree_cpu(r))
    except Exception as e:  # noqa: BLE001 (the type is what is compared)
        if device.type == "neuron":
            torch.neuron.synchronize()
        return ("raise", type(e), str(e).split("\n")[0])


def tree_cpu(r):
    if isinstance(r, torch.Tensor):
        return r.cpu()
    if isinstance(r, (tuple, list)):
        return type(r)(tree_cpu(x) for x in r)
    return r


def assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), (a, b)
        av, bv = a.contiguous().view(-1), b.contiguous().view(-1)
        if a.dtype.is_floating_point or a.dtype.is_complex:
            av = torch.view_as_real(av).reshape(-1) if a.dtype.is_complex else av
            bv = torch.view_as_real(bv).reshape(-1) if b.dtype.is_complex else bv
            assert torch.equal(av.isnan(), bv.isnan())
            av, bv = av.nan_to_num(0), bv.nan_to_num(0)
        assert torch.equal(av, bv), (a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def check_like_cpu(fn, repeat=REPEAT):
    expected = outcome(fn, torch.device("cpu"))
    for _ in range(repeat):
        got = outcome(fn, N)
        assert got[0] == expected[0], (expected, got)
        if expected[0] == "raise":
            assert got[1] is expected[1], (expected, got)
            assert got[2] == expected[2], (expected, got)
        else:
            assert_same(expected[1], got[1])
    return expected


# --- factories writing into a non-contiguous out= ---------------------------------------

@pytest.mark.parametrize("factory", [
    lambda out: torch.linspace(0, 3, 4, out=out),
    lambda out: torch.logspace(0, 3, 4, out=out),
    lambda out: torch.arange(4.0, out=out),
    lambda out: torch.arange(0, 8, 2, out=out),
    lambda out: torch.range(0, 3, out=out),
], ids=["linspace", "logspace", "arange", "arange_step", "range"])
def test_factories_into_non_contiguous_out_keep_its_layout(factory):
    def f(dev):
        x = torch.zeros(2, 3, device=dev)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            factory(x.narrow(1, 1, 2))
        return x
    expected = check_like_cpu(f)
    if expected[0] == "ok" and f is not None:
        assert expected[1][0, 0] == 0 and expected[1][1, 0] == 0


def test_linspace_into_non_contiguous_out_exact_example():
    x = torch.zeros(2, 3, device=N)
    torch.linspace(0, 3, 4, out=x.narrow(1, 1, 2))
    assert x.cpu().tolist() == [[0, 0, 1], [0, 2, 3]]


@pytest.mark.parametrize("shape", [(4,), (2, 2), (3,), (5,)])
def test_out_of_another_shape_warns_and_resizes_like_cpu(shape):
    def f(dev):
        out = torch.zeros(*shape, device=dev)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.add(torch.ones(4, device=dev), 1, out=out)
        # (neuron may warn twice: PyTorch's Python Meta kernel for add.out warns too,
        # through Python's warnings module, which the backend cannot hold back.)
        return out, any("resized" in str(x.message) for x in w)
    check_like_cpu(f)


def test_empty_out_takes_the_memory_format_cpu_gives():
    def f(dev):
        x = torch.arange(120.0).reshape(2, 3, 4, 5).to(memory_format=torch.channels_last).to(dev)
        out = torch.empty(0, device=dev)
        torch.abs(x, out=out)
        return out, x.abs(), torch.neg(x), x.abs().is_contiguous(memory_format=torch.channels_last)
    check_like_cpu(f)


# --- global state the async path caches ---------------------------------------------------

def test_integer_true_division_follows_the_default_dtype():
    def f(dev):
        a = torch.arange(6, device=dev)
        b = torch.full((6,), 3, device=dev)
        r1 = a / b
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            r2 = a / b
            r3 = torch.true_divide(a, 7)
        finally:
            torch.set_default_dtype(old)
        r4 = a / b
        return r1, r2, r3, r4
    check_like_cpu(f)


def test_default_dtype_in_factories_and_pointwise():
    def f(dev):
        old = torch.get_default_dtype()
        res = []
        for dt in (torch.float32, torch.float64, torch.float16, torch.float32):
            torch.set_default_dtype(dt)
            try:
                i = torch.arange(5, device=dev)
                res += [i / 2, torch.sqrt(i), i.mean(dtype=None) if False else i.float().mean(),
                        torch.linspace(0, 1, 5, device=dev)]
            finally:
                torch.set_default_dtype(old)
        return res
    check_like_cpu(f)


# --- deterministic mode ---------------------------------------------------------------------

@pytest.fixture
def deterministic():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.complex64,
                                   torch.int32, torch.int64, torch.uint8, torch.bool])
def test_deterministic_mode_fills_uninitialized_memory(deterministic, dtype):
    def f(dev):
        a = torch.empty(5, dtype=dtype, device=dev)
        b = torch.empty_like(a)
        c = torch.empty_strided((2, 3), (1, 2), dtype=dtype, device=dev)
        d = torch.zeros(2, dtype=dtype, device=dev)
        d.resize_(7)
        e = a.new_empty(3)
        return a, b, c, d, e
    check_like_cpu(f)


@requires_async
def test_deterministic_fill_is_queued_not_a_host_wait(deterministic):
    torch.neuron.synchronize()
    torchneuron = __import__("torchneuron")
    torchneuron.clear_host_waits() if hasattr(torchneuron, "clear_host_waits") else None
    torch.neuron._sleep(200_000)
    x = torch.empty(1000, device=N)
    assert not torch.neuron.current_stream().query(), "the fill must queue behind the sleep"
    assert x.isnan().all().item()


def test_resize_without_deterministic_mode_does_not_fill():
    torch.use_deterministic_algorithms(False)
    d = torch.zeros(2, device=N)
    d.resize_(3)
    d[2] = 5
    assert d.cpu().tolist() == [0, 0, 5]


# --- memory formats, half-precision reductions ---------------------------------------------

@pytest.mark.parametrize("op", ["abs", "neg", "exp", "sigmoid", "relu", "clone", "add1", "mul2"])
def test_unary_ops_keep_channels_last(op):
    fns = {"abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "sigmoid": torch.sigmoid,
           "relu": torch.relu, "clone": torch.clone, "add1": lambda x: x + 1, "mul2": lambda x: x * 2}

    def f(dev):
        x = torch.linspace(-3, 3, 120).reshape(2, 3, 4, 5)
        x = x.to(memory_format=torch.channels_last).to(dev)
        return [fns[op](x) for _ in range(2)]
    check_like_cpu(f)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nan_reductions_of_half_precision_non_contiguous_inputs(dtype):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(37, 65, generator=g).to(dtype)
    base[3, 4] = float("nan")
    base[10, :] = float("nan")

    def f(dev):
        x = base.to(dev).t()
        y = base.to(dev)[:, ::2]
        return (x.nansum(), x.nansum(0), x.nansum(1), x.nanmean(0), x.nanmean(1),
                y.nansum(1), y.nanmean(0), torch.nansum(x, dtype=torch.float32))
    check_like_cpu(f)


def test_pow_complex_half_as_cpu():
    z = torch.randn(6, dtype=torch.cfloat).to(torch.complex32)

    def f(dev):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return z.to(dev) ** 2
    check_like_cpu(f)


# --- copy-on-write ---------------------------------------------------------------------------

def test_reading_a_lazy_clone_does_not_materialize_it():
    def f(dev):
        t = torch.arange(6.0, device=dev)
        c = t._lazy_clone()
        r = t + c
        s = torch.sin(c)
        m = torch.mul(c, t)
        host = c.cpu()
        return (r, s, m, host, torch._C._is_cow_tensor(t), torch._C._is_cow_tensor(c))
    check_like_cpu(f)


def test_writing_a_lazy_clone_materializes_it_and_keeps_the_original():
    def f(dev):
        t = torch.arange(6.0, device=dev)
        c = t._lazy_clone()
        c.add_(1)
        c2 = t._lazy_clone()
        c2.sin_()
        c3 = t._lazy_clone()
        c3.index_fill_(0, torch.tensor([1], device=dev), 9.0)
        return t, c, c2, c3, torch._C._is_cow_tensor(c)
    check_like_cpu(f)


# --- storage types, pinning, generators ------------------------------------------------------

def test_storage_type_is_a_neuron_storage_class():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dtype, name in [(torch.float32, "FloatStorage"), (torch.int64, "LongStorage"),
                            (torch.bfloat16, "BFloat16Storage"), (torch.bool, "BoolStorage")]:
            st = torch.ones(2, dtype=dtype, device=N).storage_type()
            assert st is getattr(torch.neuron, name)
            assert st.__module__ == "torch.neuron"
            s = st(3)
            assert s.device.type == "neuron" and s.dtype == dtype and s.size() == 3
            assert isinstance(torch.ones(2, dtype=dtype, device=N).storage(), st)
            assert not isinstance(torch.ones(2, dtype=dtype).storage(), st)


@pytest.mark.parametrize("factory", [
    lambda: torch.empty(3, device=N, pin_memory=True),
    lambda: torch.empty_strided((3,), (1,), device=N, pin_memory=True),
    lambda: torch.zeros(3, device=N, pin_memory=True),
    lambda: torch.ones(3, device=N, pin_memory=True),
])
def test_pin_memory_on_the_device_raises_like_cuda(factory):
    with pytest.raises(RuntimeError, match="^Only dense CPU tensors can be pinned$"):
        factory()
    assert torch.ones(2, device=N).sum().item() == 2


@pytest.mark.parametrize("draw", [
    lambda g: torch.randn(3, device=N, generator=g),
    lambda g: torch.rand(3, device=N, generator=g),
    lambda g: torch.randint(0, 5, (3,), device=N, generator=g),
    lambda g: torch.empty(3, device=N).normal_(generator=g),
    lambda g: torch.empty(3, device=N).uniform_(generator=g),
    lambda g: torch.empty(3, device=N).bernoulli_(0.5, generator=g),
    lambda g: torch.multinomial(torch.ones(4, device=N), 2, generator=g),
    lambda g: torch.randperm(5, device=N, generator=g),
])
def test_cpu_generator_for_a_device_op_raises_like_cuda(draw):
    g = torch.Generator()
    state = g.get_state()
    with pytest.raises(RuntimeError,
                       match=re.escape("Expected a 'neuron' device type for generator but found 'cpu'")):
        draw(g)
    assert torch.equal(g.get_state(), state), "the CPU generator must not be consumed"
    gn = torch.Generator(device="neuron").manual_seed(1)
    draw(gn)
    torch.neuron.synchronize()


# --- missing checks: devices, overlap --------------------------------------------------------

@pytest.mark.parametrize("out", [lambda: torch.empty(0, dtype=torch.long),
                                 lambda: torch.tensor(0),
                                 lambda: torch.empty(3, 1, dtype=torch.long)])
def test_nonzero_into_a_cpu_out_raises(out):
    o = out()
    before = o.clone()
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.nonzero(torch.ones(3, device=N), out=o)
    assert torch.equal(o, before)


def test_cpu_out_of_a_pointwise_op_raises():
    for o in (torch.tensor(0.0), torch.empty(3)):
        with pytest.raises(RuntimeError, match="same device"):
            torch.sin(torch.ones(3, device=N), out=o)


def _idx(dev, *v):
    return torch.tensor(v, device=dev)


OVERLAP_CASES = {
    "index_put_partial": lambda x: x[:4].index_put_((_idx(x.device, 0),), x[1:2]),
    "index_put_internal": lambda x: x[:1].expand(4).index_put_((_idx(x.device, 0),), x[3:4]),
    "index_copy_partial": lambda x: x[:4].index_copy_(0, _idx(x.device, 0, 1), x[1:3]),
    "index_copy_internal": lambda x: x[:1].expand(4).index_copy_(0, _idx(x.device, 0), x[3:4]),
    "index_add_partial": lambda x: x[:4].index_add_(0, _idx(x.device, 0, 1), x[1:3]),
    "index_add_internal": lambda x: x[:1].expand(4).index_add_(0, _idx(x.device, 0), x[3:4]),
    "index_fill_internal": lambda x: x[:1].expand(4).index_fill_(0, _idx(x.device, 0), 1.0),
    "masked_fill_internal": lambda x: x[:1].expand(4).masked_fill_(
        torch.ones(4, dtype=torch.bool, device=x.device), 1.0),
    "masked_fill_partial_mask": lambda x: x[:4].masked_fill_(x[1:5] > 2, 1.0),
    "scatter_partial": lambda x: x[:4].scatter_(0, _idx(x.device, 0, 1), x[1:3]),
    "scatter_internal": lambda x: x[:1].expand(4).scatter_(0, _idx(x.device, 0), x[3:4]),
    "scatter_add_partial": lambda x: x[:4].scatter_add_(0, _idx(x.device, 0, 1), x[1:3]),
    "put_partial": lambda x: x[:4].put_(_idx(x.device, 0, 1), x[1:3]),
    "put_internal": lambda x: x[:1].expand(4).put_(_idx(x.device, 0), x[3:4]),
    "copy_partial": lambda x: x[:4].copy_(x[1:5]),
    "copy_internal": lambda x: x[:1].expand(4).copy_(x[1:5]),
    "copy_full_same": lambda x: x[:4].copy_(x[:4]),
    "copy_disjoint": lambda x: x[:3].copy_(x[3:6]),
    "add_out_partial": lambda x: torch.add(x[1:5], 1, out=x[:4]),
    "add_inplace_partial": lambda x: x[:4].add_(x[1:5]),
    "sin_out_partial": lambda x: torch.sin(x[1:5], out=x[:4]),
    "mul_inplace_self": lambda x: x.mul_(x),
    "index_copy_disjoint": lambda x: x[:2].index_copy_(0, _idx(x.device, 0, 1), x[3:5]),
}


@pytest.mark.parametrize("case", sorted(OVERLAP_CASES))
def test_memory_overlap_checks_as_cpu(case):
    op = OVERLAP_CASES[case]

    def f(dev):
        x = torch.arange(6.0, device=dev)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(x)
        return x
    # A disjoint call first (same kind otherwise): a cached verdict must not let the
    # overlapping call through.
    check_like_cpu(lambda dev: torch.arange(12.0, device=dev)[6:].index_copy_(
        0, _idx(dev, 0, 1), torch.arange(2.0, device=dev)))
    check_like_cpu(f)


@requires_async
def test_overlap_errors_arrive_at_the_op():
    x = torch.arange(6.0, device=N)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            x[:4].index_copy_(0, _idx(N, 0, 1), x[1:3])
        with pytest.raises(RuntimeError, match="refers to a single memory location"):
            x[:1].expand(4).copy_(x[1:5])
    torch.neuron.synchronize()  # nothing left to report
    assert x.cpu().tolist() == list(range(6))


# --- errors and warnings: at the op, or at the next sync, never lost -------------------------

def test_unsupported_dtype_raises_not_implemented_at_the_op():
    for dtype in (torch.uint16, torch.uint32, torch.uint64):
        for op in (torch.add, torch.mul, torch.sub, torch.div, torch.remainder):
            a = torch.ones(2, dtype=dtype)
            check_like_cpu(lambda dev: op(a.to(dev), a.to(dev)))
    a = torch.ones(2, dtype=torch.uint64, device=N)
    for _ in range(REPEAT):
        with pytest.raises(NotImplementedError):
            a + a  # at the op, not at the next sync
        torch.neuron.synchronize()


@pytest.mark.parametrize("args", [
    (torch.tensor([1, 5]), 3),
    (torch.tensor([1, -1]), 3),
    (torch.tensor([1.0]), 3),
    (torch.tensor([0, 2]), -2),
    (torch.tensor([0, 2]), -1),
    (torch.tensor([0, 2]), 0),
    (torch.tensor([], dtype=torch.long), -1),
])
def test_one_hot_checks_as_cpu(args):
    t, n = args
    f = lambda dev: F.one_hot(t.to(dev), n)  # noqa: E731
    if n <= 0 or t.dtype != torch.long or t.numel() == 0:
        check_like_cpu(f)
        return
    # With num_classes given the values are checked by the queued kernel, as CUDA's
    # device-side assert checks them: CPU's message, at the next synchronizing call.
    expected = outcome(f, torch.device("cpu"))
    for _ in range(REPEAT):
        got = outcome(f, N)
        if expected[0] == "ok":
            assert got[0] == "ok", got
            assert_same(expected[1], got[1])
        else:
            assert got[0] == "raise" and got[1] is RuntimeError, got
            assert "kernel 'aten::one_hot' failed" in got[2] and expected[2] in got[2], got
    assert torch.equal(torch.ones(2, device=N).add(1).cpu(), torch.full((2,), 2.0))


@requires_async
def test_one_hot_with_num_classes_does_not_wait_for_the_device():
    x = torch.tensor([3, 0, 4, 1] * 256, device=N)
    F.one_hot(x, 5)
    torch.neuron.synchronize()
    torchneuron.clear_host_waits()
    torch.neuron._sleep(int(0.5e6))
    t0 = time.perf_counter()
    y = F.one_hot(x[::3], 5)
    host = time.perf_counter() - t0
    assert not torch.neuron.current_stream().query()
    assert torchneuron.get_host_waits() == []
    assert host < 0.25
    assert_same(F.one_hot(x.cpu()[::3], 5), y.cpu())


# The warning-only cases: random_'s precision warning comes from the kernel; a
# queued call's warning is re-emitted at the next host call (torch.neuron.synchronize
# here). It once reached the C++ log: the binding noted its host wait, which flushes
# the warnings, before it installed Python's warning handler.
@pytest.mark.parametrize("dtype,lo,hi", [(torch.int8, 0, 300), (torch.float16, 0, 70000),
                                         (torch.uint8, -5, 10), (torch.float32, 0, 2**25),
                                         (torch.float16, 0, 5000), (torch.bfloat16, -1000, 1000),
                                         (torch.float64, 0, 2**54)])
def test_random_from_out_of_bounds_warns_or_raises_at_the_op(dtype, lo, hi):
    # In a fresh interpreter: warnings the suite's earlier tests left stashed would
    # be flushed into this test's catch_warnings.
    from conftest import run_python
    r = run_python(f"""
        import sys; sys.path.insert(0, 'tests')
        import torch, test_hardening_values as t
        t._random_bounds(torch.{str(dtype).split('.')[1]}, {lo}, {hi})
        print('OK')
    """, env={"PYTHONPATH": __import__("os").environ.get("PYTHONPATH", "")})
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


def _random_bounds(dtype, lo, hi):
    def at_op(dev):
        x = torch.zeros(4, dtype=dtype, device=dev)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                x.random_(lo, hi)
                err = None
            except RuntimeError as e:
                err = str(e).split("\n")[0]
        return err, sorted({str(m.message).split("\n")[0] for m in w})
    expected = at_op(torch.device("cpu"))
    for _ in range(REPEAT):
        got = at_op(N)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.neuron.synchronize()
        # The error at the op; CPU's warning at the op, or (when the Meta pass does
        # not give it: random_) from the queued kernel at the next host call.
        assert got[0] == expected[0]
        seen = got[1] + [str(m.message).split("\n")[0] for m in w]
        for msg in expected[1]:
            base = msg.split(" (Triggered internally")[0]
            assert any(m.startswith(base) for m in seen), (msg, seen)


def test_warnings_raised_by_a_queued_kernel_reach_the_user():
    # In a fresh interpreter (as above). The warning was once lost to the C++ log when
    # torch.neuron.synchronize flushed it before installing Python's warning handler.
    from conftest import run_python
    r = run_python("""
        import sys; sys.path.insert(0, 'tests')
        import test_hardening_values as t
        t._queued_kernel_warnings()
        print('OK')
    """, env={"PYTHONPATH": __import__("os").environ.get("PYTHONPATH", "")})
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


def _queued_kernel_warnings():
    # var_mean's "degrees of freedom is <= 0" comes from CPU's kernel; once the kind is
    # known the kernel is queued, and its warning is re-emitted by the next host call
    # (a launch or the sync), named after the kernel. Every call warns, as on CPU.
    with warnings.catch_warnings(record=True) as wc:
        warnings.simplefilter("always")
        torch.var_mean(torch.ones(3, 1), 1)
    (cpu_msg,) = {str(m.message).split(" (Triggered internally")[0] for m in wc}
    for _ in range(4):
        x = torch.ones(3, 1, device=N)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.var_mean(x, 1)
            torch.neuron.synchronize()
        got = [str(m.message) for m in w]
        assert any(m.startswith(cpu_msg) for m in got), (got, cpu_msg)


@requires_async
def test_a_second_kernel_error_before_one_sync_is_reported_too():
    x = torch.zeros(3, device=N)
    for _ in range(2):  # the kind is verified with a valid index: later calls are queued
        x.index_fill_(0, torch.tensor([1], device=N), 1.0)
    i5, i7 = torch.tensor([5], device=N), torch.tensor([7], device=N)
    torch.neuron.synchronize()
    torch.neuron._sleep(1000)
    x.index_fill_(0, i5, 1.0)
    x.index_fill_(0, i7, 1.0)
    with pytest.raises(RuntimeError) as ei:
        torch.neuron.synchronize()
    msg = str(ei.value)
    # Both failures, each named, in the order they were queued.
    assert "index 5 is out of bounds" in msg, msg
    assert "and 1 more kernel failure" in msg, msg
    assert msg.index("index 5 is out of bounds") < msg.index("index 7 is out of bounds"), msg
    torch.neuron.synchronize()  # reported once, the device works
    assert torch.ones(2, device=N).sum().item() == 2


# --- crafted checkpoints ----------------------------------------------------------------------

class _LongView:
    """Pickles as a tensor whose view is longer than its storage."""

    def __init__(self, storage, numel):
        self.storage, self.numel = storage, numel

    def __reduce_ex__(self, proto):
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, (self.numel,), (1,), False, collections.OrderedDict()))


def _crafted(device, numel=1000):
    x = torch.arange(4.0, device=device)
    st = torch.storage.TypedStorage(wrap_storage=x.untyped_storage(), dtype=torch.float32,
                                    _internal=True)
    buf = io.BytesIO()
    torch.save(_LongView(st, numel), buf)
    buf.seek(0)
    return buf


@pytest.mark.parametrize("map_location", [None, "neuron", "neuron:0"])
def test_checkpoint_view_longer_than_its_storage_is_refused_as_on_cpu(map_location):
    with pytest.raises(RuntimeError) as ec:
        torch.load(_crafted("cpu"), weights_only=True)
    src = "neuron" if map_location is None else "cpu"
    with pytest.raises(RuntimeError) as en:
        torch.load(_crafted(src), weights_only=True, map_location=map_location)
    assert str(en.value) == str(ec.value)
    assert torch.ones(2, device=N).sum().item() == 2


def test_checkpoint_within_bounds_still_loads():
    x = torch.arange(8.0, device=N)
    buf = io.BytesIO()
    torch.save({"a": x, "v": x[2:5], "t": x.view(2, 4).t()}, buf)
    buf.seek(0)
    d = torch.load(buf, weights_only=True)
    assert d["a"].device.type == "neuron"
    assert d["v"].cpu().tolist() == [2, 3, 4]
    assert torch.equal(d["t"].cpu(), x.cpu().view(2, 4).t())
    d["v"].add_(1)
    assert d["a"].cpu().tolist()[2:5] == [3, 4, 5]


# --- out= resizing warns once --------------------------------------------------------------------

def _resize_warnings(dev, call):
    a = torch.ones(4, 3, device=dev)
    out = torch.ones(2, device=dev)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        call(a, out)
        if dev != "cpu":
            torch.neuron.synchronize()
    return [str(m.message) for m in w if "was resized" in str(m.message)], out.cpu()


@pytest.mark.parametrize("name,call", [
    ("add", lambda a, out: torch.add(a, a, out=out)),
    ("mul", lambda a, out: torch.mul(a, 2.0, out=out)),
    ("cat", lambda a, out: torch.cat([a, a], out=out)),
    ("sum", lambda a, out: torch.sum(a, 0, out=out)),
])
def test_a_resized_out_tensor_warns_once_as_on_cpu(name, call):
    # The Meta pass and CPU's kernel both resize a non-empty out= (the call then runs
    # synchronously); the user hears it once, at the op. From a Python meta kernel
    # (torch._prims_common's out= wrapper) the words are that kernel's, on the first
    # call of a kind; cached calls run no Meta pass and give CPU's.
    cpu, cpu_out = _resize_warnings("cpu", call)
    for _ in range(3):
        got, got_out = _resize_warnings(N, call)
        assert len(got) == len(cpu) == 1, (got, cpu)
        assert torch.equal(got_out, cpu_out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_attention_forward_on_empty_sequences_does_not_crash(dtype):
    # CPU's kernel divides by its block size, min(32, length): a direct call
    # with an empty query or key kills a CPU process with SIGFPE (not run
    # here), and did the same to the device's worker. neuron now returns the
    # empty results of an empty query, in CPU's layouts, and refuses empty
    # keys with a RuntimeError; the device keeps working after.
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q = torch.randn(2, 3, 0, 32, dtype=dtype, device=N)
    k = torch.randn(2, 3, 16, 32, dtype=dtype, device=N)
    out, lse = op(q, k, k, 0.0, False)[:2]
    assert out.shape == (2, 3, 0, 32) and out.stride() == (96, 32, 96, 1) and out.dtype == dtype
    assert lse.shape == (2, 3, 0) and lse.stride() == (3, 1, 3) and lse.dtype == torch.float32
    with pytest.raises(RuntimeError, match="sequence length 0"):
        op(k, q, q, 0.0, False)
    qc, kc = torch.randn(2, 3, 16, 32, dtype=dtype), torch.randn(2, 3, 16, 32, dtype=dtype)
    want = op(qc, kc, kc, 0.0, True)[0]
    got = op(qc.to(N), kc.to(N), kc.to(N), 0.0, True)[0].cpu()
    assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
