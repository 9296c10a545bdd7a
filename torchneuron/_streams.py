"""Streams and events for ``torch.neuron`` (backed by the C++ device guard)."""
from __future__ import annotations

from typing import Any, Optional

import torch

from . import _device

_NEURON_DEVICE_TYPE = None


def _device_type_int() -> int:
    global _NEURON_DEVICE_TYPE
    if _NEURON_DEVICE_TYPE is None:
        _NEURON_DEVICE_TYPE = torch.Stream(device="neuron").device_type
    return _NEURON_DEVICE_TYPE


class Stream(torch.Stream):
    """A neuron stream: an in-order queue of device work.

    ``priority``: lower numbers are higher priorities (as in CUDA); any integer is
    accepted and clamped to the device's range.
    """

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any):
        _device._lazy_init()
        if kwargs.get("stream_id") is not None:
            return super().__new__(cls, **kwargs)
        idx = _device._get_device_index(device)
        return super().__new__(cls, device=torch.device("neuron", idx), priority=priority)

    def wait_event(self, event: "torch.Event") -> None:
        event.wait(self)

    def wait_stream(self, stream: "torch.Stream") -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: Optional["torch.Event"] = None) -> "torch.Event":
        if event is None:
            event = Event()
        event.record(self)
        return event

    @property
    def priority(self) -> int:
        from . import _C

        return int(_C._stream_priority(self.stream_id, self.device_index))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, torch.Stream):
            return (self.stream_id, self.device_index, self.device_type) == (
                other.stream_id, other.device_index, other.device_type)
        return False

    def __hash__(self) -> int:
        return hash((self.stream_id, self.device_index, self.device_type))

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream device=neuron:{self.device_index} stream_id={self.stream_id}>"


class _EventMeta(type):
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "neuron"


class Event(metaclass=_EventMeta):
    """A neuron event: marks a point in a stream (timing off unless enable_timing).

    Instances are plain ``torch.Event`` objects on the neuron device (PyTorch's
    event methods accept only exact ``torch.Event`` arguments), and
    ``isinstance(e, torch.neuron.Event)`` holds for any neuron ``torch.Event``.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False) -> torch.Event:  # type: ignore[misc]
        _device._lazy_init()
        return torch.Event(device=torch.device("neuron", _device.current_device()),
                           enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def _wrap(stream: torch.Stream) -> Stream:
    return Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                  device_type=stream.device_type)


def current_stream(device: Any = None) -> Stream:
    """The calling thread's current stream on a neuron device."""
    _device._lazy_init()
    return _wrap(torch.accelerator.current_stream(_device._get_device_index(device)))


def default_stream(device: Any = None) -> Stream:
    """The default stream of a neuron device."""
    _device._lazy_init()
    idx = _device._get_device_index(device)
    return Stream(stream_id=0, device_index=idx, device_type=_device_type_int())


def set_stream(stream: Optional[torch.Stream]) -> None:
    """Make ``stream`` current (on its device) for the calling thread."""
    if stream is None:
        return
    _device._lazy_init()
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Selects a stream (and its device) for the duration of a ``with`` block."""

    def __init__(self, stream: Optional[torch.Stream]):
        self.stream = stream
        self._prev_device = -1
        self._prev_stream_on_dst: Optional[torch.Stream] = None
        self._prev_stream_on_src: Optional[torch.Stream] = None

    def __enter__(self):
        if self.stream is None:
            return self.stream
        _device._lazy_init()
        self._prev_device = _device.current_device()
        self._prev_stream_on_src = current_stream(self._prev_device)
        if self.stream.device_index != self._prev_device:
            self._prev_stream_on_dst = current_stream(self.stream.device_index)
        torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *args: Any) -> None:
        if self.stream is None:
            return
        if self._prev_stream_on_dst is not None:
            torch.accelerator.set_stream(self._prev_stream_on_dst)
        torch.accelerator.set_stream(self._prev_stream_on_src)
        _device.set_device(self._prev_device)


def stream(stream: Optional[torch.Stream]) -> StreamContext:
    """``with torch.neuron.stream(s):`` runs the block's device work on ``s``."""
    return StreamContext(stream)


def wait_stream(stream: torch.Stream) -> None:
    """Make the current stream wait for the work queued so far on ``stream``."""
    current_stream().wait_stream(stream)


def wait_event(event: torch.Event) -> None:
    """Make the current stream wait for ``event``'s latest record."""
    current_stream().wait_event(event)


def record_event(event: Optional[torch.Event] = None) -> torch.Event:
    """Record an event (a new one if None) on the current stream and return it."""
    return current_stream().record_event(event)


def query(device: Any = None) -> bool:
    """Whether all work queued on the current stream of a device has completed."""
    return current_stream(device).query()
