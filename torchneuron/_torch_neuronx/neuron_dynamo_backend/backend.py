"""``torch_neuronx.neuron_dynamo_backend.backend:neuron_backend``, AWS's entry point name."""
from torchneuron.compiler.backend import neuron as neuron_backend  # noqa: F401

__all__ = ["neuron_backend"]
