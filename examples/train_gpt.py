"""The main job: train a small GPT on Shakespeare on `neuron` and on CPU.

Both runs start from the same weights and see the same batches; the script
prints the two loss series and tokens/s, says whether they match bit for
bit, continues training on `neuron` with dropout on, and generates a short
text sample there. With --compile it
also trains the model under torch.compile (Inductor) on both devices and
compares the compiled runs (neuron-compiled against CPU-compiled). It ends
with a throughput summary and saves one plot (out/loss_curves.png): the two
loss curves and the two devices' tokens/s, eager and compiled.

    python examples/train_gpt.py --compile  (make demo runs this)
    python examples/train_gpt.py --steps 50 --device2 cpu   (a quick CPU-only check)

The only device-specific thing in the model code is `.to(device)`.
"""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, dropout):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, dim, heads, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                 nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block, dim=128, heads=4, layers=4, dropout=0.0):
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def set_dropout(self, p):
        for m in self.modules():
            if isinstance(m, nn.Dropout):
                m.p = p
            if isinstance(m, CausalSelfAttention):
                m.dropout = p

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    @torch.no_grad()
    def generate(self, idx, n, generator=None):
        for _ in range(n):
            logits, _ = self(idx[:, -self.block:])
            probs = F.softmax(logits[:, -1, :] / 0.8, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


def load_corpus():
    text = open(os.path.join(HERE, "data", "shakespeare.txt"), encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    return data, chars


def batches(data, steps, batch, block, seed):
    """The same batches for every run: drawn on CPU from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ix = torch.randint(len(data) - block - 1, (batch,), generator=g)
        x = torch.stack([data[i:i + block] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block] for i in ix])
        yield x, y


def make_optimizer(model, lr, steps, fused=None):
    """PyTorch's default AdamW (foreach on neuron, as on CUDA; fused=True asks
    for the fused kernel) and a cosine schedule with a linear warm-up: the
    learning rate is a new float every step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, fused=fused)
    warmup = max(1, steps // 10)

    def lr_at(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_at)


def train(model, device, data, args, steps, seed, log_every=0, label=""):
    # The same optimizer on both devices: the same math, so the same bits.
    opt, sched = make_optimizer(model, args.lr, steps, fused=args.fused)
    losses = []
    tokens = 0
    start = time.perf_counter()
    for step, (x, y) in enumerate(batches(data, steps, args.batch, args.block, seed)):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.detach())
        tokens += x.numel()
        if log_every and (step + 1) % log_every == 0:
            print(f"  [{label}] step {step + 1:4d}  loss {losses[-1].item():.4f}", flush=True)
    losses = [l.item() for l in losses]  # one synchronisation at the end
    elapsed = time.perf_counter() - start
    return losses, tokens / elapsed


def compiled_run(init, chars, data, args, device):
    """The same training under torch.compile: (losses, tokens/s, seconds to the first loss)."""
    torch._dynamo.reset()
    model = GPT(len(chars), args.block, dropout=0.0)
    model.load_state_dict(init)
    model.to(device)
    start = time.perf_counter()
    compiled = torch.compile(model)
    # The first step compiles the forward and backward graphs.
    train(compiled, device, data, args, 1, args.seed)
    first = time.perf_counter() - start
    losses, tps = train(compiled, device, data, args, args.compile_steps, args.seed)
    return losses, tps, first


