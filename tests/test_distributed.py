"""torch.distributed on neuron: the "neuron" c10d backend.

Every collective runs on neuron tensors (our backend) and on CPU tensors
(PyTorch's Gloo, the reference) in the same 2-rank group, and must agree bit
for bit; AVG and PREMUL_SUM, which Gloo lacks, are checked against their
definition computed with Gloo's SUM. Each launch is a set of real processes
(tests/distributed/launcher.py) bounded by a timeout.
"""
import pytest
import torch

from conftest import LAUNCH_BLOCKING, plain_pass_only
from tests.distributed.launcher import run_ranks

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch without distributed/Gloo")


def same(a, b):
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        return torch.equal(a.contiguous().view(-1).view(torch.uint8),
                           b.contiguous().view(-1).view(torch.uint8)) if a.numel() else True
    return a == b


def check_pairs(results, minimum):
    """Every (neuron, reference) pair of every rank is equal; returns how many were compared."""
    compared, bad = 0, []
    for rank, res in enumerate(results):
        for name, value in res.items():
            if isinstance(value, tuple) and len(value) == 2:
                compared += 1
                if not same(*value):
                    bad.append(f"rank {rank} {name}: neuron {value[0]} vs reference {value[1]}")
    assert not bad, "\n".join(bad[:20])
    assert compared >= minimum, f"only {compared} comparisons"
    return compared


# The 2-rank collective workers run in one launch (one group after another in
# the same two processes: interpreter start-ups dominate on 2 cores); under
# NEURON_LAUNCH_BLOCKING=1 only those whose tests run there.
COLLECTIVES = ["matrix", "point_to_point"] + ([] if LAUNCH_BLOCKING else [
    "groups_and_functional", "neuron_only_backend", "stream_semantics", "mismatch"])


@pytest.fixture(scope="module")
def collectives():
    results = run_ranks("collectives", ",".join(COLLECTIVES), timeout=600)
    return {name: [r[name] for r in results] for name in COLLECTIVES}


@pytest.fixture(scope="module")
def ddp():
    names = ["gpt_parity", "unused_parameters"]
    results = run_ranks("ddp", ",".join(names), timeout=600)
    return {name: [r[name] for r in results] for name in names}


def test_collective_matrix_matches_gloo_on_cpu(collectives):
    # 9 dtypes x (all_reduce with every op, broadcast, reduce, all_gather (list and
    # tensor), reduce_scatter (list and tensor), all_to_all (list and uneven
    # single), gather, scatter) x sync/async, plus AVG/PREMUL_SUM on floats.
    check_pairs(collectives["matrix"], minimum=600)


def test_point_to_point(collectives):
    # send/recv, isend+irecv issued in the same order on both ranks (must not
    # deadlock), batch_isend_irecv.
    check_pairs(collectives["point_to_point"], minimum=18)


@plain_pass_only
def test_groups_coalescing_functional_and_compiled_collectives(collectives):
    check_pairs(collectives["groups_and_functional"], minimum=16)


@plain_pass_only
def test_neuron_backend_serves_cpu_tensors_too_and_splits(collectives):
    check_pairs(collectives["neuron_only_backend"], minimum=18)


@plain_pass_only
def test_collective_follows_stream_order_without_host_wait(collectives):
    results = collectives["stream_semantics"]
    check_pairs(results, minimum=6)
    for r in results:
        # 1 s of device work was queued ahead: launching and waiting (a stream
        # wait) must not have waited for it.
        for early in range(len(results)):
            assert r[f"host_seconds-{early}"] < 0.5, r
        assert "before_wait" in r
        assert "c10d::allreduce" in r["tracked"]
        assert "c10d::allreduce" in r["profiled"], r["profiled"]


@plain_pass_only
def test_shared_memory_data_path_matches_gloo_on_cpu():
    # Both ranks on this machine: all-reduce, broadcast, all-gather (tensor,
    # in place, list) and reduce-scatter move their data through shared
    # memory, over sizes of several staging chunks plus a partial one.
    results = run_ranks("collectives", "shm_data", timeout=300)
    check_pairs(results, minimum=90)
    for r in results:
        assert r["data_path"] == "shared memory"
        assert r["carried"] == 59, r["carried"]  # every collective of the worker went that way


@plain_pass_only
def test_transport_data_path_when_shared_memory_is_off():
    results = run_ranks("collectives", "shm_data", timeout=300, env={"TORCHNEURON_DIST_SHM": "0"})
    check_pairs(results, minimum=90)
    for r in results:
        assert r["data_path"] == "transport" and r["carried"] == 0


def _check_mismatch_results(results, path):
    check_pairs(results, minimum=2)
    for rank, r in enumerate(results):
        assert r["agreement"] == path, (rank, r["agreement"])
        for name, op in (("all_reduce-sizes", "allreduce"), ("all_reduce-dtypes", "allreduce"),
                         ("broadcast-roots", "broadcast"),
                         ("all_gather_into_tensor-sizes", "all_gather_into_tensor")):
            assert r[name] is not None, f"rank {rank}: {name} raised nothing"
            # Each failure is reported once, at its own collective (its Work or
            # the next synchronize), never again at a later call.
            assert r[name].count("called it with different arguments") == 1, r[name]
            assert f"c10d::{op} on neuron" in r[name], (name, r[name])


