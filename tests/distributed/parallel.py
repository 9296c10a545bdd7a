"""Workers for the parallelism layers on the neuron backend: FSDP2, DTensor and
tensor parallel, pipelining, distributed checkpoint, a 2-D mesh.

Each worker runs the same script twice in one process: on CPU tensors over
Gloo (the reference) and on neuron tensors over the "neuron" backend, in one
group "cpu:gloo,neuron:neuron"; results come back as (neuron, reference)
pairs of CPU tensors. The neuron device runs CPU's own kernels and the backend
carries Gloo's own algorithms, so the same script must give the same bits.
"""
from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from tests.distributed.launcher import main

DEVICES = ("cpu", "neuron")


def setup(backend="cpu:gloo,neuron:neuron"):
    rank = int(os.environ["RANK"])
    torch.neuron.set_device(rank % torch.neuron.device_count())
    if backend is not None:
        dist.init_process_group(backend)
    return rank, int(os.environ["WORLD_SIZE"])


def cpu(v):
    """A result on CPU: tensors (DTensors as their full value) in nested containers."""
    from torch.distributed.tensor import DTensor

    if isinstance(v, DTensor):
        v = v.full_tensor()
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().clone()
    if isinstance(v, dict):
        return {k: cpu(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(cpu(x) for x in v)
    return v


def pairs(out, name, by_device):
    """Adds the (neuron, cpu) pair of every key of two same-keyed dicts."""
    got, ref = by_device["neuron"], by_device["cpu"]
    assert got.keys() == ref.keys(), (sorted(got), sorted(ref))
    for k in ref:
        out[f"{name}-{k}"] = (got[k], ref[k])


# ---------------------------------------------------------------------------
# A small transformer-ish MLP: residual pre-norm MLP blocks, a head with an
# odd number of rows (FSDP pads its shards).

D_IN, D, HIDDEN, CLASSES = 12, 16, 32, 9


class Block(nn.Module):
    def __init__(self, d=D, hidden=HIDDEN):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.inp = nn.Linear(D_IN, D)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, CLASSES)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


def make_net(seed=0):
    torch.manual_seed(seed)
    return Net()


def batch(rank, step, batch_size=4, seq=6):
    g = torch.Generator().manual_seed(100 * rank + step)
    x = torch.randn(batch_size, seq, D_IN, generator=g)
    y = torch.randint(0, CLASSES, (batch_size, seq), generator=g)
    return x, y


def loss_fn(logits, y):
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


# ---------------------------------------------------------------------------
# FSDP2


class ReduceOpLog:
    """Records the reduce op of every reduce-scatter FSDP issues (its choice
    depends on reduce dtype, divide factor and device type, not the backend)."""

    def __init__(self):
        self.ops = set()
        self._orig = dist.reduce_scatter_single

    def __enter__(self):
        def logged(*args, op=dist.ReduceOp.SUM, **kwargs):
            self.ops.add(getattr(op, "op", op).name)
            return self._orig(*args, op=op, **kwargs)

        dist.reduce_scatter_single = logged
        return self

    def __exit__(self, *exc):
        dist.reduce_scatter_single = self._orig


def fsdp_train(dev, mesh, rank, steps=3, mp=None, reshard=True, force_sum=False,
               divide=None):
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    kw = dict(mesh=mesh, reshard_after_forward=reshard, mp_policy=mp or MixedPrecisionPolicy())
    model = make_net().to(dev)
    for b in model.blocks:
        fully_shard(b, **kw)
    fully_shard(model, **kw)
    for m in model.modules():  # these setters apply to one FSDP module's groups
        if isinstance(m, FSDPModule):
            if divide is not None:
                m.set_gradient_divide_factor(divide)
            if force_sum:
                m.set_force_sum_reduction_for_comms(True)
    seen = {}

    def record_dtypes(m, args):  # the unsharded parameter and input the Linear computes in
        seen.setdefault("dtype", (str(m.weight.dtype), str(args[0].dtype)))

    model.blocks[0].up.register_forward_pre_hook(record_dtypes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    res = {}
    with ReduceOpLog() as log:
        for step in range(steps):
            x, y = batch(rank, step)
            loss = loss_fn(model(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
            opt.zero_grad()
            res[f"step{step}-loss"] = cpu(loss)
            for n, p in model.named_parameters():
                res[f"step{step}-{n}"] = cpu(p)  # full_tensor(): an all-gather
    # The sharding itself: each rank holds its own dim-0 shard.
    res["local-head.weight"] = cpu(model.head.weight.to_local())
    res["compute-dtype"] = seen["dtype"]
    res["param-dtype"] = str(model.head.weight.dtype)
    return res, sorted(log.ops)


FSDP_CONFIGS = {
    "fp32-reshard": dict(reshard=True),
    "fp32-keep": dict(reshard=False),
    # SUM reduce-scatter, then a divide by 2 on the device.
    "fp32-force-sum": dict(reshard=True, force_sum=True),
    # A divide factor other than the group size: FSDP uses PREMUL_SUM(1/4),
    # which Gloo lacks (RuntimeError), so the CPU reference forces SUM and
    # divides by 4 after. For a power-of-2 factor these are the same bits:
    # scaling by 2^-k is exact and commutes with the rounding of the sum
    # (barring under/overflow, far from these values).
    "fp32-divide4": dict(reshard=True, divide=4.0, cpu_force_sum=True),
    "bf16-reshard": dict(reshard=True, mp="bf16"),
    "bf16-keep": dict(reshard=False, mp="bf16"),
}


def fsdp():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    rank, world = setup()
    names = os.environ.get("FSDP_CONFIGS", ",".join(FSDP_CONFIGS)).split(",")
    out = {}
    meshes = {dev: init_device_mesh(dev, (world,)) for dev in DEVICES}
    for name in names:
        by_dev = {}
        for dev in DEVICES:
            cfg = dict(FSDP_CONFIGS[name])
            if cfg.get("mp") == "bf16":
                cfg["mp"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                 reduce_dtype=torch.float32)
            if cfg.pop("cpu_force_sum", False) and dev == "cpu":
                cfg["force_sum"] = True
            by_dev[dev], out[f"{name}-reduce-ops-{dev}"] = fsdp_train(
                dev, meshes[dev], rank, **cfg)
        pairs(out, name, by_dev)
    dist.destroy_process_group()
    return out


# ---------------------------------------------------------------------------
# DTensor and tensor parallel


class MLP(nn.Module):
    def __init__(self, d=D, hidden=HIDDEN):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.w1 = nn.Linear(d, hidden)
        self.w2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(self.norm(x))))


def dtensor_cases(dev, mesh, rank, world):
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module)

    res = {}
    # Each rank starts from different data: with src_data_rank=0 rank 0's wins.
    g = torch.Generator().manual_seed(7 + rank)
    full = torch.randn(6, 5, generator=g).to(dev)
    for pname, placement in [("shard0", Shard(0)), ("shard1-uneven", Shard(1)),
                             ("replicate", Replicate())]:
        for src in (0, None):
            d = distribute_tensor(full, mesh, [placement], src_data_rank=src)
            res[f"distribute-{pname}-src{src}-local"] = cpu(d.to_local())
            res[f"distribute-{pname}-src{src}-full"] = cpu(d.full_tensor())

    x = distribute_tensor(full, mesh, [Shard(0)], src_data_rank=0)
    for name, target in [("to-replicate", [Replicate()]), ("to-shard1", [Shard(1)])]:
        res[f"redistribute-shard0-{name}"] = cpu(x.redistribute(mesh, target).to_local())
    r = distribute_tensor(full, mesh, [Replicate()], src_data_rank=0)
    res["redistribute-replicate-to-shard1"] = cpu(r.redistribute(mesh, [Shard(1)]).to_local())
    partial_local = torch.randn(4, 6, generator=g).to(dev)  # differs by rank
    for op in ("sum", "avg", "max"):
        p = DTensor.from_local(partial_local, mesh, [Partial(op)])
        res[f"redistribute-partial-{op}-to-replicate"] = cpu(
            p.redistribute(mesh, [Replicate()]).to_local())
        res[f"redistribute-partial-{op}-to-shard0"] = cpu(
            p.redistribute(mesh, [Shard(0)]).to_local())
    # DTensor ops: a sharded matmul (all-gather / reduce under the hood).
    a = distribute_tensor(full, mesh, [Shard(1)], src_data_rank=0)
    b = distribute_tensor(full.t().contiguous(), mesh, [Shard(0)], src_data_rank=0)
    res["dtensor-matmul"] = cpu(torch.mm(a, b))
    res["dtensor-sum"] = cpu(a.sum())

    # Tensor parallel: Colwise + Rowwise on replicated input.
    torch.manual_seed(3)
    base = MLP()
    xin = torch.randn(2, 4, D, generator=torch.Generator().manual_seed(11))  # same on all ranks
    tp = parallelize_module(copy.deepcopy(base).to(dev), mesh,
                            {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    inp = xin.clone().to(dev).requires_grad_()
    out = tp(inp)
    out.square().mean().backward()
    res["tp-out"] = cpu(out)
    res["plain-out"] = cpu(copy.deepcopy(base).to(dev)(xin.to(dev)))  # sanity: TP computes the module
    res["tp-input-grad"] = cpu(inp.grad)
    for n, p in tp.named_parameters():
        res[f"tp-grad-{n}"] = cpu(p.grad)
        res[f"tp-grad-{n}-local"] = cpu(p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad)

    # Sequence parallel: the norm on the sequence shard, Colwise from Shard(1),
    # Rowwise back to Shard(1) (all-gather in, reduce-scatter out).
    sp = parallelize_module(copy.deepcopy(base).to(dev), mesh, {
        "norm": SequenceParallel(),
        "w1": ColwiseParallel(input_layouts=Shard(1)),
        "w2": RowwiseParallel(output_layouts=Shard(1)),
    })
    seq_local = xin.chunk(world, dim=1)[rank].clone().to(dev).requires_grad_()
    out = sp(seq_local)
    out.square().mean().backward()
    res["sp-out-local"] = cpu(out)
    res["sp-input-grad"] = cpu(seq_local.grad)
    for n, p in sp.named_parameters():
        res[f"sp-grad-{n}"] = cpu(p.grad)
    return res


def dtensor():
    from torch.distributed.device_mesh import init_device_mesh

    from torch.distributed.device_mesh import DeviceMesh

    rank, world = setup(backend=None)
    # init_device_mesh("neuron") makes the default group itself. With no
    # backend named, torch 2.14 maps only the current accelerator's device
    # (BackendConfig for "undefined"): the group is "neuron:neuron".
    nmesh = init_device_mesh("neuron", (world,))
    config = dist.get_backend_config()
    out = {"backend": (config, "neuron:neuron"),
           "mesh": ((nmesh.device_type, nmesh.size(), nmesh.get_coordinate()),
                    ("neuron", world, [rank]))}
    t = torch.full((3,), float(rank + 1), device="neuron")
    dist.all_reduce(t, group=nmesh.get_group())
    out["mesh-group-all_reduce"] = (t.cpu(), torch.full((3,), float(world * (world + 1) // 2)))
    # The reference runs on a Gloo group of the same ranks.
    gloo = dist.new_group(backend="gloo")
    meshes = {"neuron": nmesh, "cpu": DeviceMesh.from_group(gloo, "cpu")}
    pairs(out, "dt", {dev: dtensor_cases(dev, meshes[dev], rank, world) for dev in DEVICES})
    dist.destroy_process_group()
    return out


# ---------------------------------------------------------------------------
# Pipeline parallel: 2 stages, manual split, GPipe and 1F1B.


def pipeline_model():
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(D_IN, D), nn.GELU(), nn.Linear(D, D), nn.Tanh(),
                         nn.Linear(D, D), nn.GELU(), nn.Linear(D, CLASSES))


def pipeline_batch(step):
    g = torch.Generator().manual_seed(50 + step)  # the same batch on every rank
    return torch.randn(8, D_IN, generator=g), torch.randint(0, CLASSES, (8,), generator=g)


def pipeline_plain(microbatches=4):
    """The first step without a pipeline (one process, CPU): the reference's sanity."""
    model = pipeline_model()
    x, y = pipeline_batch(0)
    losses = []
    for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)):
        loss = F.cross_entropy(model(xm), ym)
        (loss / microbatches).backward()
        losses.append(loss.detach())
    return {"losses": torch.stack(losses),
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def pipeline_run(dev, rank, world, schedule_cls, microbatches=4, steps=2):
    from torch.distributed.pipelining import PipelineStage

    full = pipeline_model()
    part = (full[:4] if rank == 0 else full[4:]).to(dev)
    stage = PipelineStage(part, stage_index=rank, num_stages=world, device=torch.device(dev))
    sched = schedule_cls(stage, n_microbatches=microbatches,
                         loss_fn=lambda out, y: F.cross_entropy(out, y))
    opt = torch.optim.SGD(part.parameters(), lr=0.1)
    res = {}
    for step in range(steps):
        x, y = pipeline_batch(step)
        losses = []
        if rank == 0:
            sched.step(x.to(dev))
        else:
            output = sched.step(target=y.to(dev), losses=losses)
            res[f"step{step}-output"] = cpu(output)
            res[f"step{step}-losses"] = cpu(torch.stack(losses))
        for n, p in part.named_parameters():
            res[f"step{step}-grad-{n}"] = cpu(p.grad)
        opt.step()
        opt.zero_grad()
    for n, p in part.named_parameters():
        res[f"param-{n}"] = cpu(p)
    return res


def pipeline():
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    rank, world = setup()
    out = {"plain": pipeline_plain()}
    for cls in (ScheduleGPipe, Schedule1F1B):
        pairs(out, cls.__name__, {dev: pipeline_run(dev, rank, world, cls) for dev in DEVICES})
    dist.destroy_process_group()
    return out


# ---------------------------------------------------------------------------
# Distributed checkpoint: save a sharded FSDP2 model + AdamW state on 2 ranks,
# load it on 1 rank (unsharded) and on 4 ranks (resharded).


def _state(model, opt):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def _fsdp_model(dev, mesh, seed):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = Net().to(dev)
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def dcp_save():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = setup()
    ckpt = Path(os.environ["CKPT_DIR"])
    out, full = {}, {}
    for dev in DEVICES:
        mesh = init_device_mesh(dev, (world,))
        model = _fsdp_model(dev, mesh, seed=0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step in range(2):
            x, y = batch(rank, step)
            loss_fn(model(x.to(dev)), y.to(dev)).backward()
            opt.step()
            opt.zero_grad()
        state = _state(model, opt)
        dcp.save(state, checkpoint_id=str(ckpt / dev))
        full[dev] = flatten(cpu(state))
    pairs(out, "saved", full)
    out["full"] = full["neuron"]
    dist.destroy_process_group()
    return out


def flatten(d, prefix=""):
    """{"a": {"b": t}} -> {"a.b": t} (optimizer state dicts nest)."""
    flat = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(flatten(v, key + "."))
        elif isinstance(v, (list, tuple)):
            flat.update(flatten(dict(enumerate(v)), key + "."))
        else:
            flat[key] = v
    return flat


def dcp_load():
    """Loads the neuron checkpoint on WORLD_SIZE ranks: sharded if > 1, else plain."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = setup()
    ckpt = Path(os.environ["CKPT_DIR"]) / "neuron"
    if world > 1:
        model = _fsdp_model("neuron", init_device_mesh("neuron", (world,)), seed=1)
    else:
        torch.manual_seed(1)
        model = Net().to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = _state(model, opt)  # initializes the optimizer state to load into
    dcp.load(state, checkpoint_id=str(ckpt))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    loaded = flatten(cpu(_state(model, opt)))  # read back from the model/optimizer
    result = {"loaded": loaded}
    if world > 1:
        result["local-head.weight"] = model.head.weight.to_local().cpu()
    # One more step from the loaded state works (the state is usable).
    x, y = batch(rank, 9)
    loss = loss_fn(model(x.to("neuron")), y.to("neuron"))
    loss.backward()
    opt.step()
    result["loss-after-load"] = loss.item()
    dist.destroy_process_group()
    return result


# ---------------------------------------------------------------------------
# 2-D mesh: FSDP over "dp" x tensor parallel over "tp" (4 processes).


def fsdp_tp_2d():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, parallelize_module)

    rank, world = setup()
    assert world == 4, world
    by_dev = {}
    for dev in DEVICES:
        mesh = init_device_mesh(dev, (2, 2), mesh_dim_names=("dp", "tp"))
        dp, tp = mesh["dp"], mesh["tp"]
        model = make_net().to(dev)
        for b in model.blocks:
            parallelize_module(b, tp, {"up": ColwiseParallel(), "down": RowwiseParallel()})
            fully_shard(b, mesh=dp)
        fully_shard(model, mesh=dp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        res = {}
        dp_rank = dp.get_local_rank()
        for step in range(2):
            x, y = batch(dp_rank, step)  # the same batch within a tp group
            loss = loss_fn(model(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
            opt.zero_grad()
            res[f"step{step}-loss"] = cpu(loss)
            for n, p in model.named_parameters():
                res[f"step{step}-{n}"] = cpu(p)
        res["placements-up.weight"] = str(model.blocks[0].up.weight.placements)
        by_dev[dev] = res
    out = {}
    pairs(out, "2d", by_dev)
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    main()
