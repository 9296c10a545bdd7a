"""The host side of a compiled ``neuron`` graph: Inductor's Python wrapper,
with the graph's C++ kernels loaded as queued launches (kernels.py).

Everything else the wrapper does is what it does for CPU: buffers come from
``empty_strided(..., device='neuron')`` (the device's caching allocator),
extern kernels (mm, convolution, attention) and fallbacks are eager ``neuron``
ops, which queue on the same stream. So a compiled graph runs in stream order
with the eager work around it, and the host never waits for the device.
"""
from __future__ import annotations

from textwrap import dedent
from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch._inductor.codegen.common import DeviceOpOverrides
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.virtualized import V

_PYBINDING = "async_compile.cpp_pybinding("


def _graph_name() -> str:
    """The AOT graph's name (e.g. ``0_forward``), for work item names."""
    ctx = torch._guards.TracingContext.try_get()
    names = getattr(ctx, "aot_graph_name", None) if ctx is not None else None
    if names:
        return "_".join(str(n) for n in names)
    return "backward" if V.graph.is_backward else "graph"


def _neuron_kernel_body(kernel_name: str, kernel_body: str) -> str:
    """``async_compile.cpp_pybinding(types, src)`` -> a queued neuron launch,
    when the kernel being defined belongs to a neuron device."""
    device = V.graph.current_device
    if device is None or device.type != "neuron" or not kernel_body.startswith(_PYBINDING):
        return kernel_body
    index = 0 if device.index is None else device.index
    name = f"{_graph_name()}/{kernel_name}"
    return f"neuron_load_kernel(async_compile, {name!r}, {index}, " + kernel_body[len(_PYBINDING):]


class _NeuronKernels:
    """What both wrappers (graph and subgraph) change."""

    def write_header(self) -> None:
        super().write_header()  # type: ignore[misc]
        self.imports.splice(  # type: ignore[attr-defined]
            "from torchneuron.compiler.kernels import load_kernel as neuron_load_kernel"
        )

    def define_kernel(self, kernel_name: str, kernel_body: str, metadata: Any = None,
                      gpu: bool = True, cpp_definition: Any = None) -> None:
        if not gpu:
            kernel_body = _neuron_kernel_body(kernel_name, kernel_body)
        super().define_kernel(kernel_name, kernel_body, metadata, gpu, cpp_definition)  # type: ignore[misc]

    def _generate_kernel_call_helper(self, kernel_name: str, call_args: Any, *,
                                     device: Any = None, **kwargs: Any) -> None:
        device = device or V.graph.get_current_device_or_throw()
        if device.type == "neuron":
            # The call is written as for CPU, `kernel(args)`: the loaded kernel queues itself.
            device = torch.device("cpu")
        super()._generate_kernel_call_helper(  # type: ignore[misc]
            kernel_name, call_args, device=device, **kwargs)


class NeuronSubgraphWrapperCodegen(_NeuronKernels, SubgraphPythonWrapperCodegen):
    def write_header(self) -> None:
        # A subgraph's kernels are defined in its parent's header.
        SubgraphPythonWrapperCodegen.write_header(self)


# While Inductor schedules and generates a neuron graph, it must take the
# paths it takes for CPU, whose C++ scheduling the graph uses. It tells the
# two by device type: "cpu" gets the C++ paths, every other device Triton's.
# - the kernel backend of a device that is not "cpu" is `cuda_backend`
#   (utils.get_current_backend): C++ codegen asks it for dtype propagation;
# - loop transforms written for Triton kernels, which CPU graphs skip by
#   device type (they assume Triton's (numel, rnumel) groups).
_CPU_SCHEDULING_CONFIG = {
    "cuda_backend": "cpp",
    "loop_ordering_after_fusion": False,
    "loop_reindexing_after_fusion": False,
    "loop_index_inversion_in_fusion": False,
}


class CpuSchedulingScope:
    """What every wrapper of a neuron graph (Python or C++) does: Inductor
    creates it before it schedules the graph and finishes with it in
    ``generate()``; the scheduling config above holds in between (and is
    restored if lowering fails, when the wrapper is dropped)."""

    def __init__(self) -> None:
        super().__init__()
        self._scheduling_config = inductor_config.patch(_CPU_SCHEDULING_CONFIG)
        self._scheduling_config.__enter__()
        self._scheduling_config_active = True

    def _restore_scheduling_config(self) -> None:
        if getattr(self, "_scheduling_config_active", False):
            self._scheduling_config_active = False
            self._scheduling_config.__exit__(None, None, None)

    def generate(self, is_inference: bool) -> Any:
        try:
            return super().generate(is_inference)  # type: ignore[misc]
        finally:
            self._restore_scheduling_config()

    def __del__(self) -> None:
        self._restore_scheduling_config()


class NeuronWrapperCodegen(_NeuronKernels, CpuSchedulingScope, PythonWrapperCodegen):
    """The Python wrapper of a neuron graph (torch.compile)."""

    @staticmethod
    def create(is_subgraph: bool, subgraph_name: Any, parent_wrapper: Any,
               partition_signatures: Any = None) -> PythonWrapperCodegen:
        if is_subgraph:
            return NeuronSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NeuronWrapperCodegen()


class NeuronDeviceOpOverrides(DeviceOpOverrides):
    """The device calls generated code makes (benchmark harness, guards)."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return dedent(
            f"""
            def {name}(index):
                return torch.neuron.current_stream(index).stream_id
            """
        )

    def set_device(self, device_idx: int) -> str:
        return f"torch.neuron.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.neuron.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.neuron.device({device_idx})"

    def cpp_kernel_type(self) -> str:
        return "void*"
