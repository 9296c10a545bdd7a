"""neuron's Inductor codegen settings: a config module registered with
``register_backend_for_device``, which Inductor hashes into its FX graph
cache keys, so a cached graph is reused only with the codegen that made it."""
import hashlib
import os
import sys

from torch.utils._config_module import install_config_module


def _codegen_sources_hash() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in ("kernels.py", "wrapper.py", "aoti.py", "device_interface.py", "flex_attention.py",
                 "__init__.py"):
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


# The wrapper and kernel-module code of this version of torchneuron.
codegen_version: str = _codegen_sources_hash()

install_config_module(sys.modules[__name__])
