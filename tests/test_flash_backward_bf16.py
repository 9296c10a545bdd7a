"""The device's bfloat16 flash attention backward (csrc/aten/FlashBackward.h).

A bfloat16 `_scaled_dot_product_flash_attention_for_cpu_backward` whose
geometry qualifies runs the device's own kernel instead of CPU's (which spends
most of its time building oneDNN primitives for three tiny products per
block); a calibration against CPU's kernel admits each geometry. The tests
hold it to CPU eager's bits through scaled_dot_product_attention and its
autograd, on shapes that exercise every part of the emulation: several query
blocks accumulating into the key/value gradients (the scaled sum and the old
value rounded separately, as oneDNN does: a fused multiply-add differs in
about one element in 30,000), softmaxes driven into denormals (oneDNN's
conversion reads a denormal float as zero), grouped-query heads
accumulating in order, odd block tails. They check through the counters that
the kernel really ran, and that calls it must not take (another dtype, a
mask, blocks too small for oneDNN, the switch off) still match CPU on CPU's
kernel.
"""
import pytest
import torch
import torch.nn.functional as F

import torchneuron  # noqa: F401
from torchneuron import _C

from conftest import requires_async

pytestmark = [
    pytest.mark.skipif(not _C._flash_backward_bf16_available(),
                       reason="needs AVX-512 with BF16 dot products and ATen's AVX-512 kernels"),
    requires_async,
]


def bits(t):
    t = t.detach().cpu()
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def sdpa_grads(device, q, k, v, grad_out, **kwargs):
    """Output and input gradients of scaled_dot_product_attention on
    `device`, from CPU copies of the operands."""
    qq, kk, vv = (t.detach().to(device).requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qq, kk, vv, **kwargs)
    out.backward(grad_out.to(device))
    return [t.cpu() for t in (out.detach(), qq.grad, kk.grad, vv.grad)]


def operands(batch, heads, kv_heads, q_len, kv_len, head_dim, magnitude=1.0, seed=0,
             dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(batch, heads, q_len, head_dim, generator=g) * magnitude).to(dtype)
    k = (torch.randn(batch, kv_heads, kv_len, head_dim, generator=g) * magnitude).to(dtype)
    v = torch.randn(batch, kv_heads, kv_len, head_dim, generator=g).to(dtype)
    grad_out = torch.randn(batch, heads, q_len, head_dim, generator=g).to(dtype)
    return q, k, v, grad_out


def run_both(q, k, v, grad_out, **kwargs):
    """(CPU's results, the device's results, kernel runs meanwhile)."""
    if k.size(1) != q.size(1):
        kwargs["enable_gqa"] = True
    want = sdpa_grads("cpu", q, k, v, grad_out, **kwargs)
    before = _C._flash_backward_bf16_stats()[0]
    got = sdpa_grads("neuron", q, k, v, grad_out, **kwargs)
    torch.neuron.synchronize()
    return want, got, _C._flash_backward_bf16_stats()[0] - before


def assert_same(want, got):
    for name, w, g in zip(("out", "grad_q", "grad_k", "grad_v"), want, got):
        assert g.stride() == w.stride(), name
        assert torch.equal(bits(g), bits(w)), name


# (batch, heads, kv_heads, q_len, kv_len, head_dim, causal, magnitude)
QUALIFYING = [
    (4, 4, 2, 64, 64, 32, True, 1.0),     # the tiny Llama's attention (grouped heads)
    (16, 4, 4, 64, 64, 32, True, 1.0),    # the demo GPT's
    (4, 2, 2, 64, 64, 32, False, 1.0),    # two query blocks into every key row
    (2, 3, 3, 100, 100, 64, False, 3.0),  # a ragged last query block
    (2, 6, 2, 130, 130, 128, True, 10.0),
    (1, 2, 1, 200, 130, 48, True, 10.0),  # 64-row query blocks, keys shorter than queries
    (2, 2, 2, 96, 96, 16, False, 30.0),   # a softmax deep in denormals
]


@pytest.mark.parametrize("shape", QUALIFYING, ids=lambda s: "x".join(map(str, s)))
def test_matches_cpu_bit_for_bit(shape):
    *sizes, causal, magnitude = shape
    q, k, v, grad_out = operands(*sizes, magnitude=magnitude, seed=sum(sizes))
    want, got, runs = run_both(q, k, v, grad_out, is_causal=causal)
    assert runs == 1, "the device's kernel did not run"
    assert_same(want, got)


