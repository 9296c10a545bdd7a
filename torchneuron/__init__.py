"""torchneuron: the ``neuron`` device for stock PyTorch (PrivateUse1 backend).

Loaded automatically by ``import torch`` through the ``torch.backends`` entry
point (disable with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); importing it
explicitly is also fine. Code written for AWS's TorchNeuron finds this
package's compatibility module under its name, ``torch_neuronx``; when AWS's
package is present too, ``_coexistence`` decides which of the two a process
uses (README, "AWS TorchNeuron and `torch_neuronx`").
"""
from __future__ import annotations

import os
import sys

__version__ = "0.1.0"

if "torch" not in sys.modules:
    # Importing torch would autoload us again while this import is running.
    _saved = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    try:
        import torch
    finally:
        if _saved is None:
            os.environ.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
        else:
            os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = _saved

from . import _coexistence  # noqa: E402

# False only when torch's autoload reaches us while AWS's TorchNeuron owns the
# device: the package then stays inert (and says so once).
_active = _coexistence.should_load()
if _active:
    from ._load import *  # noqa: E402,F401,F403
    from ._load import __all__  # noqa: E402,F401

    _coexistence.provide_torch_neuronx()


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: importing this package did the work."""
