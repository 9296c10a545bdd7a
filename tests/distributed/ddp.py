"""DDP workers: the same DDP script on neuron tensors (the "neuron" backend)
and on CPU tensors (Gloo), in one group "cpu:gloo,neuron:neuron"."""
from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.distributed.launcher import main

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from train_gpt import GPT, batches, load_corpus, make_optimizer  # noqa: E402


class WithUnused(nn.Module):
    """A model with a branch that takes no part in the loss (find_unused_parameters)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)
        self.unused = nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def setup():
    rank = int(os.environ["RANK"])
    torch.neuron.set_device(rank % torch.neuron.device_count())
    dist.init_process_group("cpu:gloo,neuron:neuron")
    return rank, dist.get_world_size()


def _train(model, device, steps, batch_fn, ddp_kwargs, accumulate=False):
    ddp = DDP(model.to(device), **ddp_kwargs)
    opt, sched = make_optimizer(ddp, 1e-3, steps)
    losses, params = [], []
    for step in range(steps):
        x, y = batch_fn(step)
        x, y = x.to(device), y.to(device)
        if accumulate:
            # Gradient accumulation: the first micro-batch under no_sync().
            with ddp.no_sync():
                loss = ddp(x[: len(x) // 2], y[: len(y) // 2])
                loss.backward()
            loss = ddp(x[len(x) // 2:], y[len(y) // 2:])
        else:
            loss = ddp(x, y)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().cpu())
        params.append([p.detach().cpu().clone() for p in ddp.module.parameters()])
    return losses, params


def gpt_parity():
    """The demo GPT, DDP over 2 ranks: neuron vs CPU-Gloo, loss and parameters every step."""
    rank, world = setup()
    data, chars = load_corpus()
    torch.manual_seed(0)
    base = GPT(len(chars), 32, dim=64, heads=4, layers=2)
    rank_batches = list(batches(data, 4, 8, 32, seed=100 + rank))  # each rank its own data

    class Wrapped(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x, y):
            return self.m(x, y)[1]

    out = {}
    for name, kwargs, accumulate in [
        ("ddp", {}, False),
        ("ddp-small-buckets", {"bucket_cap_mb": 0.05}, False),  # many buckets
        ("ddp-no_sync", {}, True),
        ("ddp-grad-as-bucket-view", {"gradient_as_bucket_view": True}, False),
    ]:
        steps = 3
        cpu = _train(Wrapped(copy.deepcopy(base)), "cpu", steps, lambda s: rank_batches[s], kwargs,
                     accumulate)
        dev = _train(Wrapped(copy.deepcopy(base)), "neuron", steps, lambda s: rank_batches[s],
                     kwargs, accumulate)
        for s in range(steps):
            out[f"{name}-loss-{s}"] = (dev[0][s], cpu[0][s])
            out[f"{name}-params-{s}"] = (dev[1][s], cpu[1][s])
    dist.destroy_process_group()
    return out


def unused_parameters():
    rank, world = setup()
    torch.manual_seed(0)
    base = WithUnused()
    g = torch.Generator().manual_seed(rank)
    xs = [torch.randn(4, 16, generator=g) for _ in range(3)]
    out = {}
    results = {}
    for device in ("cpu", "neuron"):
        model = DDP(copy.deepcopy(base).to(device), find_unused_parameters=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        seq = []
        for x in xs:
            loss = model(x.to(device)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            seq.append((loss.detach().cpu(), [p.detach().cpu().clone() for p in model.parameters()]))
        results[device] = seq
    for s in range(len(xs)):
        out[f"unused-loss-{s}"] = (results["neuron"][s][0], results["cpu"][s][0])
        out[f"unused-params-{s}"] = (results["neuron"][s][1], results["cpu"][s][1])
    # The future of an allreduce (DDP's comm hooks) carries the reduced tensors.
    t = torch.full((4,), float(rank + 1), device="neuron")
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 10)
    out["future-then"] = (fut.wait().cpu(), torch.full((4,), 30.0))
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    main()
