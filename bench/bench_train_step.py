"""Training step time of the demo model on `neuron` vs PyTorch CPU, same run.

    python bench/bench_train_step.py           (make bench-py runs this)
    python bench/bench_train_step.py --models resnet18,llama   (and those two)

Times forward + backward + optimizer step + LR schedule step of
examples/train_gpt.py's GPT at the demo's size, with the demo's optimizer:
PyTorch's default AdamW (foreach on neuron, as on CUDA; --fused for the fused
kernel) and a warm-up + cosine LambdaLR schedule, after warm-up steps,
alternating devices between repeats so both see the same machine load.
Target (backend issue): neuron / cpu <= 1.05. The machine's load average is
printed with the result.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_gpt import GPT, batches, load_corpus, make_optimizer  # noqa: E402


def train(device, opt, sched, loss_at, steps, warmup):
    """Runs `steps` training steps (loss_at(i): step i's loss); returns the
    median time (ms) of the steps after `warmup` and every step's loss."""
    sync = torch.neuron.synchronize if device.startswith("neuron") else (lambda: None)
    times, losses = [], []
    for i in range(steps):
        start = time.perf_counter()
        loss = loss_at(i)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - start)
        losses.append(loss.detach())
    return statistics.median(times) * 1e3, losses


def step_time(device, data, vocab, args):
    torch.manual_seed(0)
    model = GPT(vocab, args.block).to(device)
    opt, sched = make_optimizer(model, 1e-3, args.warmup + args.steps, fused=args.fused)
    batch_list = [(x.to(device), y.to(device))
                  for x, y in batches(data, args.warmup + args.steps, args.batch, args.block, 0)]
    ms, _ = train(device, opt, sched, lambda i: model(*batch_list[i])[1],
                  args.warmup + args.steps, args.warmup)
    return ms


def model_step_time(name, device, args):
    """Median step time (ms), the losses and the final parameters of one of
    bench_compile's models (resnet18 at 32x32, a tiny HF Llama) trained
    eagerly on `device` with PyTorch's default AdamW and a warm-up LambdaLR."""
    from bench_compile import MODELS
    torch.manual_seed(0)
    model, batch, loss_fn = MODELS[name]()
    model = model.to(device)
    batch = tuple(t.to(device) for t in batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    ms, losses = train(device, opt, sched, lambda i: loss_fn(model, batch),
                       args.warmup + args.steps, args.warmup)
    params = [p.detach().cpu() for p in model.parameters()]
    return ms, [l.item() for l in losses], params


def compare_models(args):
    for name in args.models.split(","):
        res, runs = {"cpu": [], "neuron": []}, {}
        for _ in range(args.repeats):
            for device in ("cpu", "neuron"):
                ms, losses, params = model_step_time(name, device, args)
                res[device].append(ms)
                runs[device] = (losses, params)
        same = runs["cpu"][0] == runs["neuron"][0] and all(
            torch.equal(a, b) for a, b in zip(runs["cpu"][1], runs["neuron"][1]))
        c, n = statistics.median(res["cpu"]), statistics.median(res["neuron"])
        print(f"{name} train step, default AdamW + LambdaLR (median of {args.repeats}x{args.steps}"
              f" steps): cpu {c:.2f} ms  neuron {n:.2f} ms  throughput neuron / cpu {c / n:.2f}x"
              f"  losses and parameters bitwise equal: {same}  "
              f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="",
                   help="also time these bench_compile models eagerly: resnet18,llama")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--fused", action="store_true", default=None)
    args = p.parse_args()
    data, chars = load_corpus()
    res = {"cpu": [], "neuron": []}
    for _ in range(args.repeats):
        for device in ("cpu", "neuron"):
            res[device].append(step_time(device, data, len(chars), args))
    c, n = statistics.median(res["cpu"]), statistics.median(res["neuron"])
    opt = "fused AdamW" if args.fused else "default (foreach) AdamW"
    print(f"train step, {opt} + LambdaLR (median of {args.repeats}x{args.steps} steps): "
          f"cpu {c:.2f} ms  neuron {n:.2f} ms  ratio {n / c:.2f}  "
          f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    if args.models:
        compare_models(args)


if __name__ == "__main__":
    main()
