"""The one place torchneuron changes torch: FlexAttention's device list.

``torch.nn.attention.flex_attention.flex_attention`` refuses every device
outside a fixed set (``_validate_device``: cuda, cpu, xpu, hpu, mps), in
Python, with no extension point; the function is marked "TODO: Remove once
non cuda/cpu devices support is added". Out-of-tree devices wait for that
upstream change (pytorch/pytorch#173071). Until it lands, this module wraps
``_validate_device`` so that ``neuron`` inputs pass; for every other device
the check runs unchanged. Nothing else in torch is replaced. Remove this file
when torch accepts PrivateUse1 devices in FlexAttention.

When: that module imports sympy (about a second), so torchneuron does not
import it; ``install()`` wraps the check at once if the module is loaded, and
otherwise right after it is (a finder on ``sys.meta_path`` that watches that
one module name and otherwise defers to the other finders).
"""
from __future__ import annotations

import sys
from typing import Any

_BACKEND = "neuron"


_MODULE = "torch.nn.attention.flex_attention"


class _AfterImport:
    """Finds nothing itself: for _MODULE it takes the spec the other finders
    give and wraps the module's loading so the shim applies once it ran."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_and_shim(module: Any) -> None:
                    exec_module(module)
                    _wrap(module)
                spec.loader.exec_module = exec_and_shim  # type: ignore[method-assign]
                return spec
        return None


def install() -> None:
    module = sys.modules.get(_MODULE)
    if module is not None:
        _wrap(module)
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def _wrap(flex: Any) -> None:
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
