"""torch.distributed on neuron: the "neuron" c10d backend.

Every collective runs on neuron tensors (our backend) and on CPU tensors
(PyTorch's Gloo, the reference) in the same 2-rank group, and must agree bit
for bit; AVG and PREMUL_SUM, which Gloo lacks, are checked against their
definition computed with Gloo's SUM. Each launch is a set of real processes
(tests/distributed/launcher.py) bounded by a timeout.
"""
import pytest
import torch

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


def test_collective_matrix_matches_gloo_on_cpu():
    # 9 dtypes x (all_reduce with every op, broadcast, reduce, all_gather (list and
    # tensor), reduce_scatter (list and tensor), all_to_all (list and uneven
    # single), gather, scatter) x sync/async, plus AVG/PREMUL_SUM on floats.
    check_pairs(run_ranks("collectives", "matrix"), minimum=600)


def test_point_to_point():
    # send/recv, isend+irecv issued in the same order on both ranks (must not
    # deadlock), batch_isend_irecv.
    check_pairs(run_ranks("collectives", "point_to_point"), minimum=18)


def test_groups_coalescing_functional_and_compiled_collectives():
    check_pairs(run_ranks("collectives", "groups_and_functional", timeout=400), minimum=16)


def test_neuron_backend_serves_cpu_tensors_too():
    check_pairs(run_ranks("collectives", "neuron_only_backend"), minimum=6)


def test_collective_follows_stream_order_without_host_wait():
    results = run_ranks("collectives", "stream_semantics")
    check_pairs(results, minimum=6)
    for r in results:
        # 1 s of device work was queued ahead: launching and waiting (a stream
        # wait) must not have waited for it.
        assert r["host_seconds"] < 0.5, r["host_seconds"]
        assert "c10d::allreduce" in r["tracked"]


@pytest.mark.parametrize("case,within", [("dead_peer", 5.0), ("hung_peer", 9.0)])
def test_failed_peer_raises_within_timeout_naming_the_collective(case, within):
    (r, _) = run_ranks("collectives", case, timeout=120, expect_failure={1})
    assert r["error"] is not None, "no error raised"
    assert "c10d::allreduce" in r["error"], r["error"]
    assert r["seconds"] < within, r["seconds"]
    assert r["device_ok"]
