"""``torch_neuronx.neuron_dynamo_backend``: the ``neuron`` Dynamo backend's helpers.

The backend is torchneuron's Inductor-based one (``torchneuron.compiler``).
``NEFFExecutionError`` is ``RuntimeError``: a failing compiled kernel raises
the RuntimeError of the op that failed.
"""
from __future__ import annotations

from torchneuron.compiler.backend import (  # noqa: F401
    CompilationError as NEFFCompilationError,
    get_dynamo_metrics,
    reset_dynamo_metrics,
    set_model_name,
)

NEFFExecutionError = RuntimeError

__all__ = ["NEFFCompilationError", "NEFFExecutionError", "get_dynamo_metrics",
           "reset_dynamo_metrics", "set_model_name"]
