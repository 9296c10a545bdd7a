"""The soak of the reliability suite: a small MLP trained with AdamW for a few
hundred steps on `neuron`. What must hold:
- memory_allocated() is flat once training is in its steady state (no tensor
  leaks per step) and returns exactly to its baseline when the model, the
  optimizer and every tensor are gone;
- memory_reserved() stays bounded (no growth after the warm-up: the caching
  allocator reuses its blocks) and, after empty_cache(), is no more than
  before the soak;
- the process's resident memory does not keep growing (host-side leaks);
- the loss stays finite and goes down.
run() returns the figures and a list of problems (empty: clean).
"""
from __future__ import annotations

import gc
import os

STEPS = 300
WARMUP = 20          # steps before the steady state (optimizer state created, caches filled)
RSS_GROWTH_MAX = 64 << 20


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _mib(n):
    return f"{n / 2**20:.1f} MiB"


def run(steps=STEPS):
    import torch
    dev = torch.device("neuron")
    problems = []
    torch.neuron.synchronize()
    gc.collect()
    torch.neuron.empty_cache()
    base_alloc = torch.neuron.memory_allocated()
    base_reserved = torch.neuron.memory_reserved()
    rss_start = _rss()

    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(),
        torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    data = torch.randn(8, 32, 64, generator=g).to(dev)
    target = torch.randint(0, 10, (8, 32), generator=g).to(dev)
    allocs, reserved, losses = [], [], []
    rss_steady = None
    for step in range(steps):
        i = step % data.shape[0]
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(data[i]), target[i])
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == steps - 1:
            losses.append(loss.item())  # a sync point, as a training log would be
            allocs.append(torch.neuron.memory_allocated())
            reserved.append(torch.neuron.memory_reserved())
        if step == WARMUP:
            rss_steady = _rss()
    torch.neuron.synchronize()
    rss_end_training = _rss()
    steady_alloc = allocs[WARMUP // 10 + 1:]
    steady_res = reserved[WARMUP // 10 + 1:]
    if max(steady_alloc) > min(steady_alloc):
        problems.append(f"memory_allocated grows in the steady state: {min(steady_alloc)} -> "
                        f"{max(steady_alloc)} bytes")
    if max(steady_res) > steady_res[0]:
        problems.append(f"memory_reserved grows in the steady state: {steady_res[0]} -> "
                        f"{max(steady_res)} bytes")
    if not all(x == x and abs(x) != float("inf") for x in losses):
        problems.append(f"non-finite loss: {losses}")
    elif not losses[-1] < losses[0]:
        problems.append(f"loss did not go down: {losses[0]} -> {losses[-1]}")
    if rss_end_training - rss_steady > RSS_GROWTH_MAX:
        problems.append(f"RSS grew {_mib(rss_end_training - rss_steady)} in the steady state")

    del model, opt, data, target, loss
    gc.collect()
    torch.neuron.synchronize()
    after_alloc = torch.neuron.memory_allocated()
    if after_alloc != base_alloc:
        problems.append(f"memory_allocated {after_alloc} after freeing everything, baseline "
                        f"{base_alloc}")
    torch.neuron.empty_cache()
    after_reserved = torch.neuron.memory_reserved()
    if after_reserved > base_reserved:
        problems.append(f"memory_reserved {after_reserved} after empty_cache, before the soak "
                        f"{base_reserved}")
    return {
        "steps": steps,
        "allocated baseline": base_alloc,
        "allocated steady": max(steady_alloc),
        "reserved steady": max(steady_res),
        "reserved/allocated": round(max(steady_res) / max(steady_alloc), 2),
        "allocated after free": after_alloc,
        "reserved after empty_cache": after_reserved,
        "loss first/last": f"{losses[0]:.4f}/{losses[-1]:.4f}",
        "RSS start": _mib(rss_start),
        "RSS steady": _mib(rss_steady),
        "RSS end": _mib(_rss()),
        "problems": problems,
    }


if __name__ == "__main__":
    import torch  # noqa: F401
    import torchneuron  # noqa: F401
    r = run()
    for k, v in r.items():
        print(f"{k}: {v}")
