"""Workers for the collective matrix: each collective on neuron tensors (the
"neuron" backend) and the same collective on CPU tensors (Gloo), in one
group "cpu:gloo,neuron:neuron"; results come back as (neuron, reference)."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from tests.distributed.launcher import main

R = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
DTYPES = FLOATS + INTS + [torch.bool]


def setup(backend="cpu:gloo,neuron:neuron", **kwargs):
    rank = int(os.environ["RANK"])
    torch.neuron.set_device(rank % torch.neuron.device_count())
    dist.init_process_group(backend, **kwargs)
    return rank, dist.get_world_size()


def data(shape, dtype, rank, salt=0, small=False):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    lo, hi = (1, 3) if small else (0, 50)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def nrn(t):
    return t.to("neuron")


def both(fn, *cpu_args):
    """Runs fn on CPU tensors and on neuron copies; returns (neuron, cpu) results on CPU."""
    ref = fn(*[[a.clone() for a in x] if isinstance(x, list) else x.clone() for x in cpu_args])
    got = fn(*[[nrn(a) for a in x] if isinstance(x, list) else nrn(x) for x in cpu_args])
    conv = lambda v: [conv(x) for x in v] if isinstance(v, (list, tuple)) else v.cpu()
    return conv(got), conv(ref)


def matrix():
    rank, world = setup()
    out = {}
    for async_op in (False, True):
        def done(w):
            if async_op:
                w.wait()

        for dtype in DTYPES:
            tag = f"{dtype}-{'async' if async_op else 'sync'}"
            ops = [R.SUM, R.MIN, R.MAX, R.PRODUCT]
            if dtype in INTS or dtype == torch.bool:
                ops += [R.BAND, R.BOR, R.BXOR]
            for op in ops:
                if dtype == torch.bool and op in (R.SUM, R.PRODUCT):
                    continue
                def ar(t, op=op):
                    done(dist.all_reduce(t, op=op, async_op=async_op))
                    return t
                out[f"all_reduce-{op}-{tag}"] = both(
                    ar, data((5, 7), dtype, rank, small=op == R.PRODUCT))

            def bc(t):
                done(dist.broadcast(t, src=1, async_op=async_op))
                return t
            out[f"broadcast-{tag}"] = both(bc, data((33,), dtype, rank))

            if dtype != torch.bool:
                def rd(t):
                    done(dist.reduce(t, dst=0, async_op=async_op))
                    return t if rank == 0 else t[:0]
                out[f"reduce-{tag}"] = both(rd, data((9,), dtype, rank))

            def ag(t):
                outs = [torch.empty_like(t) for _ in range(world)]
                done(dist.all_gather(outs, t, async_op=async_op))
                return outs
            out[f"all_gather-{tag}"] = both(ag, data((4, 3), dtype, rank))

            def agt(t):
                o = t.new_empty((world * t.shape[0],) + t.shape[1:])
                done(dist.all_gather_into_tensor(o, t, async_op=async_op))
                return o
            out[f"all_gather_into_tensor-{tag}"] = both(agt, data((3, 5), dtype, rank))

            if dtype != torch.bool:
                def rst(t):
                    o = t.new_empty((t.shape[0] // world,) + t.shape[1:])
                    done(dist.reduce_scatter_tensor(o, t, async_op=async_op))
                    return o
                out[f"reduce_scatter_tensor-{tag}"] = both(rst, data((4, 3), dtype, rank))

                def rs(ts):
                    o = torch.empty_like(ts[0])
                    done(dist.reduce_scatter(o, ts, async_op=async_op))
                    return o
                out[f"reduce_scatter-{tag}"] = both(
                    rs, [data((6,), dtype, rank, salt=i) for i in range(world)])

            def a2a_single(t):
                # Uneven splits: rank r sends r + i + 1 rows to rank i.
                ins = [rank + i + 1 for i in range(world)]
                outs = [i + rank + 1 for i in range(world)]
                o = t.new_empty((sum(outs),) + t.shape[1:])
                done(dist.all_to_all_single(o, t[: sum(ins)], outs, ins, async_op=async_op))
                return o
            out[f"all_to_all_single-{tag}"] = both(a2a_single, data((8, 2), dtype, rank))

            def a2a(ts):
                outs = [torch.empty_like(t) for t in ts]
                done(dist.all_to_all(outs, ts, async_op=async_op))
                return outs
            out[f"all_to_all-{tag}"] = both(a2a, [data((3,), dtype, rank, salt=i) for i in range(world)])

            def gather(t):
                outs = [torch.empty_like(t) for _ in range(world)] if rank == 0 else None
                done(dist.gather(t, outs, dst=0, async_op=async_op))
                return outs or []
            out[f"gather-{tag}"] = both(gather, data((5,), dtype, rank))

            def scatter(ts):
                o = torch.empty_like(ts[0])
                done(dist.scatter(o, ts if rank == 1 else None, src=1, async_op=async_op))
                return o
            out[f"scatter-{tag}"] = both(scatter, [data((4,), dtype, rank, salt=i) for i in range(world)])

        for dtype in FLOATS:
            tag = f"{dtype}-{'async' if async_op else 'sync'}"
            x = data((6, 5), dtype, rank)
            # AVG and PREMUL_SUM: Gloo has neither; the reference is their definition
            # computed with Gloo's SUM on CPU tensors.
            t = nrn(x)
            done(dist.all_reduce(t, op=R.AVG, async_op=async_op))
            ref = x.clone()
            dist.all_reduce(ref)
            out[f"all_reduce-AVG-{tag}"] = (t.cpu(), ref.div_(world))
            for factor in (0.25, torch.tensor(3.0, dtype=torch.float32, device="neuron")):
                t = nrn(x)
                done(dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor), async_op=async_op))
                f = factor.item() if isinstance(factor, torch.Tensor) else factor
                ref = x.clone().mul_(f)
                dist.all_reduce(ref)
                out[f"all_reduce-PREMUL_SUM({type(factor).__name__})-{tag}"] = (t.cpu(), ref)
            big = data((4, 3), dtype, rank)
            o = torch.empty((2, 3), dtype=dtype, device="neuron")
            done(dist.reduce_scatter_tensor(o, nrn(big), op=R.AVG, async_op=async_op))
            ref = torch.empty((2, 3), dtype=dtype)
            dist.reduce_scatter_tensor(ref, big.clone())
            out[f"reduce_scatter_tensor-AVG-{tag}"] = (o.cpu(), ref.div_(world))
            o = torch.empty((2, 3), dtype=dtype, device="neuron")
            src = nrn(big)
            done(dist.reduce_scatter_tensor(o, src, op=dist._make_nccl_premul_sum(0.5),
                                            async_op=async_op))
            ref = torch.empty((2, 3), dtype=dtype)
            dist.reduce_scatter_tensor(ref, big.clone().mul_(0.5))
            out[f"reduce_scatter_tensor-PREMUL_SUM-{tag}"] = (o.cpu(), ref)
            out[f"reduce_scatter_tensor-PREMUL_SUM-input-kept-{tag}"] = (src.cpu(), big)
    dist.destroy_process_group()
    return out


def point_to_point():
    rank, world = setup()
    peer = 1 - rank
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        x = data((17,), dtype, rank)
        # Blocking send/recv, in the order that pairs them.
        def sendrecv(t):
            r = torch.empty_like(t)
            if rank == 0:
                dist.send(t, peer)
                dist.recv(r, peer)
            else:
                dist.recv(r, peer)
                dist.send(t, peer)
            return r
        out[f"send_recv-{dtype}"] = both(sendrecv, x)

        # Both ranks isend first, then irecv: must not deadlock.
        def isend_irecv(t):
            r = torch.empty_like(t)
            a = dist.isend(t, peer)
            b = dist.irecv(r, peer)
            a.wait()
            b.wait()
            return r
        out[f"isend_irecv-{dtype}"] = both(isend_irecv, x)

        def batch(t):
            r1, r2 = torch.empty_like(t), torch.empty_like(t)
            ops = [dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, r1, peer),
                   dist.P2POp(dist.isend, t * 2, peer), dist.P2POp(dist.irecv, r2, peer)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            return [r1, r2]
        out[f"batch_isend_irecv-{dtype}"] = both(batch, x)
    dist.destroy_process_group()
    return out


def groups_and_functional():
    rank, world = setup()
    out = {}
    # A subgroup (new_group) and the coalesced forms.
    sub = dist.new_group([0, 1])
    x = data((10,), torch.float32, rank)
    def sub_ar(t):
        dist.all_reduce(t, group=sub)
        return t
    out["new_group-all_reduce"] = both(sub_ar, x)

    def coalesced(ts):
        with dist._coalescing_manager(async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t)
        cm.wait()
        return ts
    out["coalescing_manager-all_reduce"] = both(
        coalesced, [data((n,), torch.float32, rank, salt=n) for n in (3, 5, 7)])

    def ar_coalesced(ts):
        dist.all_reduce_coalesced(ts)
        return ts
    out["all_reduce_coalesced"] = both(ar_coalesced, [data((n,), torch.float32, rank, salt=n) for n in (2, 4)])

    # Functional collectives, eager (traceable) ...
    def f_ar(t):
        return funcol.wait_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD))
    out["funcol-all_reduce"] = both(f_ar, x)

    def f_ag(t):
        return funcol.all_gather_tensor(t, 0, dist.group.WORLD).wait()
    out["funcol-all_gather_tensor"] = both(f_ag, data((2, 3), torch.float32, rank))

    def f_rs(t):
        return funcol.reduce_scatter_tensor(t, "sum", 0, dist.group.WORLD).wait()
    out["funcol-reduce_scatter_tensor"] = both(f_rs, data((4, 3), torch.float32, rank))

    # ... and under torch.compile (Inductor: the collective is an extern call).
    def step(t):
        y = funcol.all_reduce(t * 2 + 1, "sum", dist.group.WORLD)
        return funcol.wait_tensor(y).relu()
    compiled = torch.compile(step, fullgraph=True)
    out["funcol-compiled-all_reduce"] = both(compiled, data((16,), torch.float32, rank))

    # Object collectives ride on uint8 tensors of the group's device.
    objs = [None, None]
    dist.all_gather_object(objs, {"rank": rank, "v": [rank] * 3})
    out["all_gather_object"] = (objs, [{"rank": r, "v": [r] * 3} for r in range(world)])
    dist.destroy_process_group()
    return out


def neuron_only_backend():
    """init_process_group("neuron"): one backend for neuron and CPU tensors;
    split_group (which needs the group bound to a device)."""
    rank, world = setup("neuron", device_id=torch.device("neuron", int(os.environ["RANK"]) % 2))
    out = {}
    c = torch.tensor([float(rank + 1)])
    dist.all_reduce(c)
    out["cpu-tensor"] = (c, torch.tensor([3.0]))
    n = torch.full((3,), float(rank + 1), device="neuron")
    dist.all_reduce(n)
    out["neuron-tensor"] = (n.cpu(), torch.full((3,), 3.0))
    out["backend"] = (dist.get_backend(), "neuron")
    # A CPU-tensor call made while a device collective of the group is still
    # queued (rank 0's stream is busy) reaches Gloo after it on every rank.
    x = torch.full((4096,), float(rank + 1), device="neuron")
    gathered = torch.empty(2 * 4096, device="neuron")
    if rank == 0:
        torch.neuron._sleep(300)
    w = dist.all_gather_into_tensor(gathered, x, async_op=True)
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([rank + 10]))
    w.wait()
    out["cpu-after-queued-device"] = (sizes, [torch.tensor([10]), torch.tensor([11])])
    out["device-before-cpu"] = (gathered[::4096].cpu(), torch.tensor([1.0, 2.0]))
    # Coalesced CPU-tensor calls: the group's work waits for all of them.
    cpu = [torch.full((n,), float(rank + 1)) for n in (3, 4)]
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for t in cpu:
            dist.all_reduce(t)
    cm.wait()
    out["cpu-coalesced"] = (cpu, [torch.full((n,), 3.0) for n in (3, 4)])
    # Split into singletons, and into one group of both.
    alone = dist.split_group(split_ranks=[[0], [1]])
    a = torch.full((2,), float(rank + 1), device="neuron")
    dist.all_reduce(a, group=alone)
    out["split_group-singletons"] = (a.cpu(), torch.full((2,), float(rank + 1)))
    pair = dist.split_group(split_ranks=[[1, 0]])
    b = torch.full((2,), float(rank + 1), device="neuron")
    dist.all_reduce(b, group=pair)
    out["split_group-pair"] = (b.cpu(), torch.full((2,), 3.0))
    out["split_group-pair-rank"] = (dist.get_rank(pair), 1 - rank)
    dist.barrier()
    dist.destroy_process_group()
    return out


def stream_semantics():
    """A collective follows the work queued on the current stream, without the host waiting."""
    rank, world = setup()
    out = {}
    # Two rounds; in round k, rank k's device reaches the collective 0.5 s
    # before its peer's, so its collective cannot finish before the op queued
    # behind it (an op that reads the collective's tensor before wait() races
    # with it, as on CUDA; only the early rank's reading is determined).
    for early in range(world):
        x = torch.full((1024,), float(rank + 1), device="neuron")
        torch.neuron.synchronize()
        dist.barrier()
        torch.neuron._sleep(1000 if rank == early else 1500)  # device work ahead of the collective
        x.mul_(2)                  # ... and an op whose result the collective must see
        t0 = time.perf_counter()
        work = dist.all_reduce(x, async_op=True)
        before = x + 0             # queued before wait(): does not wait for the collective
        work.wait()                # a stream wait: the host does not block
        y = x + 1                  # after wait(): sees the reduced value
        host = time.perf_counter() - t0
        out[f"host_seconds-{early}"] = host
        out[f"value-{early}"] = (y.cpu(), torch.full((1024,), 2.0 * (1 + 2) + 1))
        if rank == early:
            out["before_wait"] = (before.cpu(), torch.full((1024,), 2.0 * (rank + 1)))
        torch.neuron.synchronize()
    # The future's value is the output tensors, and waiting on it is a stream wait too.
    z = torch.full((8,), float(rank), device="neuron")
    fut = dist.all_reduce(z, async_op=True).get_future()
    vals = fut.wait()
    out["future"] = (vals[0].cpu(), torch.full((8,), 1.0))
    # The collective is visible as device work: op tracking, and the profiler's
    # device timeline (a work item on the group's stream, with its bytes).
    import torchneuron
    from torch.profiler import ProfilerActivity, profile
    ops = torchneuron.get_op_paths()
    out["tracked"] = sorted(k for k in ops if k.startswith("c10d::"))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        w = torch.ones(256, device="neuron")
        dist.all_reduce(w)
        torch.neuron.synchronize()
    out["profiled"] = sorted({e.name for e in prof.events()
                              if e.name.startswith("c10d::") and e.device_type.name != "CPU"})
    dist.destroy_process_group()
    return out


def dead_peer():
    """Rank 1 exits before a collective: rank 0 raises within the group's timeout."""
    import datetime

    rank = int(os.environ["RANK"])
    torch.neuron.set_device(rank % torch.neuron.device_count())
    dist.init_process_group("cpu:gloo,neuron:neuron", timeout=datetime.timedelta(seconds=5))
    x = torch.ones(4, device="neuron")
    dist.all_reduce(x)
    torch.neuron.synchronize()
    if rank == 1:
        os._exit(3)
    t0 = time.perf_counter()
    err = None
    try:
        dist.all_reduce(x)
        x.cpu()  # the failure surfaces at the next synchronizing call
    except RuntimeError as e:
        err = str(e)
    elapsed = time.perf_counter() - t0
    # The device keeps working.
    ok = (torch.ones(3, device="neuron") * 2).cpu().tolist() == [2.0, 2.0, 2.0]
    return {"error": err, "seconds": elapsed, "device_ok": ok, "agreement": agreement_path()}


