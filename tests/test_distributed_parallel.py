"""The parallelism layers on the neuron backend: FSDP2, DTensor / tensor and
sequence parallel, pipelining, distributed checkpoint, a 2-D mesh.

Each worker (tests/distributed/parallel.py) runs the same script on CPU
tensors over Gloo (the reference) and on neuron tensors over the "neuron"
backend in one process, and the two must agree bit for bit: the device runs
CPU's own kernels and the backend carries Gloo's own algorithms. Each launch
is a set of real processes bounded by a timeout.

The 4-process launches (the DCP load resharded onto 4 ranks, the 2-D mesh
FSDP x TP) take about a minute each on a 2-core machine, mostly four
interpreters importing torch: they are marked ``slow_distributed`` and run
only when selected (``pytest -m slow_distributed``) or with
NEURON_SLOW_DISTRIBUTED=1.
"""
import os

import pytest
import torch

from conftest import LAUNCH_BLOCKING, plain_pass_only

from tests.distributed.launcher import run_ranks

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch without distributed/Gloo")

TIMEOUT = 300


def same(a, b):
    """Bitwise equality (dtype, shape and bytes) through containers."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        return torch.equal(a.contiguous().view(-1).view(torch.uint8),
                           b.contiguous().view(-1).view(torch.uint8)) if a.numel() else True
    return a == b


def describe(a, b):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape:
        return f"max |diff| {(a.double() - b.double()).abs().max().item():.3g}"
    return f"neuron {a!r} vs reference {b!r}"


def check_pairs(results, minimum):
    """Every (neuron, reference) pair of every rank is equal; returns how many were compared."""
    compared, bad = 0, []
    for rank, res in enumerate(results):
        for name, value in res.items():
            if isinstance(value, tuple) and len(value) == 2:
                compared += 1
                if not same(*value):
                    bad.append(f"rank {rank} {name}: {describe(*value)}")
    assert not bad, f"{len(bad)} of {compared} differ:\n" + "\n".join(bad[:20])
    assert compared >= minimum, f"only {compared} comparisons"
    return compared


def ref(results, rank, key):
    return results[rank][key][1]


# The slow_distributed tests run only when selected: -m slow_distributed (or
# NEURON_SLOW_DISTRIBUTED=1); a plain run skips them without launching.
only_when_selected = pytest.mark.skipif(
    "not (os.environ.get('NEURON_SLOW_DISTRIBUTED') == '1'"
    " or 'slow_distributed' in (config.getoption('markexpr') or ''))",
    reason="4-process run (about a minute on 2 cores): select with -m slow_distributed "
           "or NEURON_SLOW_DISTRIBUTED=1")


# The 2-rank workers run in one launch (one after another in the same two
# processes: interpreter start-ups dominate on 2 cores); under
# NEURON_LAUNCH_BLOCKING=1 only the pipeline (point-to-point) runs.
FSDP_FP32 = ["fp32-reshard", "fp32-keep", "fp32-force-sum", "fp32-divide4"]
FSDP_BF16 = ["bf16-reshard", "bf16-keep"]
# (dtensor starts from no process group at all, so it gets processes of its own.)
TWO_RANK = ["pipeline"] if LAUNCH_BLOCKING else ["fsdp", "pipeline"]


@pytest.fixture(scope="module")
def two_rank():
    results = run_ranks("parallel", ",".join(TWO_RANK), timeout=2 * TIMEOUT,
                        env={"FSDP_CONFIGS": ",".join(FSDP_FP32 + FSDP_BF16)})
    # (one function alone returns its result as it is, not by name)
    out = ({TWO_RANK[0]: results} if len(TWO_RANK) == 1 else
           {name: [r[name] for r in results] for name in TWO_RANK})
    if not LAUNCH_BLOCKING:
        out["dtensor"] = run_ranks("parallel", "dtensor", timeout=TIMEOUT)
    return out


def only(results, configs):
    """The part of the fsdp results that belongs to `configs`."""
    return [{k: v for k, v in r.items() if any(k.startswith(c + "-") for c in configs)}
            for r in results]


# ---------------------------------------------------------------------------
# FSDP2


def check_fsdp(results, configs, steps=3):
    for name in configs:
        keys = [k for k in results[0] if k.startswith(f"{name}-step")]
        assert keys
        for k in keys:
            # Each rank gathered the same full parameters (losses are per rank).
            if not k.endswith("-loss"):
                assert same(ref(results, 0, k), ref(results, 1, k)), k
        # Training moved the parameters.
        w0, w2 = (ref(results, 0, f"{name}-step{s}-blocks.0.up.weight") for s in (0, steps - 1))
        assert not torch.equal(w0, w2)
        # Sharded on dim 0, padded: the 9-row head is 5 + 4 rows.
        assert ref(results, 0, f"{name}-local-head.weight").shape == (5, 16)
        assert ref(results, 1, f"{name}-local-head.weight").shape == (4, 16)


@plain_pass_only
def test_fsdp2_fp32_reshard_keep_sum_and_divide_factor(two_rank):
    # FSDP2 fully_shard on a 2-block pre-norm MLP (2 ranks, 3 AdamW steps): the
    # loss and every full parameter (full_tensor()) after each step, rank by
    # rank. FSDP picks its reduce op from the reduce dtype, the divide factor and
    # the device type (only "mtia" forces SUM), not from the backend: Gloo and
    # neuron both get AVG; force-sum gives SUM + a divide by 2 on the device.
    # divide factor 4 gives PREMUL_SUM(1/4) on neuron; Gloo has no PREMUL_SUM,
    # so its reference forces SUM and divides by 4 after, the same bits for a
    # power-of-2 factor (exact scaling commutes with the rounding of the sum).
    configs = FSDP_FP32
    results = only(two_rank["fsdp"], configs)
    check_pairs(results, minimum=2 * 4 * 60)
    check_fsdp(results, configs)
    for r in results:
        for name in ("fp32-reshard", "fp32-keep"):
            assert r[f"{name}-reduce-ops-neuron"] == r[f"{name}-reduce-ops-cpu"] == ["AVG"]
        assert r["fp32-force-sum-reduce-ops-neuron"] == r["fp32-force-sum-reduce-ops-cpu"] == ["SUM"]
        assert r["fp32-divide4-reduce-ops-neuron"] == ["PREMUL_SUM"]
        assert r["fp32-divide4-reduce-ops-cpu"] == ["SUM"]


@plain_pass_only
def test_fsdp2_bf16_mixed_precision(two_rank):
    # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), reshard after
    # forward and not: the blocks compute in bf16 (bf16 all-gather), gradients
    # are reduce-scattered in fp32 (AVG), the sharded parameters stay fp32.
    configs = FSDP_BF16
    results = only(two_rank["fsdp"], configs)
    check_pairs(results, minimum=2 * 2 * 60)
    check_fsdp(results, configs)
    for r in results:
        for name in configs:
            assert r[f"{name}-compute-dtype"][1] == ("torch.bfloat16", "torch.bfloat16")
            assert r[f"{name}-param-dtype"][1] == "torch.float32"
            assert r[f"{name}-reduce-ops-neuron"] == r[f"{name}-reduce-ops-cpu"] == ["AVG"]


# ---------------------------------------------------------------------------
# DTensor, tensor and sequence parallel


@plain_pass_only
def test_dtensor_and_tensor_parallel(two_rank):
    # init_device_mesh("neuron", (2,)) with no process group yet (it makes the
    # default group: "neuron:neuron" in torch 2.14); the reference runs on a
    # Gloo group of the same ranks (DeviceMesh.from_group). distribute_tensor
    # with Shard(0) / uneven Shard(1) / Replicate and src_data_rank 0 and None;
    # redistribute Shard->Replicate, Shard(0)->Shard(1), Replicate->Shard,
    # Partial(sum/avg/max)->Replicate/Shard; a sharded matmul; TP
    # (ColwiseParallel + RowwiseParallel) and SP (SequenceParallel norm,
    # Colwise from Shard(1), Rowwise to Shard(1)) forward + backward: outputs,
    # input grads, parameter grads.
    results = two_rank["dtensor"]
    check_pairs(results, minimum=2 * 48)
    for pl in ("shard0", "shard1-uneven", "replicate"):
        # src_data_rank=0: rank 0's data everywhere; None: each rank's own chunk.
        assert same(ref(results, 0, f"dt-distribute-{pl}-src0-full"),
                    ref(results, 1, f"dt-distribute-{pl}-src0-full"))
    # (the full tensors are gathered: the same on both ranks either way)
    assert not same(ref(results, 0, "dt-distribute-shard0-srcNone-full"),
                    ref(results, 0, "dt-distribute-shard0-src0-full"))
    assert ref(results, 0, "dt-distribute-shard1-uneven-src0-local").shape == (6, 3)
    assert ref(results, 1, "dt-distribute-shard1-uneven-src0-local").shape == (6, 2)
    # Sanity of the reference: TP/SP compute the module (the partial sums are
    # added in another order than one matmul, hence a tolerance here only).
    plain = ref(results, 0, "dt-plain-out")
    torch.testing.assert_close(ref(results, 0, "dt-tp-out"), plain, rtol=1e-5, atol=1e-6)
    for rank in range(2):
        torch.testing.assert_close(ref(results, rank, "dt-sp-out-local"),
                                   plain.chunk(2, dim=1)[rank], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Pipeline parallel


def test_pipeline_two_stages_gpipe_and_1f1b(two_rank):
    # A 7-layer MLP split into 2 PipelineStages (manual split), 4 microbatches,
    # ScheduleGPipe and Schedule1F1B, 2 SGD steps: the last stage's output and
    # per-microbatch losses, every stage's grads after each step, the final
    # parameters (activations and grads cross ranks by send/recv).
    results = two_rank["pipeline"]
    check_pairs(results, minimum=24 + 32)
    # Sanity of the reference: the pipelined first step is the plain one.
    plain = results[1]["plain"]
    for sched in ("ScheduleGPipe", "Schedule1F1B"):
        torch.testing.assert_close(ref(results, 1, f"{sched}-step0-losses"), plain["losses"])
        for rank in range(2):
            for k in results[rank]:
                if k.startswith(f"{sched}-step0-grad-"):
                    torch.testing.assert_close(ref(results, rank, k),
                                               plain["grads"][k.split("-grad-")[1]])


# ---------------------------------------------------------------------------
# Distributed checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An FSDP2 model + AdamW state after 2 steps, saved with DCP on 2 ranks
    (neuron, and the Gloo/CPU reference beside it)."""
    ckpt = tmp_path_factory.mktemp("dcp")
    results = run_ranks("parallel", "dcp_save", timeout=TIMEOUT, env={"CKPT_DIR": str(ckpt)})
    return ckpt, results


