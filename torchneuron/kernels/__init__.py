"""Custom kernels on neuron: C++ against a small ABI, launched as queued work items.

* ``cpp_kernel(source, name)`` / ``load_kernel(path, name)``: a ``Kernel``
  (``_kernel.py``; the ABI is ``torchneuron_kernel.h``, ``include_dir()``).
* ``nki_op("lib::name", mutates_args=...)``: a Python function launching
  kernels, as a PyTorch op (eager, autograd, ``torch.compile``).
* The kernel library (each forward and backward, float32 and bfloat16):
  ``rms_norm`` (fused RMSNorm), ``rotary_embedding`` (Hugging Face Llama's
  rotary position embedding, bit for bit in float32) and ``attention``
  (tiled, FlashAttention-style scaled dot-product attention).

``examples/custom_kernel.py`` writes a first kernel end to end.
"""
from ._kernel import Kernel, cpp_kernel, include_dir, load_kernel
from ._nki_op import nki_op


def __getattr__(name: str):
    # The library's kernels load on first use (reading and registering their ops).
    if name == "rms_norm":
        from ._rms_norm import rms_norm

        return rms_norm
    if name == "rotary_embedding":
        from ._rotary import rotary_embedding

        return rotary_embedding
    if name == "attention":
        from ._attention import attention

        return attention
    raise AttributeError(f"module 'torchneuron.kernels' has no attribute '{name}'")


__all__ = ["Kernel", "attention", "cpp_kernel", "include_dir", "load_kernel", "nki_op", "rms_norm",
           "rotary_embedding"]
