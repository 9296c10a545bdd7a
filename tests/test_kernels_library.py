"""The kernel library's rotary embedding and tiled attention (torchneuron.kernels)
against the eager compositions on CPU: forward and backward, float32 and
bfloat16, under torch.compile, and their input checks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torchneuron.kernels import attention, rotary_embedding

N = "neuron"


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary_eager(x, cos, sin):
    # transformers' apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1), for one tensor.
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin


def _tables(batch, seq, dim, dtype):
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2).float() / dim))
    positions = torch.arange(seq).float()[None, :, None] + torch.arange(batch)[:, None, None] * 7
    emb = torch.cat((positions * inv_freq, positions * inv_freq), dim=-1)   # [batch, seq, dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


# --- rotary embedding --------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("table_batch", [1, 2])
def test_rotary_forward_backward_against_the_eager_composition(dtype, table_batch):
    torch.manual_seed(0)
    # q as attention layers make it: [batch, seq, heads, dim] transposed (not contiguous).
    x = torch.randn(2, 19, 3, 32, dtype=dtype).transpose(1, 2).requires_grad_()
    cos, sin = _tables(table_batch, 19, 32, dtype)
    grad = torch.randn(2, 3, 19, 32, dtype=dtype)
    ref = _rotary_eager(x, cos, sin)
    ref.backward(grad)
    xn = x.detach().to(N).requires_grad_()
    out = rotary_embedding(xn, cos.to(N), sin.to(N))
    out.backward(grad.to(N))
    assert out.shape == ref.shape and out.stride() == ref.stride()
    if dtype == torch.float32:
        # Two rounded products and one rounded sum per element, as ATen's ops
        # (the kernel is built without FMA contraction): bit for bit.
        assert torch.equal(out.detach().cpu(), ref.detach())
        assert torch.equal(xn.grad.cpu(), x.grad)
        return
    # bfloat16: the kernel computes in float (products of bf16 values are exact
    # there) and rounds once, so it equals the float32 composition rounded.
    xf = x.detach().float().requires_grad_()
    ref_f = _rotary_eager(xf, cos.float(), sin.float())
    ref_f.backward(grad.float())
    assert torch.equal(out.detach().cpu(), ref_f.detach().to(dtype))
    assert torch.equal(xn.grad.cpu(), xf.grad.to(dtype))
    # The bf16 composition rounds both products and the sum: with u = eps/2,
    # |eager - exact| <= u*T + u*|y| and |kernel - exact| <= u*|y|, T = |a| + |b|
    # for the two products a, b of an element, so they differ by at most
    # 3u*T = 1.5 eps*T (measured 1.0 eps*T); likewise for the gradient.
    eps = torch.finfo(dtype).eps
    for got, want, terms in ((out.detach().cpu(), ref.detach(), _terms(x.detach(), cos, sin)),
                             (xn.grad.cpu(), x.grad, _terms_backward(grad, cos, sin))):
        assert ((got.float() - want.float()).abs() <= 1.5 * eps * terms).all()


def _terms(x, cos, sin):
    # |x * cos| + |rotate_half(x) * sin|: the magnitudes of the forward's two products.
    c, s = cos.float().unsqueeze(1).abs(), sin.float().unsqueeze(1).abs()
    return x.float().abs() * c + _rotate_half(x.float()).abs() * s


def _terms_backward(grad, cos, sin):
    # |g * cos| + |(g * sin) rotated back|: the backward's two products.
    g = grad.float().abs()
    t = g * sin.float().unsqueeze(1).abs()
    return g * cos.float().unsqueeze(1).abs() + _rotate_half(t).abs()


def test_rotary_on_cpu_tensors_runs_the_same_kernel():
    x = torch.randn(1, 2, 5, 8)
    cos, sin = _tables(1, 5, 8, torch.float32)
    assert torch.equal(rotary_embedding(x, cos, sin), _rotary_eager(x, cos, sin))
    assert torch.equal(rotary_embedding(x.to(N), cos.to(N), sin.to(N)).cpu(),
                       rotary_embedding(x, cos, sin))


def test_rotary_gives_no_gradient_to_the_tables():
    x = torch.randn(1, 2, 5, 8, device=N, requires_grad=True)
    cos, sin = (t.to(N).requires_grad_() for t in _tables(1, 5, 8, torch.float32))
    rotary_embedding(x, cos, sin).sum().backward()
    assert x.grad is not None and cos.grad is None and sin.grad is None


def test_rotary_rejects_bad_input():
    x = torch.randn(2, 3, 5, 8, device=N)
    cos, sin = (t.to(N) for t in _tables(2, 5, 8, torch.float32))
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        rotary_embedding(x.double(), cos.double(), sin.double())
    with pytest.raises(TypeError, match="x's dtype"):
        rotary_embedding(x, cos.bfloat16(), sin)
    with pytest.raises(ValueError, match="even head_dim"):
        rotary_embedding(x[..., :7], cos[..., :7], sin[..., :7])
    with pytest.raises(ValueError, match=r"\[batch, heads, seq, head_dim\]"):
        rotary_embedding(x[0], cos, sin)
    with pytest.raises(ValueError, match="cos of shape"):
        rotary_embedding(x, cos[:, :4], sin)
    with pytest.raises(ValueError, match="cos of shape"):
        rotary_embedding(x, torch.cat([cos, cos, cos])[:3], sin)
    with pytest.raises(ValueError, match="one device"):
        rotary_embedding(x, cos.cpu(), sin)


# --- attention ----------------------------------------------------------------

def _sdpa_math(q, k, v, causal, grad):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def _normwise(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


# (batch, heads, seq_q, seq_k, head_dim, head_dim_v, causal); the tiles are 64
# queries by 64 keys: one partial tile, several with a partial last one,
# seq_q != seq_k both ways, a value head_dim unlike q's, head dims not
# multiples of 16 (the kernel pads them).
SHAPES = [(2, 3, 37, 37, 16, 16, False), (2, 3, 37, 37, 16, 16, True),
          (1, 2, 100, 70, 32, 24, False), (1, 2, 70, 100, 32, 32, True),
          (1, 2, 130, 130, 64, 64, True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:6])) +
                         ("-causal" if s[6] else ""))
def test_attention_forward_backward_against_sdpa(dtype, shape):
    batch, heads, sq, sk, d, dv, causal = shape
    torch.manual_seed(0)
    q = torch.randn(batch, heads, sq, d, dtype=dtype)
    k = torch.randn(batch, heads, sk, d, dtype=dtype)
    v = torch.randn(batch, heads, sk, dv, dtype=dtype)
    grad = torch.randn(batch, heads, sq, dv, dtype=dtype)
    ref = _sdpa_math(q, k, v, causal, grad)
    exact = _sdpa_math(q.double(), k.double(), v.double(), causal, grad.double())
    qn, kn, vn = (t.to(N).requires_grad_() for t in (q, k, v))
    out = attention(qn, kn, vn, is_causal=causal)
    out.backward(grad.to(N))
    got = (out.detach().cpu(), qn.grad.cpu(), kn.grad.cpu(), vn.grad.cpu())
    eps = torch.finfo(dtype).eps
    for name, g, r, e in zip(("out", "dq", "dk", "dv"), got, ref, exact):
        assert g.dtype == dtype and g.shape == r.shape, name
        if dtype == torch.float32:
            # Sums over keys and head dims in another order (tiles, online
            # softmax rescaling, a polynomial exp within 1 ulp): the kernel and
            # the math reference are each within ~8 eps of the float64 result
            # relative to the largest magnitude (measured: kernel 6.5, SDPA
            # 7.7), so they differ by at most 16 eps (measured 9.5); and the
            # kernel is about as accurate as SDPA itself.
            assert _normwise(g, r) <= 16 * eps, name
            assert _normwise(g, e) <= 2 * _normwise(r, e) + 2 * eps, name
        else:
            # bfloat16: both compute in float and round each result once (SDPA's
            # math path upcasts), so out and dv differ by rounding (measured 0.2
            # eps); dq and dk also see delta = dout . out taken from the bf16
            # output (as FlashAttention does), within 2 eps (measured 0.98).
            bound = 1 if name in ("out", "dv") else 2
            assert _normwise(g, r) <= bound * eps, name


def test_attention_scale_strides_and_cpu_tensors():
    torch.manual_seed(1)
    # [batch, seq, heads, dim] transposed, as attention layers make them: read in place.
    q, k, v = (torch.randn(1, 20, 2, 16).transpose(1, 2) for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    out = attention(q, k, v, scale=0.3)        # CPU tensors: the kernel on this thread
    assert _normwise(out, ref) <= 16 * torch.finfo(torch.float32).eps
    assert torch.equal(attention(q.to(N), k.to(N), v.to(N), scale=0.3).cpu(), out)


def test_attention_rejects_bad_input():
    q = torch.randn(1, 2, 8, 16, device=N)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        attention(q.half(), q.half(), q.half())
    with pytest.raises(TypeError, match="q's dtype"):
        attention(q, q.bfloat16(), q)
    with pytest.raises(ValueError, match=r"\[batch, heads, seq, head_dim\]"):
        attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="same batch and heads"):
        attention(q, q[:, :1], q[:, :1])
    with pytest.raises(ValueError, match="head_dim"):
        attention(q, q[..., :8], q)
    with pytest.raises(ValueError, match="k's seq"):
        attention(q, q, q[:, :, :4])
    with pytest.raises(ValueError, match="at least one key"):
        attention(q, q[:, :, :0], q[:, :, :0])
    with pytest.raises(ValueError, match="one device"):
        attention(q, q.cpu(), q)


# --- both, compiled -----------------------------------------------------------

def _block(x, wq, wk, cos, sin):
    # A causal attention layer's core: projections, rotary on q and k, attention.
    q = rotary_embedding((x @ wq).unflatten(-1, (2, 16)).transpose(1, 2), cos, sin)
    k = rotary_embedding((x @ wk).unflatten(-1, (2, 16)).transpose(1, 2), cos, sin)
    v = (x * 2).unflatten(-1, (2, 16)).transpose(1, 2)
    return attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2).tanh()


def test_kernels_compile_without_a_graph_break():
    torch.manual_seed(0)
    x, wq, wk = torch.randn(2, 40, 32), torch.randn(32, 32), torch.randn(32, 32)
    cos, sin = _tables(1, 40, 16, torch.float32)
    grad = torch.randn(2, 40, 32)

    def run(device):
        torch._dynamo.reset()
        inputs = [t.to(device).requires_grad_() for t in (x, wq, wk)]
        out = torch.compile(_block, fullgraph=True)(*inputs, cos.to(device), sin.to(device))
        out.backward(grad.to(device))
        return [out.detach().cpu()] + [t.grad.cpu() for t in inputs]

    # The reference for compiled code is the same function compiled on CPU
    # tensors: Inductor's code around the ops, the same kernels inside them.
    for got, want in zip(run(N), run("cpu")):
        assert torch.equal(got, want)
