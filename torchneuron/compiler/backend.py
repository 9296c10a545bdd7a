"""``torch.compile(model, backend="neuron")``: the name AWS's TorchNeuron
documents. It is Inductor (the neuron scheduling and wrapper of this
package), registered through Dynamo's ``torch_dynamo_backends`` entry point.

Each graph it compiles leaves a record (``get_dynamo_metrics``): its FX node
count and the microseconds Inductor took, under the model name last given to
``set_model_name``. A failing compile raises ``CompilationError`` (Dynamo
reports it as the cause of its ``BackendCompilerFailed``).

One setting differs from plain ``torch.compile`` for graphs on neuron:
Inductor's layout optimization (channels-last convolutions) is off. Torch's
FakeTensor predicts contiguous convolution results for a PrivateUse1 device,
so with the optimization on, Inductor converts layouts around every
convolution of a CNN and feeds oneDNN mixed layouts (compiled resnet18's step
about 1.4x slower here). The setting goes through ``compile_fx``'s
``config_patches``, so the backward graph, compiled later, gets it too; it is
part of Inductor's cache key; ``options={"layout_optimization": True}`` (or
``torch.compile(model)`` with the default backend) keeps Inductor's default.
Each graph's record says which setting it was compiled with
(``layout_setting``) and what each inner compile Inductor ran saw
(``layout_optimization``: forward, then the backward once it compiles; empty
when Inductor's FX-graph or AOTAutograd cache served the graph, since a cached
graph is not compiled again)."""
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


def _on_neuron(example_inputs: Any) -> bool:
    import torch

    return any(isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in example_inputs)


def neuron(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    from . import register

    register()
    patches = dict(kwargs.pop("config_patches", None) or {})
    if _on_neuron(example_inputs):
        patches.setdefault("layout_optimization", False)
    layouts: list[bool] = []  # what each inner graph (forward, backward) was compiled with
    inner = kwargs.pop("inner_compile", compile_fx_inner)

    def recording_inner(*args: Any, **kw: Any) -> Any:
        layouts.append(bool(inductor_config.layout_optimization))
        return inner(*args, **kw)

    start = time.perf_counter_ns()
    try:
        compiled = compile_fx(gm, example_inputs, inner_compile=recording_inner,
                              config_patches=patches or None, **kwargs)
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
            "layout_setting": bool(patches.get("layout_optimization",
                                               inductor_config.layout_optimization)),
            # Inner graphs compiled so far (the backward's entry is added when it compiles).
            "layout_optimization": layouts,
        })
    return compiled
