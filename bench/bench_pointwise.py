"""Pointwise chains on `neuron` vs PyTorch CPU eager, and the memory bandwidth they reach.

    python bench/bench_pointwise.py                  (make bench-pointwise runs this)
    python bench/bench_pointwise.py --sizes 1M       (one size)

The eager-speed issue's third target: chains of pointwise ops on 1-16 M
elements (a decomposed GELU-tanh, a decomposed LayerNorm over rows of 1024, an
AdamW step over many parameters with PyTorch's default AdamW) at >= 2x CPU
eager, and the fraction of this machine's memory bandwidth they reach. The
bandwidth reference is a STREAM-style triad (a = b + s * c, float32, 3 x 4
bytes per element) on CPU, best of the repeats. A chain's bandwidth counts
each op's reads and writes once (what unfused execution must move); a fused
pass moves less and could show above 1.0 of the triad.

Every chain runs on both devices from the same inputs; results are compared
bitwise (a chain that differs is reported, never timed silently). Devices
alternate between repeats so both see the same machine load; the load
average is printed. "unfused" is neuron with adaptive eager fusion off
(torchneuron.set_fusion_enabled(False)), timed in the same alternation: the
A/B of what fusion gives (for AdamW it also keeps the foreach lists on one
thread). For AdamW, "no list loops" is neuron fused but with list passes
calling each op's CPU kernel instead of computing mul/div/add/lerp/addcmul/
addcdiv in loops of their own (csrc/aten/ListLoop.h), in the same alternation.
For LayerNorm, "no row ops" is neuron fused but with its means on ATen's sum
kernel, outside fusion passes (torchneuron._C._set_row_sums_enabled(False)):
the A/B of the row sums and of the pass they make with x - mean and its
square (csrc/aten/RowSum.h, Fusion.h).

Each chain's line also gives the process's minor page faults per call on CPU
and on neuron. CPU eager's fresh 4 MB+ tensors come from glibc's malloc,
which maps blocks of that size fresh (or grows its heap again after trimming
it), so every op of a CPU chain may pay first-touch page faults; whether it
does depends on the heap's history, which is why CPU eager's 1M chains run
2-3x apart in processes minutes apart. The device's caching allocator reuses
its memory. To compare with CPU eager without them (a caching host malloc),
rerun with glibc's trimming threshold raised and its mmap threshold at its
largest (32 MiB; larger blocks, as at 16M, are always mapped fresh):

    MALLOC_TRIM_THRESHOLD_=1000000000 MALLOC_MMAP_THRESHOLD_=33554432 \
        python bench/bench_pointwise.py
"""
import argparse
import math
import os
import statistics
import time

import torch

import torchneuron

from host_malloc import malloc_settings, minor_faults


def gelu_tanh(x):
    # GELU's tanh approximation, written out as a model would (9 ops).
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def layer_norm_rows(x):
    # LayerNorm over the last dim (1024), decomposed (no affine).
    mean = x.mean(-1, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keepdim=True)
    return centered * torch.rsqrt(var + 1e-5)


CHAINS = {
    # name: (function, bytes an unfused run moves per element: each op's
    # element reads and writes, a tensor read twice by one op counted once)
    "gelu_tanh": (gelu_tanh, 4 * (13 + 9)),  # 9 ops
    "layer_norm": (layer_norm_rows, 4 * (5 + 3)),  # per-row statistics not counted
}


def parse_size(s):
    return int(float(s[:-1]) * (1 << 20)) if s.endswith("M") else int(s)


def sync(device):
    if device != "cpu":
        torch.neuron.synchronize()


def timed(fn, device, iters):
    # "unfused": neuron with adaptive eager fusion off, the A/B of what it gives;
    # "no loops": fused, but list passes call every op's CPU kernel (no list
    # loops), the A/B of what those give an optimizer step.
    # "no row ops": fused, but sum and mean run ATen's kernel outside passes.
    torchneuron.set_fusion_enabled(device != "unfused")
    torchneuron._C._set_list_loops_enabled(device != "no loops")
    torchneuron._C._set_row_sums_enabled(device != "no rows")
    try:
        fn()
        sync(device)
        faults = minor_faults()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        elapsed = time.perf_counter() - start
        FAULTS.setdefault(device, []).append((minor_faults() - faults) / iters)
        return elapsed / iters
    finally:
        torchneuron.set_fusion_enabled(True)
        torchneuron._C._set_list_loops_enabled(True)
        torchneuron._C._set_row_sums_enabled(True)


