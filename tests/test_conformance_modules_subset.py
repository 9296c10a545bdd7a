"""A representative slice of the ModuleInfo conformance run
(tests/conformance/modules.py): the same modules, parameters and inputs on
neuron and on CPU, forward and backward, train and eval, bitwise equal.
`make conformance` runs every module in module_db."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "conformance"))
import harness  # noqa: E402
import modules  # noqa: E402

SUBSET = [
    # layers with parameters
    "nn.Linear", "nn.Conv2d", "nn.ConvTranspose2d", "nn.Embedding", "nn.PReLU",
    # normalisation, with running statistics in train mode
    "nn.BatchNorm2d", "nn.LayerNorm", "nn.GroupNorm", "nn.RMSNorm",
    # attention and recurrent layers
    "nn.MultiheadAttention", "nn.TransformerEncoderLayer", "nn.LSTM", "nn.GRU",
    # pooling, activations, losses
    "nn.MaxPool2d", "nn.AvgPool2d", "nn.GELU", "nn.Softmax", "nn.CrossEntropyLoss", "nn.MSELoss",
]


def test_module_subset_matches_cpu():
    # Every dtype each ModuleInfo lists, the first 4 inputs of each.
    records = modules.run(SUBSET, max_samples=4, chunk=len(SUBSET))
    counts, unexpected = harness.summarize(records, harness.load_expected(modules.EXPECTED))
    # The slice really ran: every module, and results were compared (a check
    # where every sample raised on both devices is both-raised, not pass).
    assert {r["op"] for r in records if r["status"] == "pass"} == set(SUBSET), counts
    assert counts["pass"] > 120, counts
    assert not unexpected, "\n".join(
        f"{r['status']} {r['op']} {r['dtype']} {r['check']}: {r['detail']}" for r in unexpected)
