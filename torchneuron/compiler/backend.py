"""``torch.compile(model, backend="neuron")``: the name AWS's TorchNeuron
documents. It is Inductor (the neuron scheduling and wrapper of this
package), registered through Dynamo's ``torch_dynamo_backends`` entry point."""
from __future__ import annotations

from typing import Any


def neuron(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    from torch._inductor.compile_fx import compile_fx

    from . import register

    register()
    return compile_fx(gm, example_inputs, **kwargs)
