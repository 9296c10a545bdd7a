"""PyTorch's own device-generic test machinery on neuron.

`instantiate_device_type_tests(..., only_for="privateuse1")` makes a
`...PRIVATEUSE1` class whose tests receive device "neuron", and `@ops` /
`@modules` parametrize them over OpInfos and ModuleInfos, exactly as
PyTorch's suites run on CUDA. Here a slice of op_db runs the conformance
checks of tests/conformance (forward, non-contiguous, backward: bitwise
against CPU). The full suites (`make conformance`) run every OpInfo and
ModuleInfo in worker processes instead, so that one crash cannot hide the
other results; this file shows the same checks plug into PyTorch's harness.
"""
import os
import sys

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "conformance"))
import opinfo  # noqa: E402

NAMES = {"add", "mul", "div", "exp", "tanh", "sum", "mean", "mm", "matmul", "softmax",
         "nn.functional.gelu", "nn.functional.layer_norm", "nn.functional.linear",
         "nn.functional.cross_entropy", "index_select", "cat"}
OPS = [o for o in op_db if o.name in NAMES]


def _first(samples, n=4):
    """The first n samples as opinfo's checks take them: [(index, sample)]."""
    return list(enumerate(samples))[:n]


class TestNeuronMatchesCpu(TestCase):
    def assertCompared(self, check):
        """A check passed: no sample failed and at least one sample's results
        were compared (not only errors raised on both devices)."""
        self.assertIsNone(check.failure)
        self.assertGreater(check.compared, 0, check.record({}, "")["detail"])

    @ops(OPS, allowed_dtypes=(torch.float32, torch.bfloat16))
    def test_forward(self, device, dtype, op):
        self.assertEqual(torch.device(device).type, "neuron")
        samples = _first(op.sample_inputs(device, dtype))
        self.assertCompared(opinfo.check_forward(op.op, samples))
        self.assertCompared(opinfo.check_forward(op.op, samples, noncontiguous=True))

    @ops([o for o in OPS if o.supports_autograd], allowed_dtypes=(torch.float32,))
    def test_backward(self, device, dtype, op):
        samples = _first(op.sample_inputs(device, dtype, requires_grad=True))
        self.assertCompared(opinfo.check_backward(op, samples))


instantiate_device_type_tests(TestNeuronMatchesCpu, globals(), only_for=("privateuse1",))
