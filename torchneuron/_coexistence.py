"""One neuron backend per process: torchneuron or AWS's TorchNeuron.

Both packages provide the device ``neuron`` (PyTorch has one PrivateUse1 slot),
the c10d and Dynamo backends named ``neuron``, and a module that Hugging Face
looks for: accelerate and transformers enable their neuron code paths only
when ``importlib.util.find_spec("torch_neuronx")`` succeeds. So torchneuron
answers to that name with a compatibility module (``_torch_neuronx``, AWS's
documented top-level API over this package), and the rules below keep a
process from ever holding a mix of the two:

* torchneuron active: ``import torch_neuronx`` resolves to the compatibility
  module, also when AWS's package is installed (then one warning says so).
* AWS's ``torch_neuronx`` already imported: torchneuron does not load. An
  explicit ``import torchneuron`` raises; torch's autoload warns once and
  leaves the device to AWS's package.
* Both installed and torch's backend autoload on: AWS's package is the one
  used; torchneuron's autoload steps aside with one warning, whichever of the
  two entry points torch happens to run first (it does not promise an order).
  ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` and ``import torchneuron`` select
  torchneuron instead.
* ``TORCHNEURON_TORCH_NEURONX=0``: no compatibility module (tools that test
  for ``torch_neuronx`` then treat ``neuron`` as an unknown device).

The name is provided by a finder on ``sys.meta_path`` that answers only for
``torch_neuronx`` and its submodules, so nothing is written into
site-packages, where it would collide with AWS's files.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings

ALIAS = "torch_neuronx"
_TARGET = "torchneuron._torch_neuronx"
_SWITCH = "TORCHNEURON_TORCH_NEURONX"


def _autoloading() -> bool:
    """Whether torch's backend autoload (``torch._import_device_backends``) is importing us."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_import_device_backends" and frame.f_globals.get("__name__") == "torch":
            return True
        frame = frame.f_back
    return False


def _aws_module_loaded() -> bool:
    module = sys.modules.get(ALIAS)
    return module is not None and getattr(module, "__name__", "") != _TARGET


def _aws_installed_at() -> str | None:
    """Where AWS's ``torch_neuronx`` is installed (a module on sys.path), if it is."""
    spec = importlib.machinery.PathFinder.find_spec(ALIAS)
    if spec is None:
        return None
    return spec.origin or ", ".join(spec.submodule_search_locations or []) or ALIAS


_HOW_TO_SWITCH = (
    "To use torchneuron instead: set TORCH_DEVICE_BACKEND_AUTOLOAD=0 and `import torchneuron` "
    "before anything imports torch_neuronx, or `pip uninstall torch-neuronx`."
)


def should_load() -> bool:
    """Whether this import is to register torchneuron (see the module's rules)."""
    autoload = _autoloading()
    if _aws_module_loaded():
        message = (
            "AWS TorchNeuron (torch_neuronx) is already loaded in this process and owns the "
            "'neuron' device; torchneuron provides the same device and PyTorch has a single "
            "PrivateUse1 slot, so only one of the two can be used per process. "
        )
        if autoload:
            warnings.warn(message + "torchneuron stays inactive. " + _HOW_TO_SWITCH, UserWarning, 3)
            return False
        raise RuntimeError(message + _HOW_TO_SWITCH)
    aws = _aws_installed_at()
    if aws is not None:
        if autoload:
            warnings.warn(
                f"Both torchneuron and AWS TorchNeuron (torch_neuronx, at {aws}) are installed; "
                f"with torch's backend autoload the 'neuron' device is AWS's and torchneuron stays "
                f"inactive. {_HOW_TO_SWITCH}", UserWarning, 3)
            return False
        if os.environ.get(_SWITCH, "1") != "0":
            warnings.warn(
                f"torchneuron is the active 'neuron' backend; AWS TorchNeuron's torch_neuronx "
                f"(at {aws}) is installed but unused in this process: `import torch_neuronx` "
                f"gives torchneuron's compatibility module. Set {_SWITCH}=0 to not provide it.",
                UserWarning, 3)
    return True


class _AliasLoader(importlib.abc.Loader):
    """Makes ``torch_neuronx[.x]`` the very module object ``torchneuron._torch_neuronx[.x]``."""

    def __init__(self, target: str):
        self._target = target

    def create_module(self, spec):
        return importlib.import_module(self._target)

    def exec_module(self, module) -> None:
        pass  # the target module ran when it was imported


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != ALIAS and not name.startswith(ALIAS + "."):
            return None
        real = _TARGET + name[len(ALIAS):]
        real_spec = importlib.util.find_spec(real)
        if real_spec is None:
            return None
        return importlib.util.spec_from_loader(
            name, _AliasLoader(real), is_package=real_spec.submodule_search_locations is not None)


def provide_torch_neuronx() -> None:
    """Answer to ``torch_neuronx`` with the compatibility module (ahead of sys.path)."""
    if os.environ.get(_SWITCH, "1") == "0":
        return
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
