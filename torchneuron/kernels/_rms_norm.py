"""Fused RMSNorm on neuron (rms_norm.cpp): one pass per row, forward and backward.

Opt-in, because it is not bit for bit: ``torchneuron.kernels.rms_norm(x,
weight, eps)`` agrees with ``torch.nn.functional.rms_norm`` within a few ulp
(its sums run in another order); the eager device keeps ATen's composition.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ._kernel import cpp_kernel
from ._nki_op import nki_op

_SOURCE = (Path(__file__).resolve().parent / "rms_norm.cpp").read_text()
_forward = cpp_kernel(_SOURCE, "rms_norm_forward")
_backward = cpp_kernel(_SOURCE, "rms_norm_backward")


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dtype not in (torch.float32, torch.bfloat16) or weight.dtype != x.dtype:
        raise TypeError(f"rms_norm kernel: float32 or bfloat16 input and weight of the same "
                        f"dtype, got {x.dtype} and {weight.dtype}")
    if weight.dim() != 1 or x.dim() < 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(f"rms_norm kernel: weight of shape [{x.shape[-1] if x.dim() else '?'}] "
                         f"for input {tuple(x.shape)}, got {tuple(weight.shape)}")


@nki_op("torchneuron::rms_norm_forward", mutates_args=())
def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, weight)
    rows = x.numel() // x.shape[-1]
    x2 = x.contiguous().view(rows, x.shape[-1])
    y = torch.empty_like(x2)
    rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
    _forward(x2, weight.contiguous(), y, rstd, float(eps))
    return y.view(x.shape), rstd


@nki_op("torchneuron::rms_norm_backward", mutates_args=())
def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows = x.numel() // x.shape[-1]
    x2 = x.contiguous().view(rows, x.shape[-1])
    dx = torch.empty_like(x2)
    dw = torch.empty(x.shape[-1], device=x.device, dtype=torch.float32)
    _backward(grad.contiguous().view(rows, x.shape[-1]), x2, weight.contiguous(), rstd, dx, dw)
    return dx.view(x.shape), dw.to(weight.dtype)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, _eps = inputs
    ctx.save_for_backward(x, weight, output[1])


def _backward_formula(ctx, grad_y, grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_backward(grad_y, x, weight, rstd)
    return dx, dw, None


rms_norm_forward.register_autograd(_backward_formula, setup_context=_setup_context)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension, fused (differentiable, compiles without a graph break)."""
    return rms_norm_forward(x, weight, eps)[0]
