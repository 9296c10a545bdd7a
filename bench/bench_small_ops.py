"""Host cost per small op on `neuron` vs PyTorch CPU, measured in the same run.

    python bench/bench_small_ops.py            (make bench-py runs this)

For each op, a loop issues N iterations on tiny tensors (64 elements; the
linear: 8x16 input, 16->8 weights) and ends with one synchronisation; the
figure is microseconds per op on the calling thread. Devices alternate
between repeats (cpu, neuron, cpu, ...) so both see the same machine load;
each repeat's pair gives a ratio, and the table shows the medians and the
range of the per-pair ratios. Target (eager speed issue): neuron / cpu <= 1.0
for each op. Rows marked * are ops of the generic path (AsyncPath.cpp), shown
for what most ops without a direct path cost the host.

A second table splits the neuron figure into its two sides: the host's
issue time per op (the loop queued behind a kernel that sleeps, so the device
runs none of it meanwhile) and the device's time per op (how long the queued
ops take once the sleep ends). The live loop costs at least the larger of
the two; where the device's side is the larger, the ratio above measures the
worker, not the host.

After the tables, the same loop times the device's `sum` with its row sums
(csrc/aten/RowSum.h: ATen's summation order in a loop of the device's own)
and with ATen's kernel behind a TensorIterator built per call
(torchneuron._C._set_row_sums_enabled(False)), alternating in one process:
the A/B of what the row sums give a small reduction.
"""
import argparse
import os
import statistics
import time

import torch

import torchneuron


def timed(fn, device, iters):
    sync = torch.neuron.synchronize if device.startswith("neuron") else (lambda: None)
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters * 1e6


def cases(device):
    a = torch.randn(64, device=device)
    b = torch.randn(64, device=device)
    m = torch.randn(8, 8, device=device)
    x = torch.randn(8, 16, device=device)
    w = torch.randn(8, 16, device=device)
    bias = torch.randn(8, device=device)
    mask = a > 0
    z = torch.empty(64, device=device)
    return {
        "add": lambda: torch.add(a, b),
        "mul_": lambda: a.mul_(1.0),
        "relu": lambda: torch.relu(a),
        "sum": lambda: a.sum(),
        "mm 8x8": lambda: torch.mm(m, m),
        "linear": lambda: torch.nn.functional.linear(x, w, bias),
        # Direct paths outside the target list (Unary.cpp, Fill.cpp).
        "exp": lambda: torch.exp(a),
        "zero_": lambda: z.zero_(),
        # Ops of the generic path (no direct path of their own): what most
        # other ops cost the host. Not in the target list.
        "sinh*": lambda: torch.sinh(a),
        "where*": lambda: torch.where(mask, a, b),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--split-iters", type=int, default=4000,
                   help="calls per sample of the host / device split (below the queue depth)")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    ops = {d: cases(d) for d in ("cpu", "neuron")}
    print(f"{'op':<10} {'cpu us':>9} {'neuron us':>10} {'ratio':>7}  {'per-pair range':>15}")
    for name in ops["cpu"]:
        runs = {"cpu": [], "neuron": []}
        for _ in range(args.repeats):
            for device in ("cpu", "neuron"):
                runs[device].append(timed(ops[device][name], device, args.iters))
        ratios = sorted(n / c for c, n in zip(runs["cpu"], runs["neuron"]))
        c, n = statistics.median(runs["cpu"]), statistics.median(runs["neuron"])
        print(f"{name:<10} {c:9.2f} {n:10.2f} {statistics.median(ratios):7.2f}  "
              f"{ratios[0]:7.2f}-{ratios[-1]:.2f}")
    print(f"\n{'op':<10} {'host us':>9} {'device us':>10}  (neuron, each side alone; "
          f"medians of {args.repeats})")
    for name, fn in ops["neuron"].items():
        host, device = zip(*(split(fn, args.split_iters) for _ in range(args.repeats)))
        print(f"{name:<10} {statistics.median(host):9.2f} {statistics.median(device):10.2f}")
    row_sums_ab(ops["neuron"]["sum"], args)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def split(fn, iters):
    """(host, device) microseconds per op: `iters` calls issued behind a
    kernel that sleeps long enough for the host to queue them all, the
    host's issue time and the device's time after the sleep, per call."""
    hold_s = max(0.02, iters * 10e-6)  # 10 us per call: above any op's host cost here
    fn()
    torch.neuron.synchronize()
    torch.neuron._sleep(int(hold_s * 1e6))
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    issued = time.perf_counter() - start
    torch.neuron.synchronize()
    total = time.perf_counter() - start
    assert issued < hold_s, f"issuing took {issued:.3f} s, longer than the {hold_s} s hold"
    return issued / iters * 1e6, (total - hold_s) / iters * 1e6


def row_sums_ab(neuron_sum, args):
    runs = {True: [], False: []}
    try:
        for _ in range(args.repeats):
            for on in (True, False):
                torchneuron._C._set_row_sums_enabled(on)
                runs[on].append(timed(neuron_sum, "neuron", args.iters))
    finally:
        torchneuron._C._set_row_sums_enabled(True)
    on, off = (f"{min(runs[k]):.2f}-{max(runs[k]):.2f}" for k in (True, False))
    print(f"sum on neuron, same process, {args.repeats} alternations: row sums {on} us, "
          f"ATen's kernel {off} us")


if __name__ == "__main__":
    main()