def compare_compiled(init, chars, data, args):
    print(f"\ntorch.compile (Inductor), {args.compile_steps} steps per device ...", flush=True)
    ref, ref_tps, ref_first = compiled_run(init, chars, data, args, args.device2)
    dev, dev_tps, dev_first = compiled_run(init, chars, data, args, args.device)
    print(f"{'step':>5} {args.device2 + ' compiled':>15} {args.device + ' compiled':>15}")
    for i in range(0, args.compile_steps, max(1, args.compile_steps // 10)):
        print(f"{i + 1:5d} {ref[i]:15.6f} {dev[i]:15.6f}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(dev, ref))
    print(f"compiled tokens/s: {args.device2} {ref_tps:,.0f}   {args.device} {dev_tps:,.0f}   "
          f"ratio {dev_tps / ref_tps:.2f}x; first step (compiles): {ref_first:.1f} s vs "
          f"{dev_first:.1f} s")
    # Inductor lowers a few ops differently for devices other than "cpu"
    # (tests/test_compile.py): the compiled runs agree to rounding, not bits.
    print(f"compiled loss series: max relative difference {worst:.3g} "
          f"({'bitwise equal' if dev == ref else 'within 1e-4' if worst <= 1e-4 else 'DIFFER'})")
    return worst <= 1e-4, (ref_tps, dev_tps)


def plot(ref_losses, dev_losses, devices, throughput, path):
    """Loss curves of both devices (left) and their training throughput
    (right: tokens/s per run, eager and compiled when it ran), one figure."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    ref, dev = devices
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    ax.plot(ref_losses, label=ref, linewidth=2.5, alpha=0.6)
    ax.plot(dev_losses, label=dev, linewidth=1.0, linestyle="--")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"Char-level GPT on Shakespeare: {ref} vs {dev}")
    ax.legend()
    runs = list(throughput)
    width = 0.38
    for i, (name, offset) in enumerate(((ref, -width / 2), (dev, width / 2))):
        values = [throughput[r][i] for r in runs]
        bars = bx.bar([k + offset for k in range(len(runs))], values, width, label=name)
        bx.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8)
    for k, r in enumerate(runs):
        ratio = throughput[r][1] / throughput[r][0]
        bx.annotate(f"{ratio:.2f}x", (k, 0), xytext=(0, -28), textcoords="offset points",
                    ha="center", fontsize=9)
    bx.set_xticks(range(len(runs)), runs)
    bx.set_ylabel("tokens/s")
    bx.set_title(f"training throughput ({dev} / {ref} below)")
    bx.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"saved plot: {os.path.relpath(path)}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="neuron")
    p.add_argument("--device2", default="cpu", help="the reference device")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--dropout-steps", type=int, default=60,
                   help="extra steps on --device with dropout on, before sampling")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--fused", action="store_true", default=None,
                   help="fused AdamW (default: PyTorch's default, foreach)")
    p.add_argument("--out", default=os.path.join(HERE, "out"))
    p.add_argument("--compile", action="store_true",
                   help="also train under torch.compile on both devices and compare")
    p.add_argument("--compile-steps", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    data, chars = load_corpus()
    print(f"corpus: {len(data)} characters, vocabulary {len(chars)}")
    torch.manual_seed(args.seed)
    # Dropout layers are part of the model; the parity phase runs them with
    # p=0 because CPU (mt19937) and neuron (Philox) draw different masks.
    reference = GPT(len(chars), args.block, dropout=0.0)
    init = {k: v.clone() for k, v in reference.state_dict().items()}
    print(f"model: {sum(p.numel() for p in reference.parameters()) / 1e6:.2f}M parameters, "
          f"{args.steps} AdamW steps of {args.batch}x{args.block} tokens per device")

    results = {}
    for device in (args.device2, args.device):
        model = GPT(len(chars), args.block, dropout=0.0)
        model.load_state_dict(init)
        model.to(device)
        print(f"training on {device} ...", flush=True)
        results[device] = (model,) + train(model, device, data, args, args.steps, args.seed,
                                           log_every=max(1, args.steps // 5), label=device)

    ref_losses, ref_tps = results[args.device2][1:]
    dev_model, dev_losses, dev_tps = results[args.device]
    print(f"\n{'step':>5} {args.device2:>12} {args.device:>12}")
    for i in range(0, args.steps, max(1, args.steps // 20)):
        print(f"{i + 1:5d} {ref_losses[i]:12.6f} {dev_losses[i]:12.6f}")
    identical = ref_losses == dev_losses
    diff = max(abs(a - b) for a, b in zip(ref_losses, dev_losses))
    params_equal = all(
        torch.equal(a.detach().cpu(), b.detach().cpu())
        for a, b in zip(results[args.device2][0].parameters(), dev_model.parameters()))
    print(f"\ntokens/s: {args.device2} {ref_tps:,.0f}   {args.device} {dev_tps:,.0f}   "
          f"ratio {dev_tps / ref_tps:.2f}x")
    print(f"loss series {'MATCH bit for bit' if identical else 'DIFFER'} "
          f"(max |diff| {diff:.3g}); final parameters {'identical' if params_equal else 'differ'}")

    throughput = {"eager": (ref_tps, dev_tps)}

    if args.dropout_steps:
        dev_model.set_dropout(args.dropout)
        dev_model.train()
        print(f"\ncontinuing on {args.device} with dropout {args.dropout} for "
              f"{args.dropout_steps} steps ...")
        more, _ = train(dev_model, args.device, data, args, args.dropout_steps, args.seed + 1)
        print(f"loss {more[0]:.4f} -> {more[-1]:.4f}")
    compiled_ok = True
    if args.compile:
        compiled_ok, compiled_tps = compare_compiled(init, chars, data, args)
        throughput["compiled"] = compiled_tps
    print("\nthroughput summary (tokens/s, " + f"{args.device} / {args.device2}):")
    for run, (r, d) in throughput.items():
        print(f"  {run:<9} {args.device2} {r:>9,.0f}   {args.device} {d:>9,.0f}   {d / r:.2f}x")
    os.makedirs(args.out, exist_ok=True)
    plot(ref_losses, dev_losses, (args.device2, args.device), throughput,
         os.path.join(args.out, "loss_curves.png"))
    dev_model.eval()
    g = torch.Generator(device=args.device).manual_seed(args.seed)
    prompt = torch.tensor([[chars.index(c) for c in "HAMLET:\n"]], device=args.device)
    out = dev_model.generate(prompt, 300, generator=g)[0].tolist()
    print(f"\nsample from {args.device}:\n" + "".join(chars[i] for i in out))
    return 0 if identical and params_equal and compiled_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
