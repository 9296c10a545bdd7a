"""mm and addmm as one planned BLAS call (csrc/aten/Gemm.h).

The host plans the BLAS call CPU's addmm would make (operand order,
transposes, leading dimensions, cpublas's normalization of size-1 dims) and
the executor makes it on raw pointers. The tests hold every planned call to
CPU's bits over shapes with size-1 dims, transposed and strided operands,
bias layouts and scalars, with the plans on and off; check through the plan
counter that the plan is really taken where it should be and declined where
CPU's kernel would not make a plain BLAS call (half and bf16, oneDNN's bf16
or tf32 float matmuls, operands ATen copies first, broadcast biases it does
not plan); and check that an error the plan leaves to ATen still comes at
the op.
"""
import contextlib
import itertools

import pytest
import torch

import torchneuron
from torchneuron import _C


def on(t):
    return t.to("neuron")


def bits(t):
    t = t.cpu().contiguous()
    return t.view({torch.float32: torch.int32, torch.float64: torch.int64,
                   torch.float16: torch.int16, torch.bfloat16: torch.int16}[t.dtype])


def same_bits(neuron_result, cpu_result):
    got = neuron_result.cpu()
    assert (got.dtype, got.shape, got.stride()) == (
        cpu_result.dtype, cpu_result.shape, cpu_result.stride())
    assert torch.equal(bits(got), bits(cpu_result))


@contextlib.contextmanager
def plans(enabled):
    before = _C._gemm_plans_enabled()
    _C._set_gemm_plans_enabled(enabled)
    try:
        yield
    finally:
        _C._set_gemm_plans_enabled(before)


def made():
    torch.neuron.synchronize()
    return _C._gemm_plans_made()


def operand(rows, cols, dtype, layout, g):
    """A rows x cols matrix as a (CPU, neuron) pair in one of the layouts
    BLAS takes without a copy: contiguous, transposed, or a slice of a wider
    matrix (a leading dimension larger than its size). The view is taken on
    each device (a copy to neuron makes a sliced tensor contiguous)."""
    if layout == "contiguous":
        base, view = torch.randn(rows, cols, generator=g), lambda t: t
    elif layout == "transposed":
        base, view = torch.randn(cols, rows, generator=g), lambda t: t.t()
    else:
        base, view = torch.randn(rows, cols + 3, generator=g), lambda t: t[:, 1:cols + 1]
    base = base.to(dtype)
    pair = view(base), view(on(base))
    assert pair[0].stride() == pair[1].stride()
    return pair


LAYOUTS = list(itertools.product(["contiguous", "transposed", "sliced"], repeat=2))
SHAPES = [(1, 1, 1), (1, 7, 5), (6, 1, 4), (5, 3, 1), (1, 9, 1), (8, 8, 8), (33, 17, 40),
          (64, 256, 3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows,inner,cols", SHAPES)
def test_planned_mm_has_cpus_bits(dtype, rows, inner, cols):
    g = torch.Generator().manual_seed(rows * 1000 + inner * 10 + cols)
    for layout in LAYOUTS:
        a, na = operand(rows, inner, dtype, layout[0], g)
        b, nb = operand(inner, cols, dtype, layout[1], g)
        expected = torch.mm(a, b)
        for enabled in (True, False):
            with plans(enabled):
                before = made()
                same_bits(torch.mm(na, nb), expected)
                assert made() - before == int(enabled), (layout, enabled)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows,inner,cols", [(1, 5, 1), (4, 6, 1), (1, 6, 7), (9, 16, 12)])
def test_planned_addmm_has_cpus_bits_for_each_bias_and_scalar(dtype, rows, inner, cols):
    g = torch.Generator().manual_seed(7)
    a = torch.randn(rows, inner, generator=g).to(dtype)
    b = torch.randn(cols, inner, generator=g).to(dtype).t()
    biases = {  # layout: whether the plan takes it
        "row": (torch.randn(cols, generator=g).to(dtype), True),
        "1 x cols": (torch.randn(1, cols, generator=g).to(dtype), True),
        "full": (torch.randn(rows, cols, generator=g).to(dtype), True),
        "column": (torch.randn(rows, 1, generator=g).to(dtype), cols == 1),
        "0-dim": (torch.randn((), generator=g).to(dtype), False),
    }
    for name, (bias, planned) in biases.items():
        for beta, alpha in ((1, 1), (0.5, 2), (0, 1.5), (-2, -1), (1e-50, 1)):
            expected = torch.addmm(bias, a, b, beta=beta, alpha=alpha)
            before = made()
            got = torch.addmm(on(bias), on(a), on(b), beta=beta, alpha=alpha)
            same_bits(got, expected)
            # beta 0 reads no bias, so every layout is planned
            assert made() - before == int(planned or beta == 0), (name, beta)


def test_zero_beta_ignores_a_nan_bias_as_cpu_does():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    bias = torch.full((5,), float("nan"))
    expected = torch.addmm(bias, a, b, beta=0)
    assert not expected.isnan().any()
    same_bits(torch.addmm(on(bias), on(a), on(b), beta=0), expected)


def test_linear_and_its_backward_take_the_plan_with_cpus_bits():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 32, generator=g, requires_grad=True)
    w = torch.randn(24, 32, generator=g, requires_grad=True)
    bias = torch.randn(24, generator=g, requires_grad=True)
    nx, nw, nb = (on(t.detach()).requires_grad_() for t in (x, w, bias))
    before = made()
    out = torch.nn.functional.linear(nx, nw, nb)
    out.square().sum().backward()
    assert made() - before == 3  # addmm forward, mm for each weight's grad
    ref = torch.nn.functional.linear(x, w, bias)
    ref.square().sum().backward()
    same_bits(out, ref)
    for n, c in ((nx, x), (nw, w), (nb, bias)):
        same_bits(n.grad, c.grad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_products_stay_with_atens_kernel(dtype):
    a, b = torch.randn(32, 32).to(dtype), torch.randn(32, 32).to(dtype)
    before = made()
    same_bits(torch.mm(on(a), on(b)), torch.mm(a, b))
    assert made() == before


@pytest.mark.parametrize("precision", ["bf16", "tf32"])
def test_float_products_under_a_reduced_onednn_precision_stay_with_atens_kernel(precision):
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    saved = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = precision
    try:
        expected = torch.mm(a, b)
        before = made()
        got = torch.mm(on(a), on(b))
        same_bits(got, expected)
        assert made() == before
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = saved
    before = made()
    same_bits(torch.mm(on(a), on(b)), torch.mm(a, b))
    assert made() == before + 1


def test_operands_atens_kernel_copies_are_not_planned():
    base = torch.randn(8, 8)
    a = base[::2, ::2]  # neither dim has stride 1: ATen clones it first
    b = torch.randn(4, 3)
    na = on(base)[::2, ::2]
    before = made()
    same_bits(torch.mm(na, on(b)), torch.mm(a, b))
    assert made() == before


def test_a_scalar_that_overflows_float_raises_at_the_op_as_on_cpu():
    a, b, bias = torch.randn(2, 3), torch.randn(3, 4), torch.randn(4)
    with pytest.raises(RuntimeError) as cpu_err:
        torch.addmm(bias, a, b, alpha=1e300)
    with pytest.raises(RuntimeError) as neuron_err:
        torch.addmm(on(bias), on(a), on(b), alpha=1e300)
        torch.neuron.synchronize()
    assert str(neuron_err.value) == str(cpu_err.value)
    same_bits(torch.addmm(on(bias), on(a), on(b)), torch.addmm(bias, a, b))
