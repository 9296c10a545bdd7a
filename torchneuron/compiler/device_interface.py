"""Dynamo's view of the ``neuron`` device (``register_interface_for_device``):
how traced code and Inductor query devices, streams and events."""
from __future__ import annotations

import multiprocessing
from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface

from .. import _device, _streams


class _KernelProperties:
    """A neuron device's properties as Inductor reads them. The kernels run on
    the host's cores, so Inductor must size them as it does for CPU (the same
    reduction splits, hence the same bits): the host's processor count."""

    def __init__(self, props: Any) -> None:
        self._props = props
        self.multi_processor_count = multiprocessing.cpu_count()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._props, name)

    def __repr__(self) -> str:
        return repr(self._props)


class NeuronInterface(DeviceInterface):
    device = _device.device  # type: ignore[assignment]
    Event = _streams.Event  # type: ignore[assignment]
    Stream = _streams.Stream  # type: ignore[assignment]

    class Worker:
        # Asked from compile workers: answered without touching the device.
        @staticmethod
        def set_device(device: int) -> None:
            _device.set_device(device)

        @staticmethod
        def current_device() -> int:
            return _device.current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> Any:
            return _KernelProperties(_device.get_device_properties(device))

    @staticmethod
    def current_device() -> int:
        return _device.current_device()

    @staticmethod
    def set_device(device: torch.types.Device) -> None:
        _device.set_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        prev = _device.current_device()
        if device != prev:
            _device.set_device(device)
        return prev

    @staticmethod
    def exchange_device(device: int) -> int:
        return NeuronInterface.maybe_exchange_device(device)

    @staticmethod
    def device_count() -> int:
        return _device.device_count()

    @staticmethod
    def is_available() -> bool:
        return _device.is_available()

    @staticmethod
    def stream(stream: torch.Stream) -> Any:
        return _streams.stream(stream)

    @staticmethod
    def current_stream() -> torch.Stream:
        return _streams.current_stream()

    @staticmethod
    def set_stream(stream: torch.Stream) -> None:
        _streams.set_stream(stream)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        _streams.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                         device_type=device_type))

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return _streams.current_stream(device_idx).stream_id

    @staticmethod
    def synchronize(device: torch.types.Device = None) -> None:
        _device.synchronize(device)

    @classmethod
    def get_device_properties(cls, device: torch.types.Device = None) -> Any:
        return _KernelProperties(_device.get_device_properties(device))

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> Any:
        # Inductor keys caches on it; the kernels are the host CPU's.
        return "neuron-cpu"

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def is_dtype_supported(dtype: torch.dtype, including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def memory_allocated(device: torch.types.Device = None) -> int:
        return torch.neuron.memory_allocated(device)

    @staticmethod
    def is_triton_capable(device: torch.types.Device = None) -> bool:
        return False

    @classmethod
    def raise_if_triton_unavailable(cls, device: torch.types.Device = None) -> None:
        raise RuntimeError("neuron compiles with Inductor's C++ backend, not Triton")