def mismatch():
    """Ranks that pass different sizes or dtypes get an error on every rank,
    before any transfer (Gloo itself would abort the process), and the
    group keeps working."""
    rank, world = setup()
    out = {}
    cases = {
        "all_reduce-sizes": lambda: dist.all_reduce(torch.ones(4 + rank, device="neuron")),
        "all_reduce-dtypes": lambda: dist.all_reduce(
            torch.ones(4, device="neuron", dtype=torch.float32 if rank else torch.float64)),
        "broadcast-roots": lambda: dist.broadcast(torch.ones(4, device="neuron"), src=rank),
        "all_gather_into_tensor-sizes": lambda: dist.all_gather_into_tensor(
            torch.empty(2 * (3 + rank), device="neuron"), torch.ones(3 + rank, device="neuron")),
    }
    for name, call in cases.items():
        err = None
        try:
            call()
            torch.neuron.synchronize()
        except RuntimeError as e:
            err = str(e)
        out[name] = err
    ok = torch.full((5,), float(rank + 1), device="neuron")
    dist.all_reduce(ok)
    out["after"] = (ok.cpu(), torch.full((5,), 3.0))
    out["agreement"] = agreement_path()
    dist.destroy_process_group()
    return out


def shm_data():
    """Collectives whose data goes through shared memory (both ranks on this
    machine), at sizes that take several staging chunks and end in a partial
    one, against Gloo on CPU tensors, bit for bit."""
    rank, world = setup()
    out = {"data_path": dist.group.WORLD._get_backend(torch.device("neuron")).data_path}
    chunk = 1 << 20  # SharedMemoryTransport::kChunkBytes
    for dtype in (torch.float32, torch.bfloat16, torch.float64, torch.int32, torch.int8):
        n = 2 * chunk // torch.empty((), dtype=dtype).element_size() + 1237
        ops = [R.SUM, R.PRODUCT] + ([R.MIN, R.MAX, R.BXOR] if not dtype.is_floating_point else [])
        for op in ops:
            def ar(t, op=op):
                dist.all_reduce(t, op=op)
                return t
            out[f"all_reduce-{op}-{dtype}"] = both(ar, data((n,), dtype, rank, small=op == R.PRODUCT))
        if dtype.is_floating_point:
            def avg(t):
                dist.all_reduce(t, op=R.SUM)
                return t / world
            got = data((n,), dtype, rank).to("neuron")
            dist.all_reduce(got, op=R.AVG)
            out[f"all_reduce-avg-{dtype}"] = (got.cpu(), avg(data((n,), dtype, rank)))

        def bc(t):
            dist.broadcast(t, src=1)
            return t
        out[f"broadcast-{dtype}"] = both(bc, data((n,), dtype, rank, salt=1))

        def ag(t):
            o = torch.empty(world * n, dtype=dtype, device=t.device)
            dist.all_gather_into_tensor(o, t)
            return o
        out[f"all_gather_into_tensor-{dtype}"] = both(ag, data((n,), dtype, rank, salt=2))

        def ag_in_place(t):
            # FSDP2's way: the input is this rank's part of the output.
            o = torch.zeros(world * n, dtype=dtype, device=t.device)
            part = o[rank * n:(rank + 1) * n]
            part.copy_(t)
            dist.all_gather_into_tensor(o, part)
            return o
        out[f"all_gather_into_tensor-in_place-{dtype}"] = both(ag_in_place, data((n,), dtype, rank, salt=3))

        def ag_list(t):
            outs = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(outs, t)
            return outs
        out[f"all_gather-{dtype}"] = both(ag_list, data((n,), dtype, rank, salt=4))

        def rs(t):
            o = torch.empty(n, dtype=dtype, device=t.device)
            dist.reduce_scatter_tensor(o, t)
            return o
        out[f"reduce_scatter_tensor-{dtype}"] = both(rs, data((world * n,), dtype, rank, salt=5))

        # Several tensors, queued back to back: every chunk of every one in step.
        def many(t):
            parts = list(t.split([7, n, 3 * n // 2]))
            works = [dist.all_reduce(p, async_op=True) for p in parts]
            for w in works:
                w.wait()
            return parts
        out[f"all_reduce-many-{dtype}"] = both(many, data((7 + n + 3 * n // 2,), dtype, rank, salt=6))
    torch.neuron.synchronize()
    out["carried"] = dist.group.WORLD._get_backend(torch.device("neuron")).shared_memory_collectives
    dist.destroy_process_group()
    return out


def agreement_path():
    """How the default group's neuron backend checks agreement."""
    return dist.group.WORLD._get_backend(torch.device("neuron")).agreement


def hung_peer():
    """Rank 1 stops taking part (alive, silent): rank 0 raises after the 5 s timeout."""
    import datetime

    rank = int(os.environ["RANK"])
    torch.neuron.set_device(rank % torch.neuron.device_count())
    dist.init_process_group("cpu:gloo,neuron:neuron", timeout=datetime.timedelta(seconds=5))
    x = torch.ones(4, device="neuron")
    dist.all_reduce(x)
    torch.neuron.synchronize()
    if rank == 1:
        time.sleep(15)
        os._exit(0)
    t0 = time.perf_counter()
    err = None
    try:
        dist.all_reduce(x)
        torch.neuron.synchronize()
    except RuntimeError as e:
        err = str(e)
    elapsed = time.perf_counter() - t0
    ok = (torch.ones(3, device="neuron") * 2).cpu().tolist() == [2.0, 2.0, 2.0]
    return {"error": err, "seconds": elapsed, "device_ok": ok, "agreement": agreement_path()}


def detail_debug():
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps the backend in its
    checking wrapper: collectives still give Gloo-CPU's results, and the
    wrapper's own fingerprint check catches a mismatch."""
    rank, world = setup()
    out = {}
    for dev in ("neuron", "cpu"):
        x = data((6,), torch.float32, rank).to(dev)
        dist.all_reduce(x)
        g = torch.empty(2 * 6, device=dev)
        dist.all_gather_into_tensor(g, x)
        b = data((3,), torch.float32, rank, salt=1).to(dev)
        dist.broadcast(b, src=1)
        dist.barrier()
        out[dev] = [x.cpu(), g.cpu(), b.cpu()]
    for i, (n, c) in enumerate(zip(out.pop("neuron"), out.pop("cpu"))):
        out[f"result{i}"] = (n, c)
    try:
        dist.all_reduce(torch.ones(4 + rank, device="neuron"))
        torch.neuron.synchronize()
        out["mismatch"] = None
    except RuntimeError as e:
        out["mismatch"] = str(e)
    ok = torch.full((5,), float(rank + 1), device="neuron")
    dist.all_reduce(ok)
    out["after"] = (ok.cpu(), torch.full((5,), 3.0))
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    main()
