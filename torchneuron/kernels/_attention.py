"""Tiled attention on neuron (attention.cpp): FlashAttention-style forward and backward.

``torchneuron.kernels.attention(q, k, v, is_causal=False, scale=None)`` is
``F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)``
for q [batch, heads, seq_q, head_dim], k [batch, heads, seq_k, head_dim] and v
[batch, heads, seq_k, head_dim_v] (float32 or bfloat16, math in float; no
mask, no dropout, as many key/value heads as query heads). The forward keeps
an online softmax over key tiles and saves one logsumexp per query row; the
backward recomputes the probabilities from it, tile by tile, so memory stays
O(seq) where the composition materializes [seq_q, seq_k] matrices. Not bit
for bit: its sums run in another order than ATen's (the tests bound it).
``is_causal`` masks as SDPA does (query i sees keys j <= i, top-left aligned).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from ._kernel import check_float_inputs, cpp_kernel
from ._nki_op import nki_op

_SOURCE = (Path(__file__).resolve().parent / "attention.cpp").read_text()


# After Inductor's flags: multiply-adds fused (the kernel is not bit for
# bit anyway; one rounding instead of two) and the loop vectorizer back on
# (Inductor turns it off, which also disables `#pragma omp simd`).
_FLAGS = ("-ffp-contract=fast", "-ftree-loop-vectorize")
_forward = cpp_kernel(_SOURCE, "attention_forward", _FLAGS)
_backward = cpp_kernel(_SOURCE, "attention_backward", _FLAGS)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    check_float_inputs("attention", q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"attention: {name} of shape [batch, heads, seq, head_dim], got "
                             f"{tuple(t.shape)}")
    if k.shape[:2] != q.shape[:2] or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"attention: q, k and v with the same batch and heads, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"attention: k with q's head_dim {q.shape[3]}, got {tuple(k.shape)}")
    if v.shape[2] != k.shape[2]:
        raise ValueError(f"attention: v with k's seq {k.shape[2]}, got {tuple(v.shape)}")
    if k.shape[2] == 0:
        raise ValueError(f"attention: at least one key, got k of shape {tuple(k.shape)}")


@nki_op("torchneuron::attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    _check(q, k, v)
    batch, heads, seq_q, _ = q.shape
    out = torch.empty(batch, heads, seq_q, v.shape[3], dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, heads, seq_q, dtype=torch.float32, device=q.device)
    _forward(q, k, v, out, lse, float(scale), bool(is_causal))
    return out, lse


@nki_op("torchneuron::attention_backward", mutates_args=())
def attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       out: torch.Tensor, lse: torch.Tensor, is_causal: bool,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(q, k, v)
    if grad.shape != out.shape or grad.dtype != out.dtype:
        raise ValueError(f"attention backward: grad of shape {tuple(out.shape)} and dtype "
                         f"{out.dtype}, got {tuple(grad.shape)} and {grad.dtype}")
    out = out.contiguous()
    lse = lse.contiguous()
    delta = torch.empty_like(lse)   # dout . out per query row (scratch)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _backward(grad, q, k, v, out, lse, delta, dq, dk, dv, float(scale), bool(is_causal))
    return dq, dk, dv


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, is_causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.is_causal, ctx.scale = is_causal, scale


def _backward_formula(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(grad_out, q, k, v, out, lse, ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None


attention_forward.register_autograd(_backward_formula, setup_context=_setup_context)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
              scale: float | None = None) -> torch.Tensor:
    """``softmax(scale * q k^T (causally masked)) v`` for q, k, v [batch, heads, seq, head_dim],
    tiled (differentiable in q, k and v; compiles without a graph break). ``scale``
    defaults to ``1 / sqrt(head_dim)``."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return attention_forward(q, k, v, bool(is_causal), float(scale))[0]
