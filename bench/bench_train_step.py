"""Training step time of the demo model on `neuron` vs PyTorch CPU, same run.

    python bench/bench_train_step.py           (make bench-py runs this)
    python bench/bench_train_step.py --models resnet18,llama   (and those two)

Times forward + backward + optimizer step + LR schedule step of
examples/train_gpt.py's GPT at the demo's size, with the demo's optimizer:
PyTorch's default AdamW (foreach on neuron, as on CUDA; --fused for the fused
kernel) and a warm-up + cosine LambdaLR schedule, after warm-up steps,
alternating devices between repeats so both see the same machine load.
Target (eager speed issue): throughput neuron / cpu >= 1.25. The machine's load average is
printed with the result.

    python bench/bench_train_step.py --amp bf16 --models resnet18,llama
    python bench/bench_train_step.py --background-load 1 --models llama
    python bench/bench_train_step.py --processes 6 --no-gpt --models llama

--processes N runs the whole comparison in N fresh processes, one after the
other, and prints each result's ratio per process and their median. On a
VM one process can run the host or a model in a slow mode throughout (CPU
eager's GPT step 46 or 56 ms by process, the same script), so a ratio from
one process is one draw; alternating both devices inside each process keeps
each draw fair, several processes show the spread.

Each result also gives the process's minor page faults per timed step on
each device: CPU eager's activations and temporaries come from glibc's
malloc, which maps big blocks fresh and trims its heap, so CPU eager pays
first-touch page faults every step (resnet18 at 32x32: about 18,700 per step,
some 20 ms), where the device's caching allocator reuses its memory. To see
CPU eager without them (what a caching host malloc gives), rerun with glibc's
trimming threshold raised and its mmap threshold at its largest (32 MiB;
larger blocks are always mapped fresh):

    MALLOC_TRIM_THRESHOLD_=1000000000 MALLOC_MMAP_THRESHOLD_=33554432 \
        python bench/bench_train_step.py --models resnet18,llama

--background-load N starts N processes that each keep a core busy (a Python
loop at the default priority) for the whole run: a machine shared with
other work, where the device's threads and the host compete with them.

runs every step under torch.autocast(dtype=torch.bfloat16) on each device.
neuron applies CUDA's autocast policy, which differs from CPU's on
layer_norm and cross_entropy (cuda_autocast_policy below); the
CPU reference gets CUDA's casts written out (as tests/test_no_host_wait.py
does for layer_norm), so both run the same math and the losses and
parameters can be compared bit for bit.
"""
import contextlib
import argparse
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_gpt import GPT, batches, load_corpus, make_optimizer  # noqa: E402
from host_malloc import malloc_settings, minor_faults  # noqa: E402


AMP = {"none": None, "bf16": torch.bfloat16}


@contextlib.contextmanager
def cuda_autocast_policy(device, dtype):
    """The CPU reference under autocast, with CUDA's policy (which neuron
    applies) where CPU's differs on an op these models use:
    - layer_norm: fp32 on CUDA, the input dtype on CPU;
    - cross_entropy: CUDA's list leaves it out, so it runs as composed, its
      log_softmax in the input dtype; CPU's list runs it all in fp32.
    Elsewhere nothing changes."""
    if device != "cpu" or dtype is None:
        yield
        return
    layer_norm, cross_entropy = F.layer_norm, F.cross_entropy

    def cuda_layer_norm(x, shape, weight=None, bias=None, eps=1e-5):
        if not torch.is_autocast_enabled("cpu"):
            return layer_norm(x, shape, weight, bias, eps)
        with torch.autocast("cpu", enabled=False):
            return layer_norm(x.float(), shape, None if weight is None else weight.float(),
                              None if bias is None else bias.float(), eps)

    def cuda_cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean",
                           label_smoothing=0.0):
        if not torch.is_autocast_enabled("cpu"):
            return cross_entropy(input, target, weight, ignore_index=ignore_index,
                                 reduction=reduction, label_smoothing=label_smoothing)
        assert label_smoothing == 0.0, "the reference composes cross_entropy without smoothing"
        with torch.autocast("cpu", enabled=False):
            logp = torch.log_softmax(input, 1 if input.dim() > 1 else 0, dtype=input.dtype)
            return F.nll_loss(logp.float(), target, None if weight is None else weight.float(),
                              ignore_index=ignore_index, reduction=reduction)
    F.layer_norm, F.cross_entropy = cuda_layer_norm, cuda_cross_entropy
    try:
        yield
    finally:
        F.layer_norm, F.cross_entropy = layer_norm, cross_entropy


def plain_step(device, loss_at, opt, amp):
    """Training step i (loss_at(i): its loss; forward and loss under autocast
    to `amp` when set) without the LR schedule, timing or synchronization;
    returns the loss."""
    def step(i):
        with torch.autocast(device.split(":")[0], dtype=amp or torch.bfloat16,
                            enabled=amp is not None), cuda_autocast_policy(device, amp):
            loss = loss_at(i)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


