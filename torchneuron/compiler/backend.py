"""``torch.compile(model, backend="neuron")``: the name AWS's TorchNeuron
documents. It is Inductor (the neuron scheduling and wrapper of this
package), registered through Dynamo's ``torch_dynamo_backends`` entry point.

Each graph it compiles leaves a record (``get_dynamo_metrics``): its FX node
count and the microseconds Inductor took, under the model name last given to
``set_model_name``. A failing compile raises ``CompilationError`` (Dynamo
reports it as the cause of its ``BackendCompilerFailed``)."""
from __future__ import annotations

import threading
import time
from typing import Any

_lock = threading.Lock()
_graphs: list[dict[str, Any]] = []
_model_name: str | None = None


class CompilationError(RuntimeError):
    """Inductor could not compile a graph for neuron (the cause is chained)."""


def set_model_name(name: str | None) -> None:
    """Label the graphs compiled from now on (in ``get_dynamo_metrics``)."""
    global _model_name
    _model_name = None if name is None else str(name)


def get_dynamo_metrics() -> dict[str, Any]:
    """The graphs ``backend="neuron"`` compiled since the last reset, and their total time."""
    with _lock:
        graphs = [dict(g) for g in _graphs]
    return {
        "graph_count": len(graphs),
        "total_fx_nodes": sum(g["fx_nodes"] for g in graphs),
        "total_compile_us": sum(g["compile_us"] for g in graphs),
        "graphs": graphs,
    }


def reset_dynamo_metrics() -> None:
    with _lock:
        _graphs.clear()


def neuron(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    from torch._inductor.compile_fx import compile_fx

    from . import register

    register()
    start = time.perf_counter_ns()
    try:
        compiled = compile_fx(gm, example_inputs, **kwargs)
    except Exception as error:
        raise CompilationError(
            f"backend='neuron' could not compile graph '{type(gm).__name__}' "
            f"({len(gm.graph.nodes)} FX nodes): {type(error).__name__}: {error}") from error
    elapsed_us = (time.perf_counter_ns() - start) // 1000
    with _lock:
        _graphs.append({
            "index": len(_graphs),
            "model_name": _model_name,
            "fx_nodes": len(gm.graph.nodes),
            "compile_us": int(elapsed_us),
        })
    return compiled
