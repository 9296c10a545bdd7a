"""The one place torchneuron changes torch: FlexAttention's device list.

``torch.nn.attention.flex_attention.flex_attention`` refuses every device
outside a fixed set (``_validate_device``: cuda, cpu, xpu, hpu, mps), in
Python, with no extension point; the function is marked "TODO: Remove once
non cuda/cpu devices support is added". Out-of-tree devices wait for that
upstream change (pytorch/pytorch#173071). Until it lands, this module wraps
``_validate_device`` so that ``neuron`` inputs pass; for every other device
the check runs unchanged. Installed once, at import of torchneuron; nothing
else in torch is replaced. Remove this file when torch accepts PrivateUse1
devices in FlexAttention.
"""
from __future__ import annotations

from typing import Any

_BACKEND = "neuron"


def install() -> None:
    import torch.nn.attention.flex_attention as flex

    check = flex._validate_device
    if getattr(check, "_torchneuron_shim", False):
        return

    def _validate_device(query: Any, key: Any, value: Any) -> None:
        if query.device.type == _BACKEND:
            return  # FlexAttention runs on neuron, eager and compiled, forward and backward
        check(query, key, value)

    _validate_device._torchneuron_shim = True  # type: ignore[attr-defined]
    _validate_device.__wrapped__ = check  # type: ignore[attr-defined]
    flex._validate_device = _validate_device