def check_loaded(loaded, full):
    assert loaded.keys() == full.keys()
    bad = [k for k in full if not same(loaded[k], full[k])]
    assert not bad, bad
    assert sum(isinstance(v, torch.Tensor) for v in full.values()) >= 18 * 3  # params + exp_avg(_sq)


@plain_pass_only
def test_dcp_save_sharded_load_on_one_rank(checkpoint):
    # The saved state (model and optimizer, gathered) matches the reference bit
    # for bit, and so do the checkpoint's data files; loaded on 1 rank into a
    # plain (unsharded) model + AdamW, model and optimizer read back the saved
    # full state exactly, and a step runs from it.
    ckpt, saved = checkpoint
    check_pairs(saved, minimum=2 * 100)
    for f in sorted((ckpt / "neuron").glob("*.distcp")):
        assert f.read_bytes() == (ckpt / "cpu" / f.name).read_bytes(), f.name
    assert len(list((ckpt / "neuron").glob("*.distcp"))) == 2
    full = saved[0]["full"]
    assert same(full, saved[1]["full"])
    (r,) = run_ranks("parallel", "dcp_load", world_size=1, timeout=TIMEOUT,
                     env={"CKPT_DIR": str(ckpt)})
    check_loaded(r["loaded"], full)
    assert torch.isfinite(torch.tensor(r["loss-after-load"]))


