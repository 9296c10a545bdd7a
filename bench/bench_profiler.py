"""Profiler overhead on the demo model's training step, same run.

    python bench/bench_profiler.py [--steps 10 --repeats 5]

Times one training step of examples/train_gpt.py's GPT on `neuron` (forward,
backward, the demo's optimizer: default AdamW (foreach) with its warm-up +
cosine LambdaLR schedule, then a device synchronize) three ways, interleaved
repeat by repeat so all three see the same machine load:
  plain         no profiler
  cpu           torch.profiler with ProfilerActivity.CPU only
  cpu+neuron    ... and ProfilerActivity.PrivateUse1 (the device timeline)
and prints the median step time of each and the ratios: cpu+neuron / plain
is what profiling costs a user; cpu+neuron / cpu is the device timeline's own
share. Both wall time and the process's CPU time (host and executor threads)
are reported: on a loaded machine wall time mostly measures the load, CPU
time what the profiler adds. Trace processing after the run (profile exit) is
timed apart. The load average is printed before and after.
"""
import argparse
import os
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from train_gpt import GPT, batches, load_corpus, make_optimizer  # noqa: E402

MODES = {
    "plain": None,
    "cpu": [ProfilerActivity.CPU],
    "cpu+neuron": [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
}


def make_run(data, vocab, args):
    torch.manual_seed(0)
    model = GPT(vocab, args.block).to("neuron")
    # The demo's own: default AdamW (foreach) and its warm-up + cosine LambdaLR.
    opt, sched = make_optimizer(model, 1e-3, 10_000)
    batch_list = [(x.to("neuron"), y.to("neuron"))
                  for x, y in batches(data, args.steps, args.batch, args.block, 0)]

    def step(x, y):
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        torch.neuron.synchronize()

    return step, batch_list


def timed_steps(step, batch_list):
    """Wall time and process CPU time (all threads: host and executor) per step."""
    times = []
    for x, y in batch_list:
        start, cpu = time.perf_counter(), time.process_time()
        step(x, y)
        times.append((time.perf_counter() - start, time.process_time() - cpu))
    return times


def run_mode(mode, step, batch_list):
    activities = MODES[mode]
    if activities is None:
        return timed_steps(step, batch_list), 0.0
    prof = profile(activities=activities)
    prof.__enter__()
    times = timed_steps(step, batch_list)
    start = time.perf_counter()
    prof.__exit__(None, None, None)
    return times, time.perf_counter() - start


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=64)
    args = p.parse_args()
    data, chars = load_corpus()
    step, batch_list = make_run(data, len(chars), args)
    for x, y in batch_list[:3]:  # warm-up: first calls of each op kind run inline
        step(x, y)
    load_before = os.getloadavg()
    times = {m: [] for m in MODES}
    exit_s = {m: [] for m in MODES}
    for _ in range(args.repeats):
        for mode in MODES:
            t, e = run_mode(mode, step, batch_list)
            times[mode].extend(t)
            exit_s[mode].append(e)
    load_after = os.getloadavg()
    print(f"GPT train step on neuron, {args.repeats}x{args.steps} steps each, median "
          "(wall time; CPU time of all threads, which machine load disturbs less):")
    wall = {m: statistics.median(w for w, _ in t) * 1e3 for m, t in times.items()}
    cpu = {m: statistics.median(c for _, c in t) * 1e3 for m, t in times.items()}
    for m in MODES:
        extra = f"   (trace processing at exit {statistics.median(exit_s[m]):.2f} s)" \
            if MODES[m] else ""
        print(f"  {m:<11} wall {wall[m]:8.2f} ms   cpu {cpu[m]:8.2f} ms{extra}")
    for label, t in (("wall", wall), ("cpu", cpu)):
        print(f"profiler overhead ({label}): cpu+neuron / plain = "
              f"{t['cpu+neuron'] / t['plain']:.3f}   cpu+neuron / cpu = "
              f"{t['cpu+neuron'] / t['cpu']:.3f}   cpu / plain = {t['cpu'] / t['plain']:.3f}")
    print(f"machine: {os.cpu_count()} cores, load average (1 min) {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after")


if __name__ == "__main__":
    main()
