"""Legacy typed storage classes for ``neuron`` (``torch.neuron.FloatStorage``, ...).

``Tensor.storage_type()`` looks the class up as ``getattr(torch.neuron, "FloatStorage")``
(``TypedStorage._get_legacy_storage_class``), as it does in ``torch.cuda``; the classes
are defined as CUDA's are, and their ``__module__`` names the device they belong to.
"""

from __future__ import annotations

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal


class _NeuronLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for neuron storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for neuron storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for neuron storage")


def _make(name: str, dtype: torch.dtype) -> type:
    def _dtype_of(cls):
        return dtype

    def _public_dtype(cls):
        _warn_typed_storage_removal()
        return dtype

    cls = type(
        name,
        (_NeuronLegacyStorage,),
        {"dtype": classproperty(_public_dtype), "_dtype": classproperty(_dtype_of)},
    )
    # torch.storage._get_device_from_module reads the device from here.
    cls.__module__ = "torch.neuron"
    cls.__qualname__ = name
    return cls


_DTYPES = {
    "ByteStorage": torch.uint8,
    "DoubleStorage": torch.double,
    "FloatStorage": torch.float,
    "HalfStorage": torch.half,
    "LongStorage": torch.long,
    "IntStorage": torch.int,
    "ShortStorage": torch.short,
    "CharStorage": torch.int8,
    "BoolStorage": torch.bool,
    "BFloat16Storage": torch.bfloat16,
    "ComplexDoubleStorage": torch.cdouble,
    "ComplexFloatStorage": torch.cfloat,
}

STORAGE_CLASSES = {name: _make(name, dtype) for name, dtype in _DTYPES.items()}


def install(module) -> None:
    """Adds the classes to the ``torch.neuron`` module and to torch's storage registry."""
    for name, cls in STORAGE_CLASSES.items():
        setattr(module, name, cls)
        torch._storage_classes.add(cls)
