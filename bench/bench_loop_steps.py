"""Device time of add/sub/mul/div as loop steps vs ATen's kernel, same process.

    python bench/bench_loop_steps.py

Flat float32 ops (a tensor or a device 0-dim second operand) and broadcast
ones (a value per row, a column operand) are queued as steps of the list
loops (csrc/aten/LoopStep.h) instead of ATen's kernel behind a
TensorIterator. Each case is queued N deep behind a sleeping kernel, so the
host's dispatch is not counted: (time to synchronize - the sleep) / N is the
device's time per op. Loops on and off (torchneuron._C._set_list_loops_enabled)
alternate between repeats; the table shows medians. Results are compared
with CPU bit for bit first.
"""
import os
import statistics
import time

import torch

import torchneuron

SLEEP_US = 100_000


def device_us(fn, n):
    fn()
    torch.neuron.synchronize()
    torch.neuron._sleep(SLEEP_US)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    torch.neuron.synchronize()
    return ((time.perf_counter() - start) - SLEEP_US / 1e6) / n * 1e6


def cases():
    for rows, cols in ((1, 64), (1, 2048), (64, 64), (256, 128), (2048, 128), (1024, 1024)):
        x = torch.randn(rows, cols)
        r, w, s = torch.randn(rows, 1), torch.randn(cols), torch.tensor(1.5)
        yield f"{rows * cols:>8} x * s (device 0-dim)", lambda x, r, w, s: x * s, (x, r, w, s)
        if rows > 1:
            yield f"{rows * cols:>8} x * r (value per row)", lambda x, r, w, s: x * r, (x, r, w, s)
            yield f"{rows * cols:>8} w * x (column, first)", lambda x, r, w, s: w * x, (x, r, w, s)
            yield f"{rows * cols:>8} x - r (value per row)", lambda x, r, w, s: x - r, (x, r, w, s)


def main(repeats=5, n=400):
    print(f"load average {os.getloadavg()[0]:.2f}, torch threads {torch.get_num_threads()}")
    print(f"{'case':40s} {'loop us':>8s} {'ATen us':>8s} {'ratio':>6s}")
    for name, fn, args in cases():
        dev = [a.to("neuron") for a in args]
        ref = fn(*args)
        assert torch.equal(fn(*dev).cpu().view(torch.int32), ref.view(torch.int32)), name
        res = {True: [], False: []}
        try:
            for _ in range(repeats):
                for on in (True, False):
                    torchneuron._C._set_list_loops_enabled(on)
                    res[on].append(device_us(lambda: fn(*dev), n))
        finally:
            torchneuron._C._set_list_loops_enabled(True)
        loop, aten = statistics.median(res[True]), statistics.median(res[False])
        print(f"{name:40s} {loop:8.2f} {aten:8.2f} {aten / loop:5.2f}x")


if __name__ == "__main__":
    main()
