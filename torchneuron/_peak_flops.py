"""The peak matmul throughput of a software NeuronCore, measured on the device.

MFU (model FLOPS utilisation) needs the device's peak FLOPS. A Trainium core
has a datasheet figure; a software core's peak is what its host cores reach,
which depends on the CPU model, its vector units (AVX-512 is one or two
FMA pipes per core, full or half width) and the compute threads the core is
given — so it is measured, not derived: square matmuls queued on the device,
timed from the host with a synchronize at each end, the best of a few rounds.
Measured once per device and dtype in a process, at first use (about 0.5 s each);
a busy machine measures low, as it also trains slower.
"""
from __future__ import annotations

import threading
import time

import torch

_lock = threading.Lock()
_measured: dict[tuple[int, torch.dtype], float] = {}
_SIZE = 1024
_ROUND_SECONDS = 0.1


def _measure(index: int, dtype: torch.dtype) -> float:
    device = torch.device("neuron", index)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(_SIZE, _SIZE, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(_SIZE, _SIZE, generator=generator).to(device=device, dtype=dtype)
    out = torch.empty(_SIZE, _SIZE, device=device, dtype=dtype)
    torch.mm(a, b, out=out)  # first call: argument-kind verification, off the clock
    torch.neuron.synchronize(device)
    best = 0.0
    for _ in range(3):
        count, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b, out=out)
            count += 1
            torch.neuron.synchronize(device)  # a 2 GFLOP matmul dwarfs the wait
            elapsed = time.perf_counter() - start
            if elapsed >= _ROUND_SECONDS:
                break
        best = max(best, 2.0 * _SIZE ** 3 * count / elapsed)
    return best


def peak_flops(index: int, dtype: torch.dtype) -> float:
    """FLOP/s a neuron device's matmul reaches in ``dtype`` (measured once)."""
    key = (index, dtype)
    with _lock:
        if key not in _measured:
            _measured[key] = _measure(index, dtype)
        return _measured[key]
