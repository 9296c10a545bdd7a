"""Row sums in ATen's order (csrc/aten/RowSum.h): sum and mean of contiguous
float and double tensors over trailing dims.

The kernel reproduces ATen's cascade of partial sums instead of calling it,
so these tests use values whose sum changes with the order of nearly every
addition (magnitudes over 2^-20..2^20, both signs) and lengths around every
boundary of the cascade: shorter than a vector, a vector and a tail, the
four interleaved partials, and each carry between its levels (every 16,
256 and 4096 steps of four vectors, and wider levels for rows of more than
16 M elements). Results must equal CPU's bit for bit.
"""
import pytest
import torch

import torchneuron
from conftest import cpu_has_flag

LANES = torchneuron._C._row_sum_lanes()
# Where the CPU has AVX2, a width that fails to reproduce ATen's sums is a
# failure (test_the_vector_width_is_atens), not a reason to skip.
pytestmark = pytest.mark.skipif(not cpu_has_flag("avx2"), reason="row sums need AVX2")


def spread(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    mantissa = torch.rand(shape, generator=g, dtype=torch.float64) - 0.5
    exponent = torch.randint(-20, 21, shape, generator=g).to(torch.float64)
    return (mantissa * torch.exp2(exponent)).to(dtype)


def bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same_bits(got, want):
    got = got.cpu()
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(bits(got), bits(want)), (got - want).abs().max()


def test_the_vector_width_is_atens():
    # Calibrated against ATen's own sum at first use: 32- or 64-byte vectors.
    assert LANES in ((8, 4), (16, 8))


LENGTHS = [2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 511, 512, 513,
           1000, 1024, 2049, 8191, 8192, 8193, 32767]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_whole_tensor_sums_and_means_match_cpu(dtype):
    for n in LENGTHS:
        x = spread((n,), dtype, seed=n)
        nx = x.to("neuron")
        same_bits(nx.sum(), x.sum())
        same_bits(nx.mean(), x.mean())
        # Every reduced dim of a contiguous tensor is one row.
        if n % 4 == 0:
            same_bits(nx.view(4, -1).sum(), x.view(4, -1).sum())
            same_bits(nx.view(2, 2, -1).mean((0, 1, 2)), x.view(2, 2, -1).mean((0, 1, 2)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows,length", [
    (3, 2), (5, 7), (4, 16), (7, 33), (64, 1024), (1024, 1024), (3, 40_000),
    (2, 4096 * 32 + 77), (2, 300_000)])
def test_rows_match_cpu(dtype, rows, length):
    x = spread((rows, length), dtype, seed=rows * length)
    nx = x.to("neuron")
    same_bits(nx.sum(-1), x.sum(-1))
    same_bits(nx.mean(-1, keepdim=True), x.mean(-1, keepdim=True))
    # Trailing dims together, and kept size-1 dims after the reduced ones.
    same_bits(nx.view(rows, 1, length).sum((1, 2)), x.view(rows, 1, length).sum((1, 2)))
    same_bits(nx.view(rows, length, 1).mean(1), x.view(rows, length, 1).mean(1))


def test_rows_wider_than_the_first_levels_match_cpu():
    # Rows of more than 2^19 steps of four 8-float vectors widen the levels.
    x = spread((2, (1 << 24) + 1037), torch.float32, seed=7)
    nx = x.to("neuron")
    same_bits(nx.sum(-1), x.sum(-1))


def test_special_values_match_cpu():
    x = spread((6, 100), torch.float32)
    x[0, 5] = float("nan")
    x[1, 9] = float("inf")
    x[2, 3], x[2, 70] = float("inf"), float("-inf")
    x[3] = -0.0
    x[4, :50] = 3e38
    nx = x.to("neuron")
    for got, want in [(nx.sum(-1), x.sum(-1)), (nx.mean(-1), x.mean(-1))]:
        got = got.cpu()
        assert torch.equal(got.isnan(), want.isnan())
        same_bits(got.nan_to_num(), want.nan_to_num())


def test_rows_follow_the_switch_and_other_layouts_stay_exact():
    # Off, and for layouts the rows do not take (a transposed input, leading
    # dims, half precision), ATen's kernels run: the same bits either way.
    x = spread((33, 70), torch.float32, seed=3)
    nx = x.to("neuron")
    try:
        torchneuron._C._set_row_sums_enabled(False)
        same_bits(nx.sum(-1), x.sum(-1))
        same_bits(nx.mean(-1), x.mean(-1))
    finally:
        torchneuron._C._set_row_sums_enabled(True)
    same_bits(nx.t().sum(-1), x.t().sum(-1))
    same_bits(nx.sum(0), x.sum(0))
    same_bits(nx.mean(0), x.mean(0))
    same_bits(nx.half().sum(-1), x.half().sum(-1))
    same_bits(nx.bfloat16().mean(-1), x.bfloat16().mean(-1))


def test_row_sums_keep_autograd():
    x = spread((8, 40), torch.float32, seed=5).requires_grad_()
    nx = x.detach().to("neuron").requires_grad_()
    (x.mean(-1) * torch.arange(8.0)).sum().backward()
    (nx.mean(-1) * torch.arange(8.0).to("neuron")).sum().backward()
    same_bits(nx.grad, x.grad)
