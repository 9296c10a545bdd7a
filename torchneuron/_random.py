"""Random number generation state for ``torch.neuron``.

Each device has a default Philox generator whose state is 16 bytes, uint64
seed then int64 offset (CUDA's layout).
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from . import _C, _device


def _generator(device: Any = None) -> torch.Generator:
    idx = _device._get_device_index(device)
    return _C._get_default_generator(idx)


def get_rng_state(device: Any = "neuron") -> torch.Tensor:
    _device._lazy_init()
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(_device.device_count())]


def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    _device._lazy_init()
    new_state = new_state.clone(memory_format=torch.contiguous_format)
    _generator(device).set_state(new_state)


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    """Seed the current neuron device's default generator."""
    seed = int(seed)
    if _device.device_count() == 0:
        return
    _generator(None).manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seed the default generator of every neuron device."""
    seed = int(seed)
    for i in range(_device.device_count()):
        _generator(i).manual_seed(seed)


def seed() -> None:
    """Seed the current device's default generator with a random number."""
    if _device.device_count() == 0:
        return
    _generator(None).seed()


def seed_all() -> None:
    """Seed every device's default generator with one random number."""
    if _device.device_count() == 0:
        return
    s = _generator(0).seed()
    for i in range(1, _device.device_count()):
        _generator(i).manual_seed(s)


def initial_seed() -> int:
    """The seed of the current neuron device's default generator."""
    _device._lazy_init()
    return _generator(None).initial_seed()
