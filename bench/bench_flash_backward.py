"""bf16 flash attention backward per call: CPU eager against neuron with the
device's own kernel (csrc/aten/FlashBackward.h) and with CPU's kernel
(TORCHNEURON_FLASH_BACKWARD's switch off), in one process.

    python bench/bench_flash_backward.py

Times `_scaled_dot_product_flash_attention_for_cpu_backward` on the tiny
Llama's attention (batch 4, 4 query heads over 2 key/value heads, 64 tokens,
head_dim 32, causal) and the demo GPT's (batch 16, 4 heads, 64 tokens,
head_dim 32, causal): `--iters` calls then one synchronization, the three
variants alternating over `--repeats`, medians printed with the device's
results checked bit for bit against CPU's. Every call is queued behind the
previous one, so a neuron figure is the device's time per call (the host
only queues). The machine's load average is printed with the result.
"""
import argparse
import os
import statistics
import time

import torch

import torchneuron  # noqa: F401
from torchneuron import _C

SHAPES = {
    "llama": (4, 4, 2, 64, 32),  # batch, heads, kv heads, tokens, head_dim
    "gpt": (16, 4, 4, 64, 32),
}


def operands(batch, heads, kv_heads, tokens, head_dim, device):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, tokens, head_dim, generator=g).bfloat16()
    k = torch.randn(batch, kv_heads, tokens, head_dim, generator=g).bfloat16()
    v = torch.randn(batch, kv_heads, tokens, head_dim, generator=g).bfloat16()
    grad_out = torch.randn(batch, heads, tokens, head_dim, generator=g).bfloat16()
    q, k, v, grad_out = (t.to(device) for t in (q, k, v, grad_out))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[:2]
    return grad_out, q, k, v, out, lse


def backward(args):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(*args, 0.0, True)


def per_call_ms(args, device, iters):
    sync = torch.neuron.synchronize if device == "neuron" else (lambda: None)
    backward(args)
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        backward(args)
    sync()
    return (time.perf_counter() - start) / iters * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    if not _C._flash_backward_bf16_available():
        print("this CPU has no AVX512-BF16 (or has AMX): neuron runs CPU's kernel")
    for name, shape in SHAPES.items():
        cpu_args, dev_args = operands(*shape, "cpu"), operands(*shape, "neuron")
        want = backward(cpu_args)
        got = [g.cpu() for g in backward(dev_args)]
        same = all(torch.equal(w.view(torch.int16), g_.view(torch.int16)) for w, g_ in zip(want, got))
        times = {"cpu": [], "kernel": [], "off": []}
        for _ in range(a.repeats):
            times["cpu"].append(per_call_ms(cpu_args, "cpu", a.iters))
            times["kernel"].append(per_call_ms(dev_args, "neuron", a.iters))
            _C._set_flash_backward_bf16_enabled(False)
            try:
                times["off"].append(per_call_ms(dev_args, "neuron", a.iters))
            finally:
                _C._set_flash_backward_bf16_enabled(True)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{name}: cpu {med['cpu']:.3f} ms  neuron {med['kernel']:.3f} ms "
              f"(CPU's kernel on neuron {med['off']:.3f} ms)  neuron / cpu speed "
              f"{med['cpu'] / med['kernel']:.2f}x  bitwise equal: {same}  "
              f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
