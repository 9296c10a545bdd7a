"""Host cost per small op on `neuron` vs PyTorch CPU, measured in the same run.

    python bench/bench_small_ops.py            (make bench-py runs this)

For each op, a loop issues N iterations on tiny tensors (64 elements; the
linear: 8x16 input, 16->8 weights) and ends with one synchronisation; the
figure is microseconds per op on the calling thread. Target (eager speed
issue): neuron / cpu <= 1.0 for each op.
"""
import argparse
import statistics
import time

import torch


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
    return {
        "add": lambda: torch.add(a, b),
        "mul_": lambda: a.mul_(1.0),
        "relu": lambda: torch.relu(a),
        "sum": lambda: a.sum(),
        "mm 8x8": lambda: torch.mm(m, m),
        "linear": lambda: torch.nn.functional.linear(x, w, bias),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    results = {}
    for device in ("cpu", "neuron"):
        for name, fn in cases(device).items():
            runs = [timed(fn, device, args.iters) for _ in range(args.repeats)]
            results[(device, name)] = statistics.median(runs)
    print(f"{'op':<10} {'cpu us':>9} {'neuron us':>10} {'ratio':>7}")
    for name in cases("cpu"):
        c, n = results[("cpu", name)], results[("neuron", name)]
        print(f"{name:<10} {c:9.2f} {n:10.2f} {n / c:7.2f}")


if __name__ == "__main__":
    main()
