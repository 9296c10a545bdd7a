"""OpInfo samples under the conditions the conformance suites did not vary.

For a slice of PyTorch's own ``op_db`` (pointwise, reductions, factories-like ops), each
sample runs on CPU and on ``neuron`` and must agree bitwise (or raise the same exception
type) when:
- ``out=`` is a non-contiguous view of a larger tensor (the bytes around it stay as they are),
- ``out=`` is on the wrong device (CPU),
- the default dtype is float64,
- ``torch.use_deterministic_algorithms(True)`` is on,
- the inputs are channels_last (4-D samples).
Each neuron case runs twice: the first call of a kind is checked inline, later ones are queued.
"""
import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

N = torch.device("neuron")
NAMES = ["abs", "neg", "exp", "sin", "sqrt", "sigmoid", "add", "mul", "sub", "div",
         "true_divide", "maximum", "where", "clamp", "sum", "mean", "nansum", "amax", "cumsum",
         "pow", "remainder", "lerp", "addcmul", "logsumexp", "softmax"]
OPS = [op for op in op_db if op.name in NAMES and op.variant_test_name == ""]
MAX_SAMPLES = 4


def _samples(op, dtype=torch.float32):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(op.sample_inputs("cpu", dtype, requires_grad=False))[:MAX_SAMPLES]


def _to(x, dev, memory_format=None):
    if isinstance(x, torch.Tensor):
        y = x.to(dev)
        if memory_format is not None and y.dim() == 4:
            y = y.contiguous(memory_format=memory_format)
        return y
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, dev, memory_format) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, dev, memory_format) for k, v in x.items()}
    return x


def _run(fn):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = fn()
        if isinstance(r, torch.Tensor) and r.device.type == "neuron":
            torch.neuron.synchronize()
        return ("ok", r.cpu() if isinstance(r, torch.Tensor) else r)
    except Exception as e:  # noqa: BLE001
        torch.neuron.synchronize()
        return ("raise", type(e))


def _same(a, b):
    assert a[0] == b[0], (a, b)
    if a[0] == "raise":
        assert a[1] is b[1], (a, b)
        return
    x, y = a[1], b[1]
    if isinstance(x, torch.Tensor):
        assert x.dtype == y.dtype and x.shape == y.shape, (x, y)
        assert torch.equal(x.isnan(), y.isnan()) if x.is_floating_point() else True
        assert torch.equal(x.nan_to_num(0) if x.is_floating_point() else x,
                           y.nan_to_num(0) if y.is_floating_point() else y), (x, y)
        assert x.stride() == y.stride() or x.numel() <= 1, (x.stride(), y.stride())


def _call(op, s, dev, memory_format=None, **extra):
    return op.op(_to(s.input, dev, memory_format), *_to(s.args, dev, memory_format),
                 **_to(s.kwargs, dev, memory_format), **extra)


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_non_contiguous_out(op):
    if not op.supports_out:
        pytest.skip("no out=")
    for s in _samples(op):
        ref = _run(lambda: _call(op, s, "cpu"))
        if ref[0] != "ok" or not isinstance(ref[1], torch.Tensor) or ref[1].dim() == 0:
            continue
        shape = ref[1].shape

        def into(dev):
            base = torch.full((*shape[:-1], shape[-1] * 2 + 1), 7.0, dtype=ref[1].dtype, device=dev)
            out = base[..., 1::2]
            _call(op, s, dev, out=out)
            return base
        expected = _run(lambda: into("cpu"))
        for _ in range(2):
            _same(expected, _run(lambda: into(N)))


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_out_on_the_wrong_device_raises(op):
    if not op.supports_out:
        pytest.skip("no out=")
    for s in _samples(op)[:2]:
        ref = _run(lambda: _call(op, s, "cpu"))
        if ref[0] != "ok" or not isinstance(ref[1], torch.Tensor):
            continue
        out = torch.empty_like(ref[1])
        got = _run(lambda: _call(op, s, N, out=out))
        assert got[0] == "raise" and got[1] is RuntimeError, got


@pytest.mark.parametrize("condition", ["float64_default", "deterministic", "channels_last"])
@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_under_global_conditions(op, condition):
    mf = torch.channels_last if condition == "channels_last" else None
    old = torch.get_default_dtype()
    try:
        if condition == "float64_default":
            torch.set_default_dtype(torch.float64)
        if condition == "deterministic":
            torch.use_deterministic_algorithms(True)
        for s in _samples(op):
            expected = _run(lambda: _call(op, s, "cpu", mf))
            for _ in range(2):
                _same(expected, _run(lambda: _call(op, s, N, mf)))
    finally:
        torch.set_default_dtype(old)
        torch.use_deterministic_algorithms(False)
