"""Which kernels of real training steps compute other bits with another
thread count, and what running the others on one thread would cost.

    python bench/bench_thread_invariance.py                 (gpt, resnet18, llama)
    python bench/bench_thread_invariance.py --models llama --threads 2

Why: on a 2-core machine the device's compute threads share the cores with
the host thread that issues the work, and an OpenMP team's threads spin
between parallel regions. The tiny Llama's step ran 1.42x CPU eager with
NEURON_RT_COMPUTE_THREADS=1 against 0.99x with the default 2 (median of 5
processes each, bench_train_step.py --processes 5; bitwise equal to CPU
eager's 2-thread step in all), while the demo GPT and resnet18 computed
other bits on one thread (and ran slower). A device may run a kernel on
fewer threads than CPU eager only where the kernel's result does not depend
on its thread count. This bench measures that, call by call, on CPU:

1. Record one training step (forward, backward, PyTorch's default AdamW)
   of each model on CPU, every distinct ATen call with a copy of its
   arguments (bench_kernel_parity.py's recorder).
2. Replay each call on fresh copies with --threads threads and with one,
   the RNG seeded alike, and compare every output and every argument the
   call wrote, bit for bit (NaNs by their bits).
3. Time each call both ways (best of a few samples of back-to-back calls).

It prints the calls whose bits depend on the thread count (op, shapes,
calls per step, time), and per model the share of the step's kernel time
in calls that do not, with what those calls cost on one thread against
--threads. A call may match by chance on its recorded values (zeros);
a difference is always real.
"""
import argparse
import contextlib
import os
import sys
import time

import torch
from torch.utils._pytree import tree_flatten, tree_map

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernel_parity import copy_on, record_step, shapes  # noqa: E402


def fresh(args, kwargs):
    return tree_map(lambda x: copy_on(x, "cpu") if isinstance(x, torch.Tensor) else x,
                    (args, kwargs))


def bits(t):
    """A tensor's bytes: equal bits compare equal, NaNs included."""
    t = t.detach().contiguous().view(-1)
    return t if t.dtype == torch.bool else t.view(torch.uint8)


@contextlib.contextmanager
def torch_threads(n):
    """torch's intra-op thread count set to n inside the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_with(func, args, kwargs, threads):
    """The call's result and its arguments after it, on `threads` threads."""
    with torch_threads(threads):
        a, k = fresh(args, kwargs)
        torch.manual_seed(0)
        out = func(*a, **k)
    return [x for x in tree_flatten((out, a, k))[0] if isinstance(x, torch.Tensor)]


def same(xs, ys):
    return len(xs) == len(ys) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(bits(x), bits(y))
        for x, y in zip(xs, ys))


def call_us(func, args, kwargs, threads, repeats=3):
    """Best of `repeats` samples of back-to-back calls (about 2 ms each)."""
    with torch_threads(threads):
        a, k = fresh(args, kwargs)
        func(*a, **k)
        start = time.perf_counter()
        func(*a, **k)
        once = max(time.perf_counter() - start, 1e-6)
        n = max(3, min(200, int(2e-3 / once)))
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(n):
                func(*a, **k)
            best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def study(name, threads):
    calls, _ = record_step(name)
    rows = []
    for sig, (count, func, args, kwargs) in calls.items():
        try:
            ok = same(run_with(func, args, kwargs, threads), run_with(func, args, kwargs, 1))
        except Exception as e:  # noqa: BLE001: a call that cannot be replayed is listed
            rows.append((sig, count, None, 0.0, 0.0, f"{type(e).__name__}"))
            continue
        many = call_us(func, args, kwargs, threads)
        one = call_us(func, args, kwargs, 1)
        rows.append((sig, count, ok, many * count, one * count, ""))
    return rows


def report(name, rows, threads):
    replayed = [r for r in rows if r[2] is not None]
    variant = sorted((r for r in replayed if not r[2]), key=lambda r: -r[3])
    total = sum(r[3] for r in replayed)
    inv_many = sum(r[3] for r in replayed if r[2])
    inv_one = sum(r[4] for r in replayed if r[2])
    print(f"\n{name}: {len(replayed)} distinct calls replayed, {len(variant)} compute other bits "
          f"on 1 thread than on {threads}")
    for sig, count, _, many, one, _ in variant:
        print(f"  {sig[0]:45s} x{count:<3d} {many:9.1f} us per step on {threads} threads, "
              f"{one:9.1f} on 1   {shapes(sig)}")
    print(f"  kernel time per step on {threads} threads: {total / 1e3:.2f} ms, of which calls "
          f"with the same bits on 1 thread {inv_many / 1e3:.2f} ms "
          f"({100 * inv_many / max(total, 1e-9):.0f}%); those calls on 1 thread: "
          f"{inv_one / 1e3:.2f} ms")
    failed = [r for r in rows if r[2] is None]
    if failed:
        print(f"  not replayed: {', '.join(sorted({r[0][0] + ' (' + r[5] + ')' for r in failed}))}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="gpt,resnet18,llama")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(),
                   help="the thread count compared with one (default: torch's)")
    args = p.parse_args()
    if args.threads < 2:
        sys.exit("needs --threads >= 2 (and a machine where torch uses them)")
    print(f"CPU kernels, {args.threads} threads against 1; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for name in args.models.split(","):
        report(name, study(name, args.threads), args.threads)


if __name__ == "__main__":
    main()
