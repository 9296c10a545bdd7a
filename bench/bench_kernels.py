"""The kernel library's fused RMSNorm vs the eager composition; same run.

    python bench/bench_kernels.py            (make bench-kernels runs this)

For each shape, times forward + backward of RMSNorm over the last dimension
three ways: torchneuron.kernels.rms_norm on neuron (one pass per row each
way), F.rms_norm on neuron (ATen's composition, op by op on the device) and
F.rms_norm on CPU (PyTorch's CPU eager, the reference), as the median of
--repeats timed runs after warm-up, each ended by a synchronize (device) so
that queued work is counted. Devices alternate between repeats so all see the
same machine load; the load average is printed.
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from torchneuron.kernels import rms_norm


def _step(fn, x, w, grad, sync):
    x.grad = w.grad = None
    out = fn(x, w)
    out.backward(grad)
    sync()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--shapes", default="2048x1024,8192x1024,4096x4096")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, torch threads {torch.get_num_threads()}")
    print(f"{'shape':>12} {'fused neuron':>13} {'eager neuron':>13} {'CPU eager':>10} "
          f"{'fused/CPU':>10} {'fused/eager':>12}")
    for shape in args.shapes.split(","):
        rows, cols = map(int, shape.split("x"))
        g = torch.Generator().manual_seed(0)
        x = torch.randn(rows, cols, generator=g)
        w = torch.randn(cols, generator=g)
        grad = torch.randn(rows, cols, generator=g)
        cases = {}
        for name, device, fn in (
            ("fused", "neuron", lambda x, w: rms_norm(x, w, 1e-6)),
            ("eager", "neuron", lambda x, w: F.rms_norm(x, (cols,), w, 1e-6)),
            ("cpu", "cpu", lambda x, w: F.rms_norm(x, (cols,), w, 1e-6)),
        ):
            sync = torch.neuron.synchronize if device == "neuron" else (lambda: None)
            xd = x.to(device).requires_grad_()
            wd = w.to(device).requires_grad_()
            cases[name] = (fn, xd, wd, grad.to(device), sync, [])
            for _ in range(3):
                _step(fn, xd, wd, grad.to(device) if device == "cpu" else cases[name][3], sync)
        for _ in range(args.repeats):
            for name, (fn, xd, wd, gd, sync, times) in cases.items():
                start = time.perf_counter()
                _step(fn, xd, wd, gd, sync)
                times.append(time.perf_counter() - start)
        med = {name: statistics.median(c[5]) for name, c in cases.items()}
        print(f"{shape:>12} {med['fused'] * 1e3:>11.2f}ms {med['eager'] * 1e3:>11.2f}ms "
              f"{med['cpu'] * 1e3:>8.2f}ms {med['cpu'] / med['fused']:>9.2f}x "
              f"{med['eager'] / med['fused']:>11.2f}x")


if __name__ == "__main__":
    main()
