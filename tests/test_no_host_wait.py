"""A training step queues on the device without the host waiting for it.

For the demo GPT, torchvision's resnet18 and a tiny Hugging Face Llama, under
each optimizer/precision configuration users reach for first, a long sleep
kernel is put at the head of the stream and one whole training step (forward,
loss, backward, clipping, optimizer step, LR schedule, GradScaler update) is
issued behind it. The step must return to the host in a fraction of the sleep,
with the stream still busy and no host wait recorded; then the training run
must give CPU's exact losses and parameters.

The first step waits for nothing either: the first call of each argument kind
is verified on scratch memory, not on the device's data (README, "How ops
run"). That step does more host work (Meta passes, verification runs), so its
host time and queue state are not held to the bound; its waits are.

Autocast: neuron applies CUDA's op policies. Where CPU's autocast policy
differs on an op these models use (layer_norm: fp32 on CUDA, input dtype on
CPU), the CPU reference applies CUDA's cast explicitly, so the same math runs.
"""
import contextlib
import os
import sys
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchneuron
from tiny_models import tiny_llama

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from train_gpt import GPT  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("NEURON_LAUNCH_BLOCKING") == "1",
                                reason="observes asynchrony")

SLEEP_S = 1.0
STEPS = 3


# --- models ---------------------------------------------------------------

def make_gpt():
    torch.manual_seed(0)
    model = GPT(vocab=48, block=16, dim=32, heads=4, layers=2, dropout=0.0)
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(STEPS):
        x = torch.randint(0, 48, (4, 17), generator=g)
        batches.append((x[:, :-1], x[:, 1:]))

    def loss_fn(model, batch):
        x, y = batch
        logits, _ = model(x)
        return F.cross_entropy(logits.reshape(-1, 48).float(), y.reshape(-1))
    return model, batches, loss_fn


def make_resnet18():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 10, (2,), generator=g))
               for _ in range(STEPS)]

    def loss_fn(model, batch):
        x, y = batch
        return F.cross_entropy(model(x).float(), y)
    return model, batches, loss_fn


def make_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = tiny_llama(transformers)
    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(3, 64, (2, 12), generator=g) for _ in range(STEPS)]

    def loss_fn(model, ids):
        return model(input_ids=ids, labels=ids).loss
    return model, batches, loss_fn


MODELS = {"gpt": make_gpt, "resnet18": make_resnet18, "llama": make_llama}


# --- configurations ---------------------------------------------------------

class Config:
    """One way to train: optimizer, schedule, precision, clipping."""

    def __init__(self, opt, sched=None, amp=None, scaler=False, clip=False):
        self.opt, self.sched, self.amp, self.scaler, self.clip = opt, sched, amp, scaler, clip


def cosine(opt):
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)


CONFIGS = {
    # PyTorch's defaults: AdamW picks foreach on neuron as on CUDA.
    "adamw_foreach": Config(lambda p: torch.optim.AdamW(p, lr=1e-2)),
    "adamw_fused_cosine": Config(lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True), cosine),
    "adamw_fused_lambdalr": Config(
        lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s))),
    "sgd_nesterov_steplr": Config(
        lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True),
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.7)),
    "bf16_autocast": Config(lambda p: torch.optim.AdamW(p, lr=1e-2), amp=torch.bfloat16),
    "fp16_autocast_gradscaler_fused": Config(
        lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True), amp=torch.float16, scaler=True),
    "clip_grad_norm": Config(lambda p: torch.optim.AdamW(p, lr=1e-2), clip=True),
}


@contextlib.contextmanager
def cuda_autocast_policy_on_cpu():
    """CUDA's autocast runs layer_norm in fp32; CPU's runs it in the input dtype.
    For the CPU reference, layer_norm gets CUDA's casts written out."""
    original = F.layer_norm

    def layer_norm(x, shape, weight=None, bias=None, eps=1e-5):
        if torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", enabled=False):
                return original(x.float(), shape,
                                None if weight is None else weight.float(),
                                None if bias is None else bias.float(), eps)
        return original(x, shape, weight, bias, eps)
    F.layer_norm = layer_norm
    try:
        yield
    finally:
        F.layer_norm = original


def to_device(batch, device):
    if isinstance(batch, (tuple, list)):
        return type(batch)(b.to(device) for b in batch)
    return batch.to(device)


