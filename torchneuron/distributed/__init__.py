"""The ``neuron`` c10d backend: ``torch.distributed`` on neuron tensors.

Registered when torchneuron loads, as ``torch.distributed.Backend("neuron")``
for the devices ``neuron`` and ``cpu``, so that

* ``init_process_group()`` with no backend (torch maps the accelerator only:
  ``neuron:neuron``, as it maps CUDA to ``cuda:nccl`` alone; CPU tensors then
  need ``"neuron"`` or ``"cpu:gloo,neuron:neuron"``),
* ``init_process_group("neuron")`` (one backend for neuron and CPU tensors),
* ``"cpu:gloo,neuron:neuron"`` and ``init_device_mesh("neuron", ...)``,
* accelerate (``backend="neuron"``) and TorchTitan (the device's mapped backend)

all find it. The backend is C++ (``csrc/distributed``): collectives on neuron
tensors are device work on the stream, carried by PyTorch's own Gloo over
zero-copy host views of device memory. Gloo brings its algorithms, timeouts
and multi-node TCP (``GLOO_SOCKET_IFNAME`` picks the interface).
"""
from __future__ import annotations

import torch

BACKEND_NAME = "neuron"


def _create_backend(opts, backend_options=None):
    """The creator torch.distributed calls for each group (extended API)."""
    from torch.distributed import ProcessGroupGloo

    from .. import _C

    _C._init_distributed()
    # The transport: Gloo on the store torch prefixed for this group and device.
    transport = ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    transport.options.global_ranks_in_group = opts.global_ranks_in_group
    return _C.ProcessGroupNeuron(transport, opts.group_rank, opts.group_size, opts.store,
                                 opts.timeout)


def register() -> None:
    """Registers the backend with torch.distributed (idempotent)."""
    if not torch.distributed.is_available():
        return
    from torch.distributed import Backend

    if getattr(Backend, "NEURON", None) == BACKEND_NAME and BACKEND_NAME in Backend.backend_list:
        return
    Backend.register_backend(
        BACKEND_NAME, _create_backend, extended_api=True, devices=[BACKEND_NAME, "cpu"]
    )


def is_available() -> bool:
    """True when torch has the distributed package with Gloo (the transport)."""
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


__all__ = ["BACKEND_NAME", "register", "is_available"]