# Minor page faults per call, per device, since the last report (timed).
FAULTS = {}


def report(name, res, gbs, triad, same):
    c, d, u = (statistics.median(res[k]) for k in ("cpu", "neuron", "unfused"))
    loops = f", no list loops {c / statistics.median(res['no loops']):.2f}x" if "no loops" in res else ""
    if "no rows" in res:
        loops += f", no row ops {c / statistics.median(res['no rows']):.2f}x"
    print(f"  {name:<11} cpu {c * 1e3:7.2f} ms  neuron {d * 1e3:7.2f} ms  "
          f"speed neuron / cpu {c / d:.2f}x (target >= 2; unfused {c / u:.2f}x{loops})  bandwidth cpu "
          f"{gbs(c):.1f} GB/s ({gbs(c) / triad:.2f} of triad), neuron {gbs(d):.1f} GB/s "
          f"({gbs(d) / triad:.2f})  bitwise equal: {same}; minor page faults per call: cpu "
          f"{statistics.median(FAULTS.get('cpu', [0])):.0f}, neuron "
          f"{statistics.median(FAULTS.get('neuron', [0])):.0f}")
    FAULTS.clear()


def triad_gbs(n, repeats):
    b, c = torch.rand(n), torch.rand(n)
    a = torch.empty(n)
    best = min(timed(lambda: torch.add(b, c, alpha=3.0, out=a), "cpu", 10) for _ in range(repeats))
    return 3 * 4 * n / best / 1e9


def adamw_setup(device, n, tensors):
    torch.manual_seed(0)
    sizes = [n // tensors] * tensors
    # Made on CPU and moved: both devices start from the same values.
    params = [torch.nn.Parameter(torch.randn(s).to(device)) for s in sizes]
    for p in params:
        p.grad = torch.randn(p.shape).to(device)
    opt = torch.optim.AdamW(params, lr=1e-3)  # PyTorch's default: foreach on neuron
    return params, opt


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1M,16M")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--chains", default="gelu_tanh,layer_norm,adamw",
                   help="which of gelu_tanh, layer_norm, adamw to run")
    args = p.parse_args()
    chosen = set(args.chains.split(","))
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
          f"torch threads {torch.get_num_threads()}; host malloc: {malloc_settings()}")
    for size in args.sizes.split(","):
        n = parse_size(size)
        triad = triad_gbs(n, args.repeats)
        FAULTS.clear()  # the triad's own
        print(f"{size}: STREAM-style triad on CPU {triad:.1f} GB/s")
        x_cpu = torch.randn(n // 1024, 1024, generator=torch.Generator().manual_seed(0))
        x_dev = x_cpu.to("neuron")
        for name, (fn, bytes_per_elem) in CHAINS.items():
            if name not in chosen:
                continue
            same = torch.equal(fn(x_cpu), fn(x_dev).cpu())
            devices = [("cpu", x_cpu), ("neuron", x_dev), ("unfused", x_dev)]
            if name == "layer_norm":
                devices.append(("no rows", x_dev))
            res = {device: [] for device, _ in devices}
            for _ in range(args.repeats):
                for device, x in devices:
                    res[device].append(timed(lambda: fn(x), device, args.iters))
            report(name, res, lambda t: bytes_per_elem * n / t / 1e9, triad, same)  # noqa: B023
        if "adamw" not in chosen:
            continue
        # AdamW (default, 64 tensors): per element the unfused foreach step
        # makes 12 reads and 8 writes of float32 values (8 ops).
        setups = {d: adamw_setup("cpu" if d == "cpu" else "neuron", n, 64)
                  for d in ("cpu", "neuron", "unfused", "no loops")}
        res = {d: [] for d in setups}
        for _ in range(args.repeats):
            for device, (_, opt) in setups.items():
                res[device].append(timed(opt.step, device, args.iters))
        same = all(all(torch.equal(a.detach(), other.detach().cpu()) for other in others)
                   for a, *others in zip(*(params for params, _ in setups.values())))
        report("adamw", res, lambda t: 20 * 4 * n / t / 1e9, triad, same)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
