"""Global state that queued kernels read when they run.

CPU's kernels read some process-wide state at run time, not at the call: the default
dtype above all (integer true division and integer inputs of float ops compute in it,
TensorIterator's ``promote_integer_inputs_to_float``). A kernel queued on ``neuron`` runs
later, on the device's executor, so changing that state while work is queued would let
the kernel compute under the new state. ``torch.set_default_dtype`` therefore waits for
queued neuron work first (only when the dtype changes and the runtime is up), as CUDA
needs no such wait because its kernels never read host globals.
"""

from __future__ import annotations

import functools

import torch


def _drain_neuron_work() -> None:
    from . import neuron

    if not neuron.is_neuron_runtime_initialized():
        return
    for i in range(neuron.device_count()):
        neuron.synchronize(i)


def install() -> None:
    original = torch.set_default_dtype
    if getattr(original, "_torchneuron_wrapped", False):
        return

    @functools.wraps(original)
    def set_default_dtype(d):
        if d != torch.get_default_dtype():
            _drain_neuron_work()
        return original(d)

    set_default_dtype._torchneuron_wrapped = True
    torch.set_default_dtype = set_default_dtype
