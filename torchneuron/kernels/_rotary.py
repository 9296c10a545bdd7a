"""Rotary position embedding on neuron (rotary.cpp), forward and backward.

``torchneuron.kernels.rotary_embedding(x, cos, sin)`` is Hugging Face Llama's
``x * cos + rotate_half(x) * sin`` (``apply_rotary_pos_emb`` with
``unsqueeze_dim=1``) in one pass: x of shape [batch, heads, seq, head_dim]
(any strides, e.g. q/k transposed from [batch, seq, heads, head_dim]), cos and
sin of shape [batch or 1, seq, head_dim], broadcast over heads. In float32 it
is bit for bit the eager composition (two rounded products and a rounded sum
per element, as ATen's ops round them); in bfloat16 it computes in float and
rounds once (the composition rounds after each op). The gradient flows to x
only: cos and sin get None (they are position tables, not trained).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ._kernel import Kernel, check_float_inputs, cpp_kernel
from ._nki_op import nki_op

_SOURCE = (Path(__file__).resolve().parent / "rotary.cpp").read_text()


# Extra flags come after Inductor's: no fused multiply-adds whatever
# torch._inductor.config.cpp.enable_floating_point_contract_flag says (each
# product rounds as ATen's mul does), and the loop vectorizer back on
# (Inductor turns it off, which also disables `#pragma omp simd`).
_FLAGS = ("-ffp-contract=off", "-ftree-loop-vectorize")
_forward = cpp_kernel(_SOURCE, "rotary_embedding_forward", _FLAGS)
_backward = cpp_kernel(_SOURCE, "rotary_embedding_backward", _FLAGS)


def _check(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    check_float_inputs("rotary_embedding", x=x, cos=cos, sin=sin)
    if x.dim() != 4 or x.shape[-1] % 2:
        raise ValueError(f"rotary_embedding: x of shape [batch, heads, seq, head_dim] with an "
                         f"even head_dim, got {tuple(x.shape)}")
    batch, _, seq, dim = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 3 or t.shape[0] not in (1, batch) or tuple(t.shape[1:]) != (seq, dim):
            raise ValueError(f"rotary_embedding: {name} of shape [{batch} or 1, {seq}, {dim}] "
                             f"for x of shape {tuple(x.shape)}, got {tuple(t.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"rotary_embedding: cos and sin of one shape, got {tuple(cos.shape)} "
                         f"and {tuple(sin.shape)}")


def _tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    # [b or 1, seq, dim] -> [batch, heads, seq, dim] views (stride 0 over heads).
    return cos.unsqueeze(1).expand(x.shape), sin.unsqueeze(1).expand(x.shape)


def _run(kernel: Kernel, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty_like(x)   # x's layout (dense), as the eager ops give
    if out.stride(-1) != 1:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    c, s = _tables(x, cos, sin)
    kernel(x, c, s, out)
    return out


@nki_op("torchneuron::rotary_embedding_forward", mutates_args=())
def rotary_embedding_forward(x: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor) -> torch.Tensor:
    _check(x, cos, sin)
    return _run(_forward, x, cos, sin)


@nki_op("torchneuron::rotary_embedding_backward", mutates_args=())
def rotary_embedding_backward(grad: torch.Tensor, cos: torch.Tensor,
                              sin: torch.Tensor) -> torch.Tensor:
    _check(grad, cos, sin)
    return _run(_backward, grad, cos, sin)


def _setup_context(ctx, inputs, output) -> None:
    _x, cos, sin = inputs
    ctx.save_for_backward(cos, sin)


def _backward_formula(ctx, grad):
    cos, sin = ctx.saved_tensors
    return rotary_embedding_backward(grad, cos, sin), None, None


rotary_embedding_forward.register_autograd(_backward_formula, setup_context=_setup_context)


def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for x [batch, heads, seq, head_dim] and cos/sin
    [batch or 1, seq, head_dim] (fused; differentiable in x only, cos and sin get no
    gradient; compiles without a graph break)."""
    return rotary_embedding_forward(x, cos, sin)
