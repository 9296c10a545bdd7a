"""A representative slice of the OpInfo conformance run (tests/conformance):
the same samples on neuron and on CPU, bitwise equal, for ops across the
families a training step uses. `make conformance` runs every op in op_db."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "conformance"))
import harness  # noqa: E402
import opinfo  # noqa: E402

SUBSET = [
    # pointwise, unary and binary, with type promotion and broadcasting
    "add", "sub", "mul", "div", "pow", "abs", "neg", "exp", "log", "sin", "tanh", "sigmoid",
    "clamp", "where", "lerp", "addcmul",
    # reductions and scans
    "sum", "mean", "amax", "argmax", "std", "var", "cumsum", "logsumexp",
    # linear algebra
    "mm", "bmm", "addmm", "matmul",
    # indexing, shape and data movement
    "index_select", "gather", "scatter_add", "cat", "stack", "masked_fill", "nonzero",
    "sort", "topk", "flip", "roll", "tril",
    # nn functional
    "softmax", "log_softmax", "nn.functional.gelu", "nn.functional.relu",
    "nn.functional.layer_norm", "nn.functional.embedding", "nn.functional.cross_entropy",
    "nn.functional.conv2d", "nn.functional.mse_loss", "nn.functional.batch_norm",
]


# Every check, on the dtypes a training step meets most, the first 3 samples
# of each op (make conformance runs every dtype and sample).
DTYPES = ("float32", "float64", "bfloat16", "int64", "bool")


def test_opinfo_subset_matches_cpu():
    records = opinfo.run(SUBSET, DTYPES, max_samples=3, chunk=len(SUBSET))
    counts, unexpected = harness.summarize(records, opinfo.load_expected())
    # The slice really ran: every op, and results were compared (a check where
    # every sample raised on both devices is both-raised, not pass).
    # (dtype "-": an OpInfo with none of DTYPES on CPU, e.g. batch_norm.without_cudnn)
    ran = {r["op"] for r in records if r["dtype"] != "-"}
    assert len(ran) >= len(SUBSET) and ran <= set(opinfo.expand(SUBSET)), counts
    assert {r["op"] for r in records if r["status"] == "pass"} == ran, counts
    assert counts["pass"] > 800, counts
    assert not unexpected, "\n".join(
        f"{r['status']} {r['op']} {r['dtype']} {r['check']}: {r['detail']}" for r in unexpected)