def train(make_model, cfg, device, watch):
    """Trains STEPS steps; with watch, each step after the warm-up is issued
    behind a sleep kernel and its host time, queue state and host waits are
    returned."""
    model, batches, loss_fn = make_model()
    model = model.to(device)
    opt = cfg.opt(model.parameters())
    sched = cfg.sched(opt) if cfg.sched else None
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 8) if cfg.scaler else None
    batches = [to_device(b, device) for b in batches]  # uploaded before timing
    losses, observed = [], []

    def step(batch):
        with torch.autocast(device, dtype=cfg.amp, enabled=cfg.amp is not None):
            loss = loss_fn(model, batch)
        opt.zero_grad(set_to_none=True)
        if scaler:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if cfg.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if sched:
            sched.step()
        return loss.detach()

    for i, batch in enumerate(batches):
        if not watch:
            losses.append(step(batch))
            continue
        torch.neuron.synchronize()
        torchneuron.clear_op_tracking()
        torch.neuron._sleep(int(SLEEP_S * 1e6))
        t0 = time.perf_counter()
        losses.append(step(batch))
        host = time.perf_counter() - t0
        busy = not torch.neuron.current_stream().query()
        observed.append((host, busy, torchneuron.get_host_waits(), torchneuron.get_op_paths()))
    params = [p.detach().cpu() for p in model.parameters()]
    return [l.cpu() for l in losses], params, observed


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("model", list(MODELS))
def test_training_step_queues_without_host_wait(model, config):
    cfg = CONFIGS[config]
    dev_losses, dev_params, observed = train(MODELS[model], cfg, "neuron", watch=True)
    for i, (host, busy, waits, paths) in enumerate(observed):
        assert waits == [], f"host waited: {[(w['cause'], w['op'], w['stack'][-3:]) for w in waits]}"
        inline = {op: r["inline"] for op, r in paths.items() if r["inline"]}
        fallback = {op: r["fallback"] for op, r in paths.items() if r["fallback"]}
        assert not inline and not fallback, (inline, fallback)
        if i == 0:
            continue  # the first step's extra host work: see the module docstring
        assert busy, "the sleep kernel had finished: the step waited for it"
        assert host < 0.5 * SLEEP_S, f"the step took {host:.3f}s on the host"
    with cuda_autocast_policy_on_cpu() if cfg.amp else contextlib.nullcontext():
        cpu_losses, cpu_params, _ = train(MODELS[model], cfg, "cpu", watch=False)
    for i, (a, b) in enumerate(zip(dev_losses, cpu_losses)):
        assert torch.equal(a, b), f"step {i}: loss {a} vs CPU {b}"
    for a, b in zip(dev_params, cpu_params):
        assert torch.equal(a, b)


def test_host_waits_are_counted_with_cause_and_stack():
    x = torch.randn(16, device="neuron")
    torch.neuron.synchronize()
    torchneuron.clear_op_tracking()
    x.sum().item()                              # scalar_read
    x.cpu()                                     # copy_to_host
    torch.nonzero(x > 0)                        # data_dependent
    torch.neuron.synchronize()                  # synchronize
    waits = torchneuron.get_host_waits()
    causes = [w["cause"] for w in waits]
    for cause in ("scalar_read", "copy_to_host", "data_dependent", "synchronize"):
        assert cause in causes, causes
    counts = torchneuron.host_wait_counts()
    assert sum(counts.values()) == len(waits)
    here = [w for w in waits if w["cause"] == "scalar_read"][0]
    # The Python stack names this test function, innermost frame last.
    assert any(f[2] == "test_host_waits_are_counted_with_cause_and_stack" for f in here["stack"])
    assert here["stack"][-1][0] == __file__


def test_sync_debug_mode_warns_and_raises():
    x = torch.randn(8, device="neuron")
    x.sum().item()  # this argument kind is verified already
    try:
        torch.neuron.set_sync_debug_mode("warn")
        assert torch.neuron.get_sync_debug_mode() == 1
        with pytest.warns(UserWarning, match="synchronizing neuron operation"):
            x.sum().item()
        torch.neuron.set_sync_debug_mode("error")
        with pytest.raises(RuntimeError, match="synchronizing neuron operation"):
            x.cpu()
        torch.neuron.synchronize()  # asked for: never an error
        y = x * 2  # queued work is fine
        with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
            torch.neuron.set_sync_debug_mode("loud")
    finally:
        torch.neuron.set_sync_debug_mode(0)
    assert torch.equal(y.cpu(), x.cpu() * 2)


def test_conversion_copies_are_queued():
    """Dtype and layout conversions on the device run on the stream."""
    x = torch.randn(64, 32, device="neuron")
    ops = [lambda: x.half(), lambda: x.to(torch.bfloat16), lambda: x.t().contiguous(),
           lambda: x.t().reshape(-1), lambda: x[:, ::2].clone(),
           lambda: x.to("neuron:1") if torch.neuron.device_count() > 1 else x.clone()]
    for op in ops:
        op()  # warm-up
    torch.neuron.synchronize()
    torchneuron.clear_op_tracking()
    torch.neuron._sleep(int(0.5e6))
    t0 = time.perf_counter()
    results = [op() for op in ops]
    host = time.perf_counter() - t0
    assert not torch.neuron.current_stream().query()
    assert torchneuron.get_host_waits() == []
    assert host < 0.25
    ref = x.cpu()
    expected = [ref.half(), ref.to(torch.bfloat16), ref.t().contiguous(), ref.t().reshape(-1),
                ref[:, ::2].clone(), ref]
    for r, e in zip(results, expected):
        assert torch.equal(r.cpu(), e)
