"""PyTorch Lightning (and Lightning Fabric) on the ``neuron`` device.

Opt-in: ``import torchneuron.lightning`` (``torchneuron`` itself never imports
Lightning).  Importing this module registers, through Lightning's own
registries for third-party components:

* ``NeuronAccelerator`` as ``accelerator="neuron"`` in
  ``pytorch_lightning.accelerators.AcceleratorRegistry`` and in
  ``lightning_fabric.accelerators.ACCELERATOR_REGISTRY``;
* ``SingleNeuronStrategy`` as ``strategy="single_neuron"`` and
  ``NeuronDDPStrategy`` as ``strategy="ddp_neuron"`` in
  ``pytorch_lightning.strategies.StrategyRegistry`` (and
  ``FabricSingleNeuronStrategy`` under the same name in
  ``lightning_fabric.strategies.STRATEGY_REGISTRY``).

Usage::

    import torchneuron.lightning
    trainer = Trainer(accelerator="neuron", devices=1, strategy="single_neuron",
                      precision="bf16-mixed")           # one NeuronCore
    trainer = Trainer(accelerator="neuron", devices=2,  # DDP, "neuron" c10d backend
                      strategy="ddp_neuron")

What Lightning 2.6 decides by itself, and how this module deals with it
(no Lightning function or class is patched):

1. One device.  ``_AcceleratorConnector._choose_strategy`` builds
   ``SingleDeviceStrategy(device=...)`` from the accelerator's parallel devices
   only for cuda/gpu/mps (and tpu); for any other accelerator, ours included,
   it builds ``SingleDeviceStrategy(device="cpu")``.  No accelerator hook runs
   before that strategy hands ``cpu`` to ``Accelerator.setup_device`` (the
   accelerator never sees the strategy, and ``SingleDeviceStrategy`` has no
   public way to change its device afterwards), so ``accelerator="neuron"``
   with one device needs ``strategy="single_neuron"``: a registered
   ``SingleDeviceStrategy`` subclass whose device comes from the connector
   (it exposes ``parallel_devices``, which the connector fills in for any
   strategy that has the attribute), so ``devices=[1]`` runs on ``neuron:1``.
   Forgetting it is not silent: ``NeuronAccelerator.setup_device`` refuses a
   non-neuron device with a message naming the fix.

2. Several devices.  The connector picks ``"ddp"`` (``DDPStrategy``), whose
   device is ``parallel_devices[local_rank]`` and whose process-group backend
   is ``torch.distributed.Backend.default_device_backend_map["neuron"]``, i.e.
   our ``"neuron"`` c10d backend: that part needs nothing.  But
   ``DDPStrategy._setup_model`` builds ``DistributedDataParallel`` inside
   ``torch.cuda.stream(torch.cuda.Stream())`` whenever
   ``determine_ddp_device_ids()`` is not ``None``, which it is for every
   non-CPU device, so without a working CUDA runtime ``strategy="ddp"``
   crashes in torch.cuda before the first step.  ``strategy="ddp_neuron"`` is
   a registered ``DDPStrategy`` subclass whose ``determine_ddp_device_ids()``
   (a public ``DDPStrategy`` method) returns ``None`` for a neuron device, as
   DDP allows for a single-device module (Lightning moves every batch to the
   device itself); everything else is Lightning's DDP.  ``"ddp"`` and the
   default strategy on neuron are refused by ``NeuronAccelerator.setup`` with
   a message naming ``"ddp_neuron"`` (rather than the CUDA error), in every
   rank, before the model is wrapped.  Replacing the classes behind
   Lightning's built-in ``"ddp*"`` names (``StrategyRegistry.register(...,
   override=True)``) would make ``"ddp"`` work too, but it changes those
   names for every accelerator in the process, so it is not done.

3. Mixed precision.  ``_check_and_init_precision`` builds
   ``MixedPrecision(precision, device="cuda")`` for every accelerator other
   than cpu/mps, and ``torch.autocast("cuda")`` does nothing to neuron
   tensors: ``precision="bf16-mixed"`` would silently train in fp32.
   ``NeuronAccelerator.setup(trainer)`` replaces such a plugin with
   ``MixedPrecision(precision, device="neuron")`` (with a
   ``GradScaler("neuron")`` for ``"16-mixed"``), through the public
   ``Strategy.precision_plugin`` setter, the one the connector itself uses.
   Why this hook is legitimate: it is the documented per-accelerator hook
   "called by the Trainer to set up the accelerator before the model starts
   running on the device"; every strategy's ``setup`` (single device, DDP,
   ...) calls it first, before the plugin converts the module, wraps the
   optimizers or opens an autocast region, and before a checkpoint's precision
   state is restored (``restore_training_state`` runs after
   ``strategy.setup``), and it only changes what is wrong for this device
   (the autocast device type), keeping the user's precision choice.  A
   ``MixedPrecision`` subclass with a foreign device is refused instead of
   rebuilt.  Fabric has no such hook: ``FabricSingleNeuronStrategy`` rebuilds
   the plugin in its ``precision`` setter.

   Fabric is supported on one device only (``Fabric(accelerator="neuron",
   devices=1, strategy="single_neuron")``): Fabric's ``DDPStrategy.setup_module``
   opens the same CUDA stream, and no Fabric ``ddp_neuron`` is registered.

4. ``accelerator="auto"`` cannot pick neuron.
   ``lightning_fabric/utilities/device_parser.py::_select_auto_accelerator``
   (used by both the Trainer and Fabric connectors) returns the first of
   tpu/mps/cuda whose ``is_available()`` is true, else ``"cpu"``; it never
   consults the accelerator registry, so there is no hook.  The upstream change
   needed: let ``_select_auto_accelerator`` walk the registered accelerators
   (e.g. by an ``auto_select_priority`` the ``Accelerator`` class declares, or
   in registration order after the built-ins) and return the first available
   one; together with ``_choose_strategy`` using ``self._parallel_devices[0]``
   for every accelerator (its own TODO: "lazy initialized device") and
   ``_check_and_init_precision`` taking the autocast device type from
   ``self._parallel_devices[0].type`` instead of defaulting to ``"cuda"``,
   and ``DDPStrategy._setup_model`` opening a CUDA stream only when
   ``self.root_device.type == "cuda"``, this module would need neither
   ``"single_neuron"``/``"ddp_neuron"`` nor the precision-plugin replacement.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch

import torchneuron  # noqa: F401  (registers the device; normally autoloaded by torch)

import pytorch_lightning as pl
from lightning_fabric.accelerators import ACCELERATOR_REGISTRY as _FABRIC_ACCELERATOR_REGISTRY
from lightning_fabric.plugins.precision import MixedPrecision as _FabricMixedPrecision
from lightning_fabric.strategies import STRATEGY_REGISTRY as _FABRIC_STRATEGY_REGISTRY
from lightning_fabric.strategies import SingleDeviceStrategy as _FabricSingleDeviceStrategy
from pytorch_lightning.accelerators import Accelerator, AcceleratorRegistry
from pytorch_lightning.plugins.precision import MixedPrecision
from pytorch_lightning.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.rank_zero import rank_zero_info

__all__ = [
    "NeuronAccelerator",
    "SingleNeuronStrategy",
    "NeuronDDPStrategy",
    "FabricSingleNeuronStrategy",
]

_SINGLE_STRATEGY = "single_neuron"
_DDP_STRATEGY = "ddp_neuron"


def _visible() -> int:
    return torch.neuron.device_count()


def _parse_neuron_devices(devices: Any) -> list[int]:
    """``devices`` as Lightning accepts it -> a list of neuron device indices.

    int ``n`` (the first n devices), ``-1``/``"-1"``/``"auto"`` (all), a list
    or tuple of indices, a string of indices ``"0,1"`` / ``"1,"``, or a string
    count ``"2"``; every index is checked against ``torch.neuron.device_count()``.
    """
    original = devices
    count = _visible()
    hint = ("the number of visible neuron devices is set by NEURON_RT_NUM_CORES / "
            "NEURON_RT_VISIBLE_CORES")

    def bad(why: str) -> MisconfigurationException:
        return MisconfigurationException(
            f"Trainer(accelerator='neuron', devices={original!r}): {why}. "
            f"{count} neuron device(s) are visible (indices 0..{max(count - 1, 0)}); {hint}.")

    if isinstance(devices, str):
        text = devices.strip()
        if text in ("auto", "-1"):
            devices = -1
        elif "," in text:
            try:
                devices = [int(x) for x in text.split(",") if x.strip()]
            except ValueError:
                raise bad("expected comma-separated device indices") from None
        else:
            try:
                devices = int(text)
            except ValueError:
                raise bad("expected an int, a list of indices, 'auto' or '-1'") from None
    if isinstance(devices, bool):
        raise bad("expected an int, a list of indices, 'auto' or '-1'")
    if isinstance(devices, int):
        if devices == -1:
            indices = list(range(count))
        elif devices < 1:
            raise bad("the number of devices must be >= 1 (or -1 for all)")
        elif devices > count:
            raise bad(f"asks for {devices} devices")
        else:
            indices = list(range(devices))
    elif isinstance(devices, (list, tuple)):
        indices = []
        for d in devices:
            if isinstance(d, torch.device) and d.type == "neuron":
                d = 0 if d.index is None else d.index
            if isinstance(d, bool) or not isinstance(d, int):
                raise bad(f"device entry {d!r} is not an index")
            indices.append(d)
        if len(set(indices)) != len(indices):
            raise bad("device indices repeat")
    else:
        raise bad("expected an int, a list of indices, 'auto' or '-1'")
    if not indices:
        raise bad("no neuron device selected")
    missing = [i for i in indices if not 0 <= i < count]
    if missing:
        raise bad(f"neuron device(s) {missing} do not exist")
    return indices


class NeuronAccelerator(Accelerator):
    """Lightning accelerator for the ``neuron`` device (``accelerator="neuron"``)."""

    def setup_device(self, device: torch.device) -> None:
        device = torch.device(device)
        if device.type != "neuron":
            hint = ""
            if device.type == "cpu":
                hint = (
                    " With one device, Lightning's accelerator connector builds "
                    "SingleDeviceStrategy(device='cpu') for any accelerator other than "
                    "cuda/mps/tpu; select the neuron one with "
                    f"Trainer(accelerator='neuron', devices=1, strategy='{_SINGLE_STRATEGY}') "
                    "(registered by `import torchneuron.lightning`).")
            raise MisconfigurationException(
                f"NeuronAccelerator can only set up a neuron device, got {device}.{hint}")
        torch.neuron.set_device(device)

    def setup(self, trainer: "pl.Trainer") -> None:
        """Refuse a DDP strategy that would open a CUDA stream, and point a
        ``MixedPrecision`` plugin that Lightning built for another device
        (``"cuda"``) at ``torch.autocast("neuron")``; see the module docstring
        for why this hook is the place to do it."""
        strategy = trainer.strategy
        if isinstance(strategy, DDPStrategy) and strategy.determine_ddp_device_ids() is not None:
            raise MisconfigurationException(
                f"{type(strategy).__name__} (Lightning's 'ddp*' strategies, the default for several "
                "devices) builds DistributedDataParallel inside torch.cuda.stream(...) whenever "
                "it passes device_ids, as it does for every non-CPU device; on neuron use "
                f"Trainer(accelerator='neuron', devices=N, strategy='{_DDP_STRATEGY}') "
                "(registered by `import torchneuron.lightning`): the same DDP, with "
                "device_ids=None.")
        plugin = strategy.precision_plugin
        if not isinstance(plugin, MixedPrecision) or plugin.device == "neuron":
            return
        if type(plugin) is not MixedPrecision:
            raise MisconfigurationException(
                f"{type(plugin).__name__}(device={plugin.device!r}) would autocast on "
                f"{plugin.device!r} while the model runs on neuron; construct it with "
                "device='neuron'.")
        scaler = torch.amp.GradScaler("neuron") if plugin.precision == "16-mixed" else None
        strategy.precision_plugin = MixedPrecision(plugin.precision, device="neuron", scaler=scaler)
        rank_zero_info(
            f"torchneuron: precision={plugin.precision!r} autocasts on 'neuron' "
            f"(Lightning had chosen device={plugin.device!r}).")

    def teardown(self) -> None:
        if torch.neuron.is_initialized():
            torch.neuron.empty_cache()

    def get_device_stats(self, device: Union[str, torch.device, int]) -> dict[str, Any]:
        return torch.neuron.memory_stats(device)

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        return _parse_neuron_devices(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch.device("neuron", i) for i in _parse_neuron_devices(devices)]

    @staticmethod
    def auto_device_count() -> int:
        return _visible()

    @staticmethod
    def is_available() -> bool:
        return torch.neuron.is_available()

    @staticmethod
    def name() -> str:
        return "neuron"

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register(
            cls.name(), cls,
            description="torchneuron: software NeuronCore device 'neuron' (PrivateUse1)")


def _as_neuron_device(device: Any) -> torch.device:
    if isinstance(device, int) and not isinstance(device, bool):
        device = torch.device("neuron", device)
    device = torch.device(device)
    if device.type != "neuron":
        raise MisconfigurationException(
            f"strategy='{_SINGLE_STRATEGY}' runs on a neuron device, got {device}; "
            "use it with accelerator='neuron'.")
    return torch.device("neuron", 0 if device.index is None else device.index)


class _NeuronDeviceFromConnector:
    """The single device of a ``single_neuron`` strategy.

    Given as ``device=`` or, when ``None``, taken from the devices the
    connector parsed (``Trainer(devices=[1])`` -> ``neuron:1``): the connector
    assigns ``strategy.parallel_devices`` to any strategy that has that
    attribute and leaves it empty.
    """

    _neuron_device: Optional[torch.device]

    @property
    def root_device(self) -> torch.device:
        return self._neuron_device if self._neuron_device is not None else torch.device("neuron", 0)

    @property
    def parallel_devices(self) -> Optional[list[torch.device]]:
        return None if self._neuron_device is None else [self._neuron_device]

    @parallel_devices.setter
    def parallel_devices(self, devices: Optional[list[Any]]) -> None:
        devices = list(devices or [])
        if len(devices) != 1:
            raise MisconfigurationException(
                f"strategy='{_SINGLE_STRATEGY}' runs on exactly one neuron device, got "
                f"{len(devices)} ({[str(d) for d in devices]}); for several devices use "
                "strategy='ddp' (the default when devices > 1).")
        self._neuron_device = _as_neuron_device(devices[0])


class SingleNeuronStrategy(_NeuronDeviceFromConnector, SingleDeviceStrategy):
    """``strategy="single_neuron"``: one process on one neuron device."""

    strategy_name = _SINGLE_STRATEGY

    def __init__(self, device: Any = None, accelerator: Any = None,
                 checkpoint_io: Any = None, precision_plugin: Any = None) -> None:
        self._neuron_device = None if device is None else _as_neuron_device(device)
        super().__init__(device=self.root_device, accelerator=accelerator,
                         checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            cls.strategy_name, cls,
            description="One neuron device (the device comes from Trainer(devices=...))")


class NeuronDDPStrategy(DDPStrategy):
    """``strategy="ddp_neuron"``: Lightning's DDP (one process per neuron
    device, "neuron" c10d backend) without the CUDA stream that
    ``DDPStrategy`` opens around ``DistributedDataParallel`` for device_ids."""

    strategy_name = _DDP_STRATEGY

    def determine_ddp_device_ids(self) -> Optional[list[int]]:
        if self.root_device.type == "neuron":
            return None
        return super().determine_ddp_device_ids()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            cls.strategy_name, cls,
            description="DDP on neuron devices (\"neuron\" c10d backend, start_method 'popen')",
            start_method="popen")


class FabricSingleNeuronStrategy(_NeuronDeviceFromConnector, _FabricSingleDeviceStrategy):
    """``Fabric(accelerator="neuron", strategy="single_neuron")``.

    Its ``precision`` setter rebuilds a ``MixedPrecision`` that the Fabric
    connector made for ``"cuda"`` as one for ``"neuron"`` (Fabric's
    accelerators have no ``setup(trainer)`` hook to do it).
    """

    def __init__(self, device: Any = None, accelerator: Any = None,
                 checkpoint_io: Any = None, precision: Any = None) -> None:
        self._neuron_device = None if device is None else _as_neuron_device(device)
        super().__init__(device=self.root_device, accelerator=accelerator,
                         checkpoint_io=checkpoint_io, precision=precision)

    @_FabricSingleDeviceStrategy.precision.setter
    def precision(self, precision: Any) -> None:
        if (type(precision) is _FabricMixedPrecision and precision.device != "neuron"):
            scaler = torch.amp.GradScaler("neuron") if precision.precision == "16-mixed" else None
            precision = _FabricMixedPrecision(precision.precision, device="neuron", scaler=scaler)
        self._precision = precision

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            _SINGLE_STRATEGY, cls,
            description="One neuron device (the device comes from Fabric(devices=...))")


def _register() -> None:
    # Idempotent: a second import (importlib.reload, or both registries already
    # holding the names) must not raise "already present in the registry".
    for registry in (AcceleratorRegistry, _FABRIC_ACCELERATOR_REGISTRY):
        if NeuronAccelerator.name() not in registry:
            NeuronAccelerator.register_accelerators(registry)
    if _SINGLE_STRATEGY not in StrategyRegistry:
        SingleNeuronStrategy.register_strategies(StrategyRegistry)
    if _DDP_STRATEGY not in StrategyRegistry:
        NeuronDDPStrategy.register_strategies(StrategyRegistry)
    if _SINGLE_STRATEGY not in _FABRIC_STRATEGY_REGISTRY:
        FabricSingleNeuronStrategy.register_strategies(_FABRIC_STRATEGY_REGISTRY)


_register()
