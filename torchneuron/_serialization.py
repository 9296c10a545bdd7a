"""Checkpoint loading for ``neuron`` storages, with CPU's guarantees.

A storage that ``torch.load`` reads from a file is not resizable on CPU, so a tensor whose
view is longer than its saved storage (a crafted or corrupt checkpoint) is refused when it
is rebuilt (``set_`` raises "Trying to resize storage that is not resizable") instead of
reaching memory the storage does not own. PyTorch's own deserializer for a privateuse1
location copies the storage into a fresh, resizable device storage; this one, registered
ahead of it for ``neuron`` locations, keeps CPU's rule.
"""

from __future__ import annotations

import re

import torch
import torch.serialization as _ser

from . import _C

_BACKEND = "neuron"


def _neuron_tag(obj):
    return None  # tagging stays PyTorch's (its privateuse1 tagger says "neuron:N")


def _neuron_deserialize(obj, location: str):
    if not (location == _BACKEND or re.match(rf"{_BACKEND}(:|[0-9]+)", location)):
        return None
    device = _ser._validate_device(location, _BACKEND)
    storage = obj.to(device=device)
    _C._set_storage_resizable(storage, False)
    return storage


def install() -> None:
    # Priority 22.5: after meta (22), before PyTorch's privateuse1 entry (23).
    _ser.register_package(22.5, _neuron_tag, _neuron_deserialize)
