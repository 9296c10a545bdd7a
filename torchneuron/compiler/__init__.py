"""``torch.compile`` on ``neuron``.

Inductor generates C++ kernels with its CPU scheduling (CppScheduling); the
neuron wrapper (wrapper.py) loads them as launches queued on the device's
streams (kernels.py, ``csrc/inductor/CompiledLaunch.h``). Registered through
PyTorch's extension points, lazily, so ``import torch`` does not import
Inductor:

- Inductor looks up ``Scheduling``, ``PythonWrapperCodegen``, ... on the
  device module (``torch.neuron``) while neuron is not registered with it
  (``init_backend_registration``, run before each compile hashes its cache
  key). The lookup imports this package, whose ``register()`` registers neuron
  through ``register_backend_for_device``, with the codegen config that keys
  Inductor's caches (config.py); so the lookup itself finds nothing more to
  register (a registration from the looked-up classes would drop the config).
- Dynamo finds ``backend="neuron"`` through the ``torch_dynamo_backends``
  entry point.
Either path calls ``register()``, which also registers the device op
overrides and Dynamo's device interface.
"""
from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_registered = False


def register() -> None:
    """Registers neuron with Inductor and Dynamo (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        from torch._dynamo.device_interface import register_interface_for_device
        from torch._inductor.codegen.common import (
            register_backend_for_device,
            register_device_op_overrides,
        )
        from torch._inductor.codegen.cpp import CppScheduling
        from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen

        from . import config
        from .aoti import NeuronCppWrapper
        from .device_interface import NeuronInterface
        from .flex_attention import FlexAttentionToMath
        from .wrapper import NeuronDeviceOpOverrides, NeuronWrapperCodegen

        register_backend_for_device(
            "neuron", CppScheduling, NeuronWrapperCodegen, NeuronCppWrapper, WrapperFxCodegen,
            device_custom_pass=FlexAttentionToMath(), device_custom_config=config)
        register_device_op_overrides("neuron", NeuronDeviceOpOverrides())
        register_interface_for_device("neuron", NeuronInterface)
        for i in range(NeuronInterface.device_count()):
            register_interface_for_device(f"neuron:{i}", NeuronInterface)
        _registered = True


def registration_lookup(name: str) -> Any:
    """``torch.neuron.<name>`` for the names Inductor looks up to register a
    device: registers neuron, then reports the name absent (see above)."""
    register()
    raise AttributeError(
        f"module 'torch.neuron' has no attribute '{name}' (neuron is registered with Inductor "
        f"by torchneuron.compiler.register())")


INDUCTOR_LOOKUPS = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")