@pytest.mark.slow_distributed
@only_when_selected
def test_dcp_load_resharded_on_four_ranks(checkpoint):
    # The 2-rank checkpoint loaded into FSDP2 on 4 ranks (resharding: the head's
    # 9 rows become 3+3+3+0): each rank's gathered model and optimizer state is
    # the saved full state exactly.
    ckpt, saved = checkpoint
    results = run_ranks("parallel", "dcp_load", world_size=4, timeout=TIMEOUT,
                        env={"CKPT_DIR": str(ckpt)})
    for rank, r in enumerate(results):
        check_loaded(r["loaded"], saved[0]["full"])
        assert r["local-head.weight"].shape == ((3, 16) if rank < 3 else (0, 16))
        assert torch.isfinite(torch.tensor(r["loss-after-load"]))


# ---------------------------------------------------------------------------
# 2-D mesh (4 processes)


@pytest.mark.slow_distributed
@only_when_selected
def test_fsdp_x_tp_2d_mesh():
    # init_device_mesh("neuron", (2, 2), ("dp", "tp")): each block's MLP tensor
    # parallel over "tp" (Colwise up, Rowwise down), FSDP2 over "dp"; 2 AdamW
    # steps, the loss and every full parameter after each step, on all 4 ranks.
    results = run_ranks("parallel", "fsdp_tp_2d", world_size=4, timeout=TIMEOUT)
    check_pairs(results, minimum=4 * 39)
    # Within a tp group the batch is the same: the same loss.
    for a, b in ((0, 1), (2, 3)):
        assert same(ref(results, a, "2d-step0-loss"), ref(results, b, "2d-step0-loss"))
    assert "Shard(dim=0)" in ref(results, 0, "2d-placements-up.weight")
