"""torch.compile training step on `neuron` vs on CPU, and compile time; same run.

    python bench/bench_compile.py                 (make bench-compile runs this)
    python bench/bench_compile.py --models gpt    (one model)

For each model (the demo GPT at the demo's size, torchvision resnet18 at
32x32, a tiny Hugging Face Llama) it times a training step (forward, backward,
AdamW step; PyTorch's default AdamW, eager) four ways: compiled on neuron
(torch.compile's default backend, and backend="neuron", which turns Inductor's
layout optimization off for neuron graphs), compiled on CPU, eager on CPU, after warm-up steps, as the median of
--steps steps, devices alternating between repeats so that all see the same
machine load. Compile time: the first call (forward + backward graphs) under
a fresh Inductor cache (no FX graph or kernel cache hits), neuron vs CPU.
Targets (torch.compile issue): compiled neuron >= 0.95x compiled CPU's
throughput, compile time <= 1.2x CPU's. Prints the machine's load average.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from train_gpt import GPT, batches, load_corpus  # noqa: E402


def gpt():
    data, chars = load_corpus()
    model = GPT(len(chars), 64, dropout=0.0)
    batch = next(batches(data, 1, 16, 64, 0))
    return model, batch, lambda m, b: m(b[0], b[1])[1]


def resnet18():
    import torchvision
    model = torchvision.models.resnet18(num_classes=10)
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g))
    return model, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1])


def llama():
    import transformers
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(3, 256, (4, 64), generator=torch.Generator().manual_seed(0))
    return model, (ids,), lambda m, b: m(input_ids=b[0], labels=b[0]).loss


MODELS = {"gpt": gpt, "resnet18": resnet18, "llama": llama}


def setup(make, device, compiled):
    torch.manual_seed(0)
    model, batch, loss_fn = make()
    model = model.to(device)
    batch = tuple(t.to(device) for t in batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # compiled: False (eager), True (torch.compile's default backend) or a backend's name.
    if isinstance(compiled, str):
        run = torch.compile(model, backend=compiled)
    else:
        run = torch.compile(model) if compiled else model
    sync = torch.neuron.synchronize if device == "neuron" else (lambda: None)

    def step():
        loss = loss_fn(run, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
    return step


def step_ms(step, warmup, steps):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def compile_seconds(make, device):
    from torch._inductor.utils import fresh_cache
    torch._dynamo.reset()
    with fresh_cache():
        step = setup(make, device, compiled=True)
        t = time.perf_counter()
        step()
        return time.perf_counter() - t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="gpt,resnet18,llama")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-compile-time", action="store_true")
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()}; torch threads {torch.get_num_threads()}")
    configs = [("neuron", True), ("neuron", "neuron"), ("cpu", True), ("cpu", False)]
    for name in args.models.split(","):
        make = MODELS[name]
        steps = {c: setup(make, *c) for c in configs}
        res = {c: [] for c in configs}
        for _ in range(args.repeats):
            for c in configs:
                res[c].append(step_ms(steps[c], args.warmup, args.steps))
        ms = {c: statistics.median(v) for c, v in res.items()}
        n, nb = ms[("neuron", True)], ms[("neuron", "neuron")]
        c, e = ms[("cpu", True)], ms[("cpu", False)]
        print(f"{name}: step ms  compiled neuron {n:.1f} (backend='neuron' {nb:.1f})  "
              f"compiled cpu {c:.1f}  eager cpu {e:.1f}"
              f"  | throughput compiled neuron / compiled cpu {c / n:.2f}x, backend='neuron' "
              f"{c / nb:.2f}x (target >= 0.95), / eager cpu {e / n:.2f}x, {e / nb:.2f}x")
        if not args.no_compile_time:
            cn, cc = compile_seconds(make, "neuron"), compile_seconds(make, "cpu")
            print(f"{name}: first call (compiles, fresh cache)  neuron {cn:.1f} s  cpu {cc:.1f} s"
                  f"  ratio {cn / cc:.2f} (target <= 1.2)")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
