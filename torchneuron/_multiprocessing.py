"""``torch.multiprocessing`` and ``neuron`` tensors: a clear error, never a hang.

``neuron`` memory lives in a per-process arena, so a tensor cannot be shared with
another process the way CUDA IPC shares device memory. Without a reducer of our
own, torch's CPU reducer runs on a neuron storage: it fails with
``_share_fd_: only available on CPU`` inside the queue's feeder thread, the item is
dropped and the consumer waits forever.

torch registers its reducers with ``multiprocessing.reduction.ForkingPickler`` per
class (``torch.multiprocessing.reductions.init_reductions``), so ours wraps torch's
reducer for ``torch.UntypedStorage``: every neuron tensor, typed storage and
parameter is pickled through its untyped storage. Pickling a neuron storage for
multiprocessing then raises at once in the producer (``Pipe.send``,
``SimpleQueue.put``, ``Pool`` arguments, ``spawn`` process arguments). A
``multiprocessing.Queue`` pickles in a background feeder thread, where an
exception could only be printed while the consumer hangs: there the storage is
replaced by a stub that raises the same error in the consumer's ``get()``, and the
producer is warned.
"""
from __future__ import annotations

import threading
import warnings
from multiprocessing.reduction import ForkingPickler

import torch

_MESSAGE = (
    "A neuron tensor or storage cannot be sent to another process: neuron device "
    "memory is private to the process that allocated it (torch.multiprocessing has no "
    "IPC for the neuron device). Send a CPU copy instead (tensor.cpu(), then .to('neuron') "
    "in the receiving process), or load the data in each process."
)


class NeuronSharingError(RuntimeError):
    """Raised when a neuron tensor or storage is pickled for another process."""


def _raise_not_shareable(message: str) -> None:
    """Rebuild function of the stub sent by a queue's feeder thread."""
    raise NeuronSharingError(message)


def _in_queue_feeder_thread() -> bool:
    # multiprocessing.queues.Queue pickles in a thread it names so (3.8+).
    return threading.current_thread().name == "QueueFeederThread"


def _wrap(torch_reducer):
    def reduce_storage(storage):
        if storage.device.type != "neuron":
            return torch_reducer(storage)
        if _in_queue_feeder_thread():
            warnings.warn(_MESSAGE + " The receiving process's get() raises this error.",
                          RuntimeWarning, stacklevel=2)
            return (_raise_not_shareable, (_MESSAGE,))
        raise NeuronSharingError(_MESSAGE)

    reduce_storage._torchneuron_wrapped = torch_reducer
    return reduce_storage


def register_reducers() -> None:
    """Wraps torch's reducer for ``torch.UntypedStorage`` (idempotent)."""
    import torch.multiprocessing  # noqa: F401  (registers torch's reducers first)

    current = ForkingPickler._extra_reducers.get(torch.UntypedStorage)
    if current is None or getattr(current, "_torchneuron_wrapped", None) is not None:
        return
    ForkingPickler.register(torch.UntypedStorage, _wrap(current))
