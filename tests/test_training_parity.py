"""Training parity: the same model, weights and batches on CPU and on neuron.

Each case trains >= 20 optimizer steps on both devices and requires the fp32
loss series and the final parameters to be bitwise identical: the neuron
device runs CPU's own kernels (asynchronously, on device memory), so the same
math gives the same bits. Dropout is off (p=0) because the two devices draw
random masks from different generators (CPU mt19937, neuron Philox).
"""
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchneuron

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from train_gpt import GPT  # noqa: E402

STEPS = 20


WARMUP = 2  # steps whose new argument kinds are verified inline


def train(model, device, batches, loss_fn, make_opt):
    """The losses, final parameters and the host waits after the warm-up."""
    model = model.to(device)
    opt = make_opt(model.parameters())
    losses = []
    for i, (x, y) in enumerate(batches):
        if i == WARMUP:
            torchneuron.clear_op_tracking()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    waits = torchneuron.get_host_waits()
    return [l.item() for l in losses], [p.detach().cpu() for p in model.parameters()], waits


def check_parity(make_model, batches, loss_fn, make_opt):
    torch.manual_seed(0)
    ref = make_model()
    dev = make_model()
    dev.load_state_dict(ref.state_dict())
    cpu_losses, cpu_params, _ = train(ref, "cpu", batches, loss_fn, make_opt)
    dev_losses, dev_params, waits = train(dev, "neuron", batches, loss_fn, make_opt)
    assert dev_losses == cpu_losses
    for a, b in zip(dev_params, cpu_params):
        assert torch.equal(a, b)
    assert cpu_losses[-1] < cpu_losses[0]  # it did learn
    # The hot path is asynchronous: after the warm-up the host never waited
    # for the device (every wait is recorded with its cause), and no op ran
    # on the synchronous path or inline.
    assert waits == [], [(w["cause"], w["op"]) for w in waits]
    assert torchneuron.get_fallback_ops() == [] and torchneuron.get_inline_ops() == []


def fused_adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, fused=True)


def foreach_adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, foreach=True)


def default_adamw(params):
    return torch.optim.AdamW(params, lr=1e-2)  # foreach, picked by PyTorch


@pytest.mark.parametrize("make_opt", [fused_adamw, foreach_adamw, default_adamw],
                         ids=["fused", "foreach", "default"])
def test_mlp(make_opt):
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(20, 5, generator=g)
    xs = [torch.randn(32, 20, generator=g) for _ in range(STEPS)]
    batches = [(x, (x @ teacher).argmax(1)) for x in xs]
    check_parity(
        lambda: nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(),
                              nn.Linear(64, 5)),
        batches, F.cross_entropy, make_opt)


def test_cnn_with_batch_norm():
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(8, 3, 16, 16, generator=g) for _ in range(STEPS)]
    batches = [(x, (x.mean((1, 2, 3)) > 0).long()) for x in xs]
    check_parity(
        lambda: nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)),
        batches, F.cross_entropy, fused_adamw)


def test_small_transformer():
    g = torch.Generator().manual_seed(3)
    vocab, block = 40, 16
    batches = []
    for _ in range(STEPS):
        # Counting sequences with a random start and stride: learnable.
        start = torch.randint(0, vocab, (4, 1), generator=g)
        stride = torch.randint(1, 4, (4, 1), generator=g)
        x = (start + stride * torch.arange(block + 1)) % vocab
        batches.append((x[:, :-1], x[:, 1:]))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt = GPT(vocab, block, dim=32, heads=4, layers=2, dropout=0.0)

        def forward(self, x):
            return self.gpt(x)[0]

    def loss_fn(logits, y):
        return F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))

    check_parity(LM, batches, loss_fn, fused_adamw)