def train(device, opt, sched, loss_at, steps, warmup, amp=None):
    """Runs `steps` training steps (plain_step, then the schedule's step);
    returns the median time (ms) of the steps after `warmup` and every step's
    loss."""
    neuron = device.startswith("neuron")
    sync = torch.neuron.synchronize if neuron else (lambda: None)
    step = plain_step(device, loss_at, opt, amp)
    times, issue, wait, losses = [], [], [], []
    for i in range(steps):
        if i == warmup:
            faults = minor_faults()
        start = time.perf_counter()
        loss = step(i)
        sched.step()
        issued = time.perf_counter()
        sync()
        end = time.perf_counter()
        if i >= warmup:
            times.append(end - start)
            issue.append(issued - start)
            wait.append(end - issued)
        losses.append(loss.detach())
    FAULTS.setdefault("neuron" if neuron else "cpu", []).append(
        (minor_faults() - faults) / max(1, steps - warmup))
    if neuron:
        ISSUE.append((statistics.median(issue) * 1e3, statistics.median(wait) * 1e3))
    return statistics.median(times) * 1e3, losses


HOLD_US = 200_000


def device_only_ms(step, repeats=3, queued=5):
    """The device's time per step with the host idle beside it: `queued`
    steps are issued behind a kernel that sleeps HOLD_US, so all of them are
    queued before the device starts; (time to synchronize - the sleep) /
    queued, the median of `repeats`. Against CPU eager's whole step it bounds
    what neuron can reach with the host's dispatch fully hidden: cpu /
    device-only is the ceiling the report prints. Several steps per hold,
    because the compute threads go to sleep during the hold and the first
    work starts on them cold (a tiny Llama step read 9-13 ms alone, 6-7 ms
    five at a time). Also returns the host's time to issue a step meanwhile
    (median, ms): its time with no device work beside it."""
    times, issue = [], []
    for r in range(repeats):
        torch.neuron.synchronize()
        torch.neuron._sleep(HOLD_US)
        start = time.perf_counter()
        for i in range(queued):
            step(r * queued + i)
        issued = time.perf_counter()
        torch.neuron.synchronize()
        times.append((time.perf_counter() - start - HOLD_US / 1e6) / queued)
        issue.append((issued - start) / queued)
    return statistics.median(times) * 1e3, statistics.median(issue) * 1e3


def step_time(device, data, vocab, args):
    torch.manual_seed(0)
    model = GPT(vocab, args.block).to(device)
    opt, sched = make_optimizer(model, 1e-3, args.warmup + args.steps, fused=args.fused)
    batch_list = [(x.to(device), y.to(device))
                  for x, y in batches(data, args.warmup + args.steps, args.batch, args.block, 0)]
    ms, losses = train(device, opt, sched, lambda i: model(*batch_list[i])[1],
                       args.warmup + args.steps, args.warmup, AMP[args.amp])
    params = [p.detach().cpu() for p in model.parameters()]
    if device == "neuron":
        DEVICE_ONLY.append(device_only_ms(
            plain_step(device, lambda i: model(*batch_list[i % len(batch_list)])[1], opt,
                       AMP[args.amp])))
    return ms, [l.item() for l in losses], params


def model_step_time(name, device, args):
    """Median step time (ms), the losses and the final parameters of one of
    bench_compile's models (resnet18 at 32x32, a tiny HF Llama) trained
    eagerly on `device` with PyTorch's default AdamW and a warm-up LambdaLR."""
    from bench_compile import MODELS
    torch.manual_seed(0)
    model, batch, loss_fn = MODELS[name]()
    model = model.to(device)
    batch = tuple(t.to(device) for t in batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    ms, losses = train(device, opt, sched, lambda i: loss_fn(model, batch),
                       args.warmup + args.steps, args.warmup, AMP[args.amp])
    params = [p.detach().cpu() for p in model.parameters()]
    if device == "neuron":
        DEVICE_ONLY.append(device_only_ms(
            plain_step(device, lambda i: loss_fn(model, batch), opt, AMP[args.amp])))
    return ms, [l.item() for l in losses], params


def compare_models(args):
    for name in args.models.split(","):
        res, runs = {"cpu": [], "neuron": []}, {}
        for _ in range(args.repeats):
            for device in ("cpu", "neuron"):
                ms, losses, params = model_step_time(name, device, args)
                res[device].append(ms)
                runs[device] = (losses, params)
        report(f"{name} train step, default AdamW + LambdaLR", res, runs, args)


def bitwise_same(runs):
    return runs["cpu"][0] == runs["neuron"][0] and all(
        torch.equal(a, b) for a, b in zip(runs["cpu"][1], runs["neuron"][1]))


# (device-only step time, the host's issue time meanwhile) of the neuron runs since the
# last report (device_only_ms).
DEVICE_ONLY = []
# The host's time to issue a whole step on neuron (before synchronize) and its wait in
# synchronize (medians), per run since the last report. With the host done early and the step
# still longer than device_only_ms, the device ran slower beside the host than alone.
ISSUE = []
# Minor page faults per timed step, per device, per run since the last report.
FAULTS = {}


def report(what, res, runs, args):
    c, n = statistics.median(res["cpu"]), statistics.median(res["neuron"])
    d = statistics.median(t for t, _ in DEVICE_ONLY)
    held = statistics.median(i for _, i in DEVICE_ONLY)
    issue = statistics.median(i for i, _ in ISSUE)
    wait = statistics.median(w for _, w in ISSUE)
    faults = {dev: statistics.median(f) for dev, f in FAULTS.items()}
    DEVICE_ONLY.clear()
    ISSUE.clear()
    FAULTS.clear()
    amp = "" if args.amp == "none" else f", {args.amp} autocast"
    print(f"{what}{amp} (median of {args.repeats}x{args.steps} steps): cpu {c:.2f} ms  "
          f"neuron {n:.2f} ms  throughput neuron / cpu {c / n:.2f}x  losses and parameters "
          f"bitwise equal: {bitwise_same(runs)}  "
          f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores); "
          f"device-only step (host idle, steps queued behind a sleeping kernel) {d:.2f} ms, "
          f"so with the host fully hidden neuron could reach {c / d:.2f}x; "
          f"on neuron the host issues a step in {issue:.2f} ms ({held:.2f} ms with the device "
          f"held) and waits {wait:.2f} ms for the device; minor page faults per step: "
          f"cpu {faults['cpu']:.0f}, neuron {faults['neuron']:.0f}")


