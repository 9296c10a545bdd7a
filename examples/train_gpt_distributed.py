"""The demo GPT trained data-parallel on 2 `neuron` ranks, against one device.

    python examples/train_gpt_distributed.py             (starts its 2 ranks itself)
    torchrun --nproc_per_node=2 examples/train_gpt_distributed.py

Each step's global batch (the demo's 16 x 64 tokens) is split between the
ranks. The same model is trained three ways from the same weights: on one
neuron device with the whole batch; with DDP on 2 ranks; with FSDP2
(`fully_shard` per block and at the root) on 2 ranks. The 2-rank loss of a
step is the mean of the ranks' losses (all-reduced), which is the
single-device loss of the whole batch; gradients are averaged across ranks,
which is the single-device gradient. So the curves agree up to float
rounding (the sum is split differently), checked within 1e-6 relative.
Rank 0 prints the three curves. The only device-specific code is the device.
"""
import argparse
import copy
import os
import subprocess
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_gpt import GPT, batches, load_corpus, make_optimizer  # noqa: E402

TOLERANCE = 1e-6


def launch(argv):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, *argv],
                              env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                       LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port)))
             for r in range(2)]
    return max(p.wait() for p in procs)


def train(model, args, data, rank, world):
    """Loss of the whole global batch at each step (each rank sees its slice)."""
    opt, sched = make_optimizer(model, args.lr, args.steps)
    losses = []
    per_rank = args.batch // world
    for x, y in batches(data, args.steps, args.batch, args.block, args.seed):
        x = x[rank * per_rank:(rank + 1) * per_rank].to("neuron")
        y = y[rank * per_rank:(rank + 1) * per_rank].to("neuron")
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach()
        if world > 1:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        losses.append(loss)
    return [l.item() for l in losses]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args()
    if "RANK" not in os.environ:
        return launch(sys.argv[1:])

    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group()  # the accelerator's backend: "neuron"
    data, chars = load_corpus()
    torch.manual_seed(args.seed)
    init = GPT(len(chars), args.block, dropout=0.0).state_dict()

    def fresh():
        m = GPT(len(chars), args.block, dropout=0.0)
        m.load_state_dict(copy.deepcopy(init))
        return m.to("neuron")

    single = train(fresh(), args, data, 0, 1) if rank == 0 else None
    ddp = train(DDP(fresh()), args, data, rank, world)
    sharded = fresh()
    for blk in sharded.blocks:
        fully_shard(blk)
    fully_shard(sharded)
    fsdp = train(sharded, args, data, rank, world)

    ok = True
    if rank == 0:
        print(f"demo GPT, {args.steps} AdamW steps of {args.batch}x{args.block} tokens, "
              f"{world} ranks on neuron vs 1 device")
        print(f"{'step':>5} {'1 device':>12} {'DDP':>12} {'FSDP2':>12}")
        for i in range(0, args.steps, max(1, args.steps // 10)):
            print(f"{i + 1:5d} {single[i]:12.7f} {ddp[i]:12.7f} {fsdp[i]:12.7f}")
        for name, curve in (("DDP", ddp), ("FSDP2", fsdp)):
            rel = max(abs(a - b) / abs(b) for a, b in zip(curve, single))
            good = rel <= TOLERANCE
            ok &= good
            print(f"{name}: max relative difference to 1 device {rel:.2e} "
                  f"({'within' if good else 'OUTSIDE'} {TOLERANCE:g})")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
