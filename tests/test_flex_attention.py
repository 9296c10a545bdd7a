"""FlexAttention on neuron (eager): forward and backward.

torch refuses devices outside a fixed list in flex_attention(); the one shim of
torch (torchneuron/_flex_attention_shim.py) lets neuron through. Reference:
the same attention written densely (scores, mask, softmax, weighted sum) on
CPU (eager CPU FlexAttention has no backward); FlexAttention's eager path
computes the same math in another order, so values agree to rounding: bound
1e-5.
"""
import warnings

import pytest
import torch
import torch.nn.attention.flex_attention as flex
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

N = torch.device("neuron")


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def dense_reference(q, k, v, score_mod=None):
    scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    if score_mod is not None:
        scores = score_mod(scores)
    L, S = q.shape[-2], k.shape[-2]
    mask = torch.ones(L, S, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, 32, 16, generator=g) for _ in range(3)]


def test_shim_is_scoped_to_neuron():
    assert flex._validate_device._torchneuron_shim
    with pytest.raises(ValueError, match="only supported on"):
        flex._validate_device(torch.empty(1, device="meta"), None, None)


@pytest.mark.parametrize("with_score_mod", [False, True])
def test_eager_forward_and_backward(with_score_mod):
    def bias(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx) * 0.01
    q, k, v = _inputs()
    dev = [t.to(N).requires_grad_() for t in (q, k, v)]
    block_mask = create_block_mask(causal, 1, 1, 32, 32, device=N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile"
        out = flex_attention(*dev, score_mod=bias if with_score_mod else None,
                             block_mask=block_mask)
    assert out.device.type == "neuron"
    (out * torch.arange(16.0, device=N)).sum().backward()

    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    if with_score_mod:
        rel = (torch.arange(32)[:, None] - torch.arange(32)[None, :]) * 0.01
        ref = dense_reference(*ref_in, score_mod=lambda s: s + rel)
    else:
        ref = dense_reference(*ref_in)
    (ref * torch.arange(16.0)).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    for a, b in zip(dev, ref_in):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("with_score_mod", [False, True])
def test_compiled_forward_and_backward_match_eager(with_score_mod):
    """Compiled on neuron: the flex_attention / flex_attention_backward nodes
    become FlexAttention's dense math (torchneuron/compiler/flex_attention.py),
    which Inductor compiles; eager runs the same math, in another order:
    bound 1e-5 (measured: 6e-8 forward, 1e-6 gradients)."""
    def bias(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx) * 0.01
    score_mod = bias if with_score_mod else None
    q, k, v = _inputs(1)
    # create_block_mask compiled, as TorchTitan builds its masks.
    block_mask = torch.compile(create_block_mask)(causal, 1, 1, 32, 32, device=N)

    def run(fn):
        ins = [t.to(N).requires_grad_() for t in (q, k, v)]
        out = fn(*ins, score_mod=score_mod, block_mask=block_mask)
        (out * torch.arange(16.0, device=N)).sum().backward()
        return [out.detach().cpu()] + [t.grad.cpu() for t in ins]

    torch._dynamo.reset()
    compiled = run(torch.compile(flex_attention))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = run(flex_attention)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_shim_costs_import_torch_nothing():
    from conftest import run_python
    r = run_python("""
        import sys, torch
        assert "torchneuron" in sys.modules
        print("flex" if "torch.nn.attention.flex_attention" in sys.modules else "lazy")
        import torch.nn.attention.flex_attention as flex
        print(flex._validate_device._torchneuron_shim)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["lazy", "True"]
