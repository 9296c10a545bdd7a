"""torch.distributed on `neuron` vs Gloo on CPU tensors, 2 ranks, same run.

    python bench/bench_distributed.py            (make bench-distributed runs this)
    python bench/bench_distributed.py --quick    (fewer sizes and steps)

Starts 2 ranks itself (torchrun's environment, one process each, loopback) in
one group "cpu:gloo,neuron:neuron": the same collective runs on neuron
tensors (the neuron backend: device work items that move the data through
shared memory, both ranks being on this machine, or with TORCHNEURON_DIST_SHM=0
hand Gloo zero-copy views) and on CPU tensors (Gloo itself), alternating, so
both see the same machine load. Reports, rank 0:
  * all_reduce and all_gather_into_tensor bandwidth (bytes per rank / time,
    median of repeats) for 4 KiB ... 64 MiB, neuron / CPU ratio (target >= 0.9);
  * a DDP training step (forward, backward with bucketed all-reduce, AdamW)
    of the demo GPT at the demo's size: neuron vs CPU-Gloo, steps/s ratio;
  * FSDP2 memory per rank (parameters + gradients + AdamW state, by the
    device allocator) against the same model unsharded on one device
    (expected about 1/2 on 2 ranks).
Prints the machine's load average; 2 ranks share this machine's cores.
"""
import argparse
import copy
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def launch(argv):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", *argv], env=env))
    return max(p.wait() for p in procs)


def timed(fn, sync, repeats, inner):
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def collectives(args, rank, say):
    import torch
    import torch.distributed as dist

    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20] if args.quick else \
        [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    neuron_backend = dist.group.WORLD._get_backend(torch.device("neuron"))
    say(f"agreement check before each neuron collective: {neuron_backend.agreement}; "
        f"data: {neuron_backend.data_path}")
    say(f"{'op':<24}{'bytes':>10}{'neuron GB/s':>14}{'cpu GB/s':>12}{'ratio':>8}")
    ratios = []
    for op in ("all_reduce", "all_gather_into_tensor"):
        for nbytes in sizes:
            n = nbytes // 4
            inner = max(1, min(50, (8 << 20) // nbytes))
            res = {}
            for dev in ("cpu", "neuron") * 1:
                x = torch.ones(n, device=dev)
                out = torch.empty(2 * n, device=dev)
                if op == "all_reduce":
                    fn = lambda x=x: dist.all_reduce(x)
                else:
                    fn = lambda x=x, out=out: dist.all_gather_into_tensor(out, x)
                sync = (lambda: torch.neuron.synchronize()) if dev == "neuron" else (lambda: None)
                fn()
                sync()
                res[dev] = []
            for _ in range(args.repeats):  # alternate devices between repeats
                for dev in ("cpu", "neuron"):
                    x = torch.ones(n, device=dev)
                    out = torch.empty(2 * n, device=dev)
                    fn = (lambda x=x: dist.all_reduce(x)) if op == "all_reduce" else \
                        (lambda x=x, out=out: dist.all_gather_into_tensor(out, x))
                    sync = (lambda: torch.neuron.synchronize()) if dev == "neuron" else (lambda: None)
                    res[dev].append(timed(fn, sync, 1, inner))
            t = {d: statistics.median(v) for d, v in res.items()}
            bw = {d: nbytes / t[d] / 1e9 for d in t}
            ratio = bw["neuron"] / bw["cpu"]
            ratios.append(ratio)
            say(f"{op:<24}{nbytes:>10}{bw['neuron']:>14.3f}{bw['cpu']:>12.3f}{ratio:>8.2f}")
    say(f"bandwidth ratio neuron/cpu: min {min(ratios):.2f}, median {statistics.median(ratios):.2f}")


def ddp_step(args, rank, say):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    from train_gpt import GPT, batches, load_corpus

    data, chars = load_corpus()
    torch.manual_seed(0)
    base = GPT(len(chars), 64, dropout=0.0)
    x, y = next(batches(data, 1, 16, 64, seed=rank))
    runs = {}
    for dev in ("cpu", "neuron"):
        model = DDP(copy.deepcopy(base).to(dev))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        xd, yd = x.to(dev), y.to(dev)

        def step(model=model, opt=opt, xd=xd, yd=yd):
            _, loss = model(xd, yd)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync = (lambda: torch.neuron.synchronize()) if dev == "neuron" else (lambda: None)
        for _ in range(2):
            step()
        sync()
        runs[dev] = (step, sync, [])
    for _ in range(args.repeats):
        for dev, (step, sync, ts) in runs.items():
            ts.append(timed(step, sync, 1, args.steps))
    t = {d: statistics.median(v[2]) for d, v in runs.items()}
    say(f"DDP step, demo GPT (16x64 tokens per rank): neuron {1 / t['neuron']:.2f} steps/s, "
        f"cpu-gloo {1 / t['cpu']:.2f} steps/s, ratio {t['cpu'] / t['neuron']:.2f}")


def fsdp_memory(args, rank, say):
    import torch
    from torch.distributed.fsdp import fully_shard

    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    from train_gpt import GPT, batches, load_corpus

    data, chars = load_corpus()
    x, y = next(batches(data, 1, 8, 64, seed=rank))

    def state_bytes(sharded):
        import gc

        gc.collect()
        torch.neuron.synchronize()
        base = torch.neuron.memory_allocated()
        torch.manual_seed(0)
        model = GPT(len(chars), 64, dropout=0.0).to("neuron")
        if sharded:
            for blk in model.blocks:
                fully_shard(blk)
            fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        _, loss = model(x.to("neuron"), y.to("neuron"))
        loss.backward()
        opt.step()
        del loss
        gc.collect()
        torch.neuron.synchronize()
        # What the rank keeps between steps (parameters, gradients, AdamW's
        # state, and FSDP2's own buffers), as the device allocator counts it.
        kept = torch.neuron.memory_allocated() - base
        del model, opt
        return kept

    full = state_bytes(False)
    sharded = state_bytes(True)
    say(f"FSDP2 state per rank (params + grads + AdamW): {sharded / 2**20:.2f} MiB vs unsharded "
        f"{full / 2**20:.2f} MiB: {sharded / full:.3f}x (2 ranks)")


def worker(args):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.neuron.set_device(rank)
    dist.init_process_group("cpu:gloo,neuron:neuron")
    say = (lambda s: print(s, flush=True)) if rank == 0 else (lambda s: None)
    say(f"load average at start: {os.getloadavg()}; torch threads {torch.get_num_threads()}")
    for part in args.parts:
        {"collectives": collectives, "ddp": ddp_step, "fsdp": fsdp_memory}[part](args, rank, say)
        dist.barrier()
    say(f"load average at end: {os.getloadavg()}")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="DDP steps per repeat")
    p.add_argument("--parts", nargs="+", default=["collectives", "ddp", "fsdp"])
    args, rest = p.parse_known_args()
    if args.worker:
        return worker(args)
    return launch(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
