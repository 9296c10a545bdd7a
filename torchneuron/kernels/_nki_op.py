"""``nki_op``: a custom kernel as a PyTorch op (AWS TorchNeuron's name and semantics).

``@nki_op("mylib::name", mutates_args=...)`` over a typed Python function is
``torch.library.custom_op`` with the function as both the implementation and
the fake (shape) implementation: the function allocates its outputs with
torch and launches ``Kernel`` objects on them; under fake tensors (inside
``torch.compile``) the launches do nothing, so the op traces without a graph
break and Inductor calls it at run time. Autograd: ``op.register_autograd``.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable


def nki_op(name: str, fn: Callable[..., Any] | None = None, /, *,
           mutates_args: str | Iterable[str] = (), schema: str | None = None) -> Any:
    import torch

    def wrap(function: Callable[..., Any]) -> Any:
        op = torch.library.custom_op(name, function, mutates_args=mutates_args, schema=schema)
        op.register_fake(function)
        return op

    return wrap if fn is None else wrap(fn)