def _spin():
    while True:
        pass


@contextlib.contextmanager
def background_load(n):
    """n processes that each keep a core busy while the block runs."""
    ctx = multiprocessing.get_context("spawn")  # no copy of this process's torch state
    procs = [ctx.Process(target=_spin, daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.join()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="",
                   help="also time these bench_compile models eagerly: resnet18,llama")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--fused", action="store_true", default=None)
    p.add_argument("--amp", choices=sorted(AMP), default="none",
                   help="autocast forward and loss to this dtype on both devices")
    p.add_argument("--background-load", type=int, default=0, metavar="N",
                   help="run beside N processes that each keep a core busy")
    p.add_argument("--no-gpt", action="store_true",
                   help="leave out the demo GPT (time only --models)")
    p.add_argument("--processes", type=int, default=0, metavar="N",
                   help="run the comparison in N fresh processes in turn and summarize")
    args = p.parse_args()
    if args.processes:
        return across_processes(args.processes)
    if args.background_load:
        print(f"beside {args.background_load} busy background process(es)")
    print(f"host malloc: {malloc_settings()}")
    with background_load(args.background_load):
        run(args)


def run_gpt(args):
    data, chars = load_corpus()
    res, runs = {"cpu": [], "neuron": []}, {}
    for _ in range(args.repeats):
        for device in ("cpu", "neuron"):
            ms, losses, params = step_time(device, data, len(chars), args)
            res[device].append(ms)
            runs[device] = (losses, params)
    opt = "fused AdamW" if args.fused else "default (foreach) AdamW"
    report(f"demo GPT train step, {opt} + LambdaLR", res, runs, args)


def run(args):
    if not args.no_gpt:
        run_gpt(args)
    if args.models:
        compare_models(args)


RESULT = re.compile(r"^(?P<what>.+?) \(median of .*?cpu (?P<cpu>[0-9.]+) ms  neuron (?P<neuron>[0-9.]+) ms"
                    r".*?bitwise equal: (?P<bitwise>\w+)")


def across_processes(n):
    """Runs this script with the same arguments (less --processes) in n fresh
    processes in turn; prints every result line's ratio per process and the
    median, range and bitwise verdicts across them."""
    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--processes":
            skip = True
        elif not a.startswith("--processes="):
            argv.append(a)
    results = {}
    for i in range(n):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), *argv],
                             capture_output=True, text=True, check=True).stdout
        found = [m for m in map(RESULT.match, out.splitlines()) if m]
        if not found:  # report()'s wording changed, or nothing was timed
            sys.exit(f"process {i + 1} printed no result line:\n{out}")
        for m in found:
            results.setdefault(m["what"], []).append(
                (float(m["cpu"]), float(m["neuron"]), m["bitwise"] == "True"))
        print(f"process {i + 1}/{n}: " + ", ".join(
            f"{what} {r[-1][0] / r[-1][1]:.2f}x" for what, r in results.items()), flush=True)
    print(f"across {n} processes (load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores):")
    for what, r in results.items():
        ratios = sorted(c / d for c, d, _ in r)
        print(f"  {what}: throughput neuron / cpu median {statistics.median(ratios):.2f}x "
              f"(range {ratios[0]:.2f}-{ratios[-1]:.2f}); cpu median "
              f"{statistics.median(c for c, _, _ in r):.2f} ms, neuron median "
              f"{statistics.median(d for _, d, _ in r):.2f} ms; bitwise equal in "
              f"{sum(b for _, _, b in r)} of {len(r)}")
    return 0


if __name__ == "__main__":
    main()
