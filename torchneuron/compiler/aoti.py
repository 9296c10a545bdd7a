"""AOTInductor for ``neuron``: ``torch._inductor.aoti_compile_and_package``
of a program exported on neuron, and ``aoti_load_package`` to run it.

Inductor's C++ wrapper (``CppWrapperCpu``) writes the model library: the
graph's kernels are CPU kernels (CppScheduling, as for torch.compile), its
extern calls CPU's C shims, its own buffers and constants host memory. This
wrapper changes what names neuron: it writes the library as CPU code (device
types, shims, headers), and Inductor records the package's device as
``neuron``, so the loader creates the runner registered for neuron
(``csrc/inductor/AotiRunner.cpp``). That runner queues each call on the
current stream as one work item, on host views of the device tensors, and
returns device outputs without waiting for the device.

Only ahead of time: a just-in-time C++ wrapper (``cpp_wrapper=True``) would
call the kernels on the calling thread, outside stream order; torch.compile
on neuron uses the Python wrapper, whose kernels queue.

torch 2.14 precompiles a header named after the device for every package
(``torch/csrc/inductor/aoti_include/<device>.h``), which torch ships only for
its own devices: so a neuron package is compiled with
``inductor_configs={"aot_inductor.precompile_headers": False}``.
"""
from __future__ import annotations

from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.virtualized import V
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from .wrapper import CpuSchedulingScope

# A symbol the model library defines when some output's layout depends on
# input values (unbacked sizes: nonzero, masked_select, ...): the runner then
# runs it on the host after waiting for the stream, as eager neuron runs
# such ops.
VALUE_DEPENDENT_SYMBOL = "torchneuron_aoti_outputs_depend_on_values"

_PRECOMPILE_HINT = 'inductor_configs={"aot_inductor.precompile_headers": False}'


def _as_cpu(device: str) -> str:
    return "cpu" if device == "neuron" else device


class NeuronCppWrapper(CpuSchedulingScope, CppWrapperCpu):
    """The C++ wrapper of a neuron graph compiled ahead of time."""

    def __init__(self) -> None:
        if not V.graph.aot_mode:
            raise NotImplementedError(
                "torchneuron: cpp_wrapper=True is not supported for neuron graphs (its kernels "
                "would run on the calling thread, outside stream order); torch.compile on neuron "
                "uses the Python wrapper, whose kernels queue on the device's streams. "
                "AOTInductor (aoti_compile_and_package) is supported.")
        if inductor_config.aot_inductor.precompile_headers:
            raise RuntimeError(
                "torchneuron: compile neuron AOTInductor packages with " + _PRECOMPILE_HINT +
                " (torch 2.14 precompiles torch/csrc/inductor/aoti_include/<device>.h, which "
                "torch ships only for its own devices; the package is the same without it)")
        self.device = "neuron"  # read by CppWrapperCpu's constructor
        super().__init__()
        self.needs_vec_isa = True  # CPU kernels (CppWrapperCpu sets it for "cpu" only)

    def generate(self, is_inference: bool) -> Any:
        if _outputs_depend_on_values():
            self.header.writeline(
                f'extern "C" __attribute__((visibility("default"))) const int '
                f"{VALUE_DEPENDENT_SYMBOL} = 1;")
        return super().generate(is_inference)

    @staticmethod
    def create(is_subgraph: bool, subgraph_name: Any, parent_wrapper: Any,
               partition_signatures: Any = None) -> "NeuronCppWrapper":
        return NeuronCppWrapper()

    # The library is CPU code: devices, C shims and headers are CPU's.
    def codegen_device(self, device: torch.device) -> str:
        if device.type == "neuron":
            device = torch.device("cpu")
        return super().codegen_device(device)

    @staticmethod
    def get_c_shim_func_name(kernel: str, device: str) -> str:
        return CppWrapperCpu.get_c_shim_func_name(kernel, _as_cpu(device))

    def add_device_include(self, device: str) -> None:
        super().add_device_include(_as_cpu(device))


def _outputs_depend_on_values() -> bool:
    for out in V.graph.graph_outputs:
        try:
            exprs = [*out.get_size(), *out.get_stride(), out.get_layout().offset]
        except (AttributeError, NotImplementedError):
            continue  # not a tensor (a shape or a constant)
        if any(free_unbacked_symbols(e) for e in exprs):
            return True
    return False
