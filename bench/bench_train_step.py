"""Training step time of the demo model on `neuron` vs PyTorch CPU, same run.

    python bench/bench_train_step.py           (make bench-py runs this)

Times forward + backward + AdamW step of examples/train_gpt.py's GPT at the
demo's size, after warm-up, alternating devices between repeats so both see
the same machine load. Target (backend issue): neuron / cpu <= 1.05.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from train_gpt import GPT, batches, load_corpus  # noqa: E402


def step_time(device, data, vocab, args):
    torch.manual_seed(0)
    model = GPT(vocab, args.block).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # same kernel on both
    sync = torch.neuron.synchronize if device.startswith("neuron") else (lambda: None)
    batch_list = [(x.to(device), y.to(device))
                  for x, y in batches(data, args.warmup + args.steps, args.batch, args.block, 0)]
    times = []
    for i, (x, y) in enumerate(batch_list):
        start = time.perf_counter()
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=64)
    args = p.parse_args()
    data, chars = load_corpus()
    res = {"cpu": [], "neuron": []}
    for _ in range(args.repeats):
        for device in ("cpu", "neuron"):
            res[device].append(step_time(device, data, len(chars), args))
    c, n = statistics.median(res["cpu"]), statistics.median(res["neuron"])
    print(f"train step (median of {args.repeats}x{args.steps} steps): cpu {c:.2f} ms  "
          f"neuron {n:.2f} ms  ratio {n / c:.2f}")


if __name__ == "__main__":
    main()
