"""The kernel library's fused kernels vs the eager compositions; same run.

    python bench/bench_kernels.py            (make bench-kernels runs this)

For each kernel and shape, times forward + backward three ways: the fused
kernel of torchneuron.kernels on neuron, the eager composition on neuron
(ATen's ops, one by one on the device) and the eager composition on CPU
(PyTorch's CPU eager, the reference), as the median of --repeats timed runs
after warm-up, each ended by a synchronize (device) so that queued work is
counted. Devices alternate between repeats so all see the same machine load;
the load average is printed.

* rms_norm  ROWSxCOLS:        rms_norm vs F.rms_norm over the last dimension.
* rotary    BxHxSxD:          rotary_embedding(x, cos, sin) vs Hugging Face's
                              x * cos + rotate_half(x) * sin (cos/sin [1, S, D]).
* attention BxHxSxD[c]:       attention(q, k, v) vs F.scaled_dot_product_attention
                              (c: is_causal), gradients for q, k and v.
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from torchneuron.kernels import attention, rms_norm, rotary_embedding


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary_eager(x, cos, sin):
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


def _rms_norm_case(shape, g):
    rows, cols = map(int, shape.split("x"))
    inputs = [torch.randn(rows, cols, generator=g), torch.randn(cols, generator=g)]
    grad = torch.randn(rows, cols, generator=g)
    return (lambda x, w: rms_norm(x, w, 1e-6),
            lambda x, w: F.rms_norm(x, (cols,), w, 1e-6), inputs, [], grad)


def _rotary_case(shape, g):
    b, h, s, d = map(int, shape.split("x"))
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.arange(s).float()[:, None] * inv_freq[None]
    emb = torch.cat((freqs, freqs), dim=-1)[None]           # [1, S, D], as Llama's
    inputs = [torch.randn(b, h, s, d, generator=g)]
    grad = torch.randn(b, h, s, d, generator=g)
    return rotary_embedding, _rotary_eager, inputs, [emb.cos(), emb.sin()], grad


def _attention_case(shape, g):
    causal = shape.endswith("c")
    b, h, s, d = map(int, shape.rstrip("c").split("x"))
    inputs = [torch.randn(b, h, s, d, generator=g) for _ in range(3)]
    grad = torch.randn(b, h, s, d, generator=g)
    return (lambda q, k, v: attention(q, k, v, is_causal=causal),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
            inputs, [], grad)


CASES = {"rms_norm": _rms_norm_case, "rotary": _rotary_case, "attention": _attention_case}


def _step(fn, inputs, constants, grad, sync):
    for t in inputs:
        t.grad = None
    out = fn(*inputs, *constants)
    out.backward(grad)
    sync()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--shapes", default="2048x1024,8192x1024,4096x4096",
                        help="rms_norm shapes, ROWSxCOLS")
    parser.add_argument("--rotary-shapes", default="1x32x512x64,4x16x512x64,1x32x1024x128",
                        help="rotary shapes, BATCHxHEADSxSEQxHEAD_DIM")
    parser.add_argument("--attention-shapes", default="1x16x512x64c,4x8x256x64c,1x8x1024x128c,"
                        "2x8x256x64", help="attention shapes, BxHxSxD, c for causal")
    parser.add_argument("--kernels", default="rms_norm,rotary,attention")
    args = parser.parse_args()
    shapes = {"rms_norm": args.shapes, "rotary": args.rotary_shapes,
              "attention": args.attention_shapes}
    print(f"load average {os.getloadavg()[0]:.2f}, torch threads {torch.get_num_threads()}")
    print(f"{'shape':>24} {'fused neuron':>13} {'eager neuron':>13} {'CPU eager':>10} "
          f"{'fused/CPU':>10} {'fused/eager':>12}")
    for kernel in args.kernels.split(","):
        for shape in shapes[kernel].split(","):
            g = torch.Generator().manual_seed(0)
            fused, eager, inputs, constants, grad = CASES[kernel](shape, g)
            cases = {}
            for name, device, fn in (("fused", "neuron", fused), ("eager", "neuron", eager),
                                     ("cpu", "cpu", eager)):
                sync = torch.neuron.synchronize if device == "neuron" else (lambda: None)
                case = (fn, [t.to(device).requires_grad_() for t in inputs],
                        [t.to(device) for t in constants], grad.to(device), sync, [])
                cases[name] = case
                for _ in range(3):
                    _step(*case[:5])
            for _ in range(args.repeats):
                for name, case in cases.items():
                    start = time.perf_counter()
                    _step(*case[:5])
                    case[5].append(time.perf_counter() - start)
            med = {name: statistics.median(c[5]) for name, c in cases.items()}
            label = f"{kernel} {shape}"
            print(f"{label:>24} {med['fused'] * 1e3:>11.2f}ms {med['eager'] * 1e3:>11.2f}ms "
                  f"{med['cpu'] * 1e3:>8.2f}ms {med['cpu'] / med['fused']:>9.2f}x "
                  f"{med['eager'] / med['fused']:>11.2f}x")


if __name__ == "__main__":
    main()