@plain_pass_only
def test_mismatched_collectives_raise_on_every_rank_and_the_group_goes_on(collectives):
    # Both ranks on this machine: the check goes through shared memory.
    _check_mismatch_results(collectives["mismatch"], "shared memory")


@plain_pass_only
def test_mismatch_check_through_the_transport():
    # As between machines: TORCHNEURON_DIST_SHM=0 makes the ranks agree
    # through Gloo, with the same errors.
    results = run_ranks("collectives", "mismatch", timeout=180, env={"TORCHNEURON_DIST_SHM": "0"})
    _check_mismatch_results(results, "transport")


@plain_pass_only
def test_distributed_debug_detail_wraps_the_backend():
    # torch's checking wrapper needs the backend's sequence numbers.
    results = run_ranks("collectives", "detail_debug", timeout=180,
                        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    check_pairs(results, minimum=2 * 4)
    for rank, r in enumerate(results):
        assert r["mismatch"] is not None and "mismatch" in r["mismatch"].lower(), (rank, r["mismatch"])


@plain_pass_only
@pytest.mark.parametrize("case,within", [("dead_peer", 5.0), ("hung_peer", 9.0)])
@pytest.mark.parametrize("check", ["on", "off"])
def test_failed_peer_raises_within_timeout_naming_the_collective(case, within, check):
    # With the agreement check on, rank 0 waits in the board's slots
    # (AgreementBoard.h); with it off, in the data transport's steps
    # (SharedMemoryTransport.h). Either wait must notice.
    env = {} if check == "on" else {"TORCHNEURON_DIST_CHECK": "0"}
    (r, _) = run_ranks("collectives", case, timeout=120, expect_failure={1}, env=env)
    assert r["error"] is not None, "no error raised"
    assert "c10d::allreduce" in r["error"], r["error"]
    assert r["seconds"] < within, r["seconds"]
    assert r["device_ok"]
    assert r["agreement"] == ("shared memory" if check == "on" else "off")


@plain_pass_only
def test_ddp_matches_ddp_on_cpu_gloo_bitwise(ddp):
    # The demo GPT under DDP on 2 ranks (default buckets, many small buckets,
    # no_sync accumulation, gradient_as_bucket_view): every step's loss and
    # parameters on neuron equal the same DDP script's on CPU over Gloo.
    check_pairs(ddp["gpt_parity"], minimum=4 * 3 * 2)


@plain_pass_only
def test_ddp_unused_parameters_and_comm_future(ddp):
    check_pairs(ddp["unused_parameters"], minimum=7)


def _torchrun(tmp_path, *launches, timeout=180):
    """Starts one torchrun per argument list; returns each rank's JSON."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args,
                               str(root / "tests" / "distributed" / "torchrun_worker.py"),
                               str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for args in launches]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-5000:]
    return [json.loads(f.read_text()) for f in sorted(tmp_path.glob("rank*.json"))]


@plain_pass_only
def test_torchrun_single_node_picks_neuron_device_per_local_rank(tmp_path):
    results = _torchrun(tmp_path, ["--standalone", "--nproc_per_node=2"])
    assert len(results) == 2
    for r in results:
        # init_process_group() with no backend: torch maps the accelerator to "neuron".
        assert r["sum"] == 3.0 and r["world"] == 2 and r["backend"] == "neuron:neuron"
        assert [s["device"] for s in r["seen"]] == ["neuron:0", "neuron:1"]


@plain_pass_only
def test_torchrun_two_nodes_on_loopback(tmp_path):
    # Two torchrun launches (nodes 0 and 1) meeting at one rendezvous on
    # 127.0.0.1: TCPStore, rank mapping and Gloo's TCP transport between them.
    from tests.distributed.launcher import free_port

    port = free_port()
    common = ["--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
              f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=neuron-two-nodes"]
    results = _torchrun(tmp_path, common + ["--node_rank=0"], common + ["--node_rank=1"])
    assert len(results) == 2
    for r in results:
        assert r["sum"] == 3.0 and r["world"] == 2
        assert sorted(s["node"] for s in r["seen"]) == [0, 1]


@plain_pass_only
def test_two_rank_ddp_and_fsdp2_follow_single_device_training():
    # examples/train_gpt_distributed.py (make demo runs it): the demo GPT on 2
    # ranks (DDP, then FSDP2) against one device with the whole batch; the
    # script fails unless both loss curves are within 1e-6 relative.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, str(root / "examples" / "train_gpt_distributed.py"),
                        "--steps", "8"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "DDP: max relative difference" in p.stdout and "FSDP2: max relative" in p.stdout