def test_accumulated_key_gradients_round_as_onednn_does():
    # Key gradients add a scaled block sum to the value the previous query
    # block left: mul then add, two roundings. 8 x 4 heads x 128 keys x 32 is
    # 131,072 key-gradient elements per seed, where a fused multiply-add
    # differs in about 4. (head_dim 32: a scale of 1/sqrt(64) would be a
    # power of two, whose products round no differently fused.)
    for seed in range(4):
        q, k, v, grad_out = operands(8, 4, 4, 128, 128, 32, seed=seed)
        want, got, runs = run_both(q, k, v, grad_out)
        assert runs == 1
        assert_same(want, got)


def test_views_into_a_fused_projection():
    # The demo GPT's q, k and v: head slices of one [batch, seq, 3 * dim]
    # projection, so their rows are strided.
    g = torch.Generator().manual_seed(7)
    base = torch.randn(4, 64, 3 * 128, generator=g).bfloat16()
    grad_out = torch.randn(4, 4, 64, 32, generator=g).bfloat16()

    def run(device):
        qkv = base.detach().to(device).requires_grad_()
        q, k, v = (t.view(4, 64, 4, 32).transpose(1, 2) for t in qkv.split(128, dim=2))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad_out.to(device))
        return out.detach().cpu(), qkv.grad.cpu()

    want = run("cpu")
    before = _C._flash_backward_bf16_stats()[0]
    got = run("neuron")
    assert _C._flash_backward_bf16_stats()[0] == before + 1
    for w, g_ in zip(want, got):
        assert torch.equal(bits(g_), bits(w))


def test_calibrates_each_geometry_once():
    q, k, v, grad_out = operands(3, 2, 2, 72, 72, 32, seed=5)
    tried = _C._flash_backward_bf16_stats()[1]
    for _ in range(3):
        want, got, runs = run_both(q, k, v, grad_out, is_causal=True)
        assert runs == 1
        assert_same(want, got)
    assert _C._flash_backward_bf16_stats()[1] == tried + 1


DECLINED = {
    # float32 keeps CPU's kernel (its products are MKL's sgemm throughout)
    "float32": (operands(2, 2, 2, 64, 64, 32, dtype=torch.float32), {"is_causal": True}),
    # a last query block of one row: oneDNN takes another route there
    "one-row block": (operands(2, 2, 2, 33, 64, 32), {}),
    # 16 x 16 x 16 multiply-adds per block: ATen's own loops, not oneDNN
    "tiny blocks": (operands(2, 2, 2, 16, 16, 16), {}),
    # head_dim not a multiple of 16
    "head_dim 24": (operands(2, 2, 2, 64, 64, 24), {}),
}


@pytest.mark.parametrize("case", sorted(DECLINED))
def test_other_calls_keep_cpus_kernel(case):
    (q, k, v, grad_out), kwargs = DECLINED[case]
    want, got, runs = run_both(q, k, v, grad_out, **kwargs)
    assert runs == 0
    assert_same(want, got)


@pytest.mark.parametrize("q_len,kv_len", [(0, 64), (64, 0), (1, 1)])
def test_empty_and_one_token_sequences(q_len, kv_len):
    # No block to form (a length of 0 once divided by zero in the
    # qualification): CPU's kernel runs, with CPU's results. The backward is
    # called directly, on an arbitrary out and logsumexp: CPU's forward
    # itself divides by zero on an empty query.
    q, k, v, grad_out = operands(2, 2, 2, q_len, kv_len, 32)
    lse = torch.zeros(2, 2, q_len)
    results = {}
    before = _C._flash_backward_bf16_stats()[0]
    for device in ("cpu", "neuron"):
        args = [t.to(device) for t in (grad_out, q, k, v, grad_out, lse)]
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *args, 0.0, False)
        results[device] = [g.cpu() for g in grads]
    assert _C._flash_backward_bf16_stats()[0] == before
    for w, g in zip(results["cpu"], results["neuron"]):
        assert g.shape == w.shape and torch.equal(bits(g), bits(w))


def test_a_mask_keeps_cpus_kernel():
    q, k, v, grad_out = operands(2, 2, 2, 64, 64, 32)
    mask = torch.rand(64, 64, generator=torch.Generator().manual_seed(1)) > 0.3
    mask |= torch.eye(64, dtype=torch.bool)
    want = sdpa_grads("cpu", q, k, v, grad_out, attn_mask=mask)
    before = _C._flash_backward_bf16_stats()[0]
    got = sdpa_grads("neuron", q, k, v, grad_out, attn_mask=mask.to("neuron"))
    assert _C._flash_backward_bf16_stats()[0] == before
    assert_same(want, got)


def test_switched_off_keeps_cpus_kernel():
    q, k, v, grad_out = operands(4, 4, 2, 64, 64, 32, seed=3)
    _C._set_flash_backward_bf16_enabled(False)
    try:
        want, got, runs = run_both(q, k, v, grad_out, is_causal=True)
    finally:
        _C._set_flash_backward_bf16_enabled(True)
    assert runs == 0
    assert_same(want, got)
