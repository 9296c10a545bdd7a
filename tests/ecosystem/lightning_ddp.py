"""Tiny Lightning training runs shared by tests/test_lightning.py, and its DDP worker.

As a script (``python tests/ecosystem/lightning_ddp.py OUTDIR``, with
MASTER_PORT and LIGHTNING_TEST_PORT2 set) it is rank 0 of two 2-process DDP
runs: Lightning's subprocess launcher re-runs this script as rank 1.  Both
processes first train with ``Trainer(accelerator="neuron", devices=2,
strategy="ddp_neuron")`` (the "neuron" c10d backend), destroy that process group,
then train the same model with ``Trainer(accelerator="cpu", devices=2,
strategy="ddp")`` (Gloo) on a second port; each rank saves what it saw to
OUTDIR/<accelerator>_rank<r>.pt.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import torchneuron  # noqa: F401  (autoloaded by torch already)

# `import torch` / `import torchneuron` must not pull Lightning in.
LIGHTNING_PREIMPORTED = "pytorch_lightning" in sys.modules or "lightning_fabric" in sys.modules

import pytorch_lightning as pl  # noqa: E402

import torchneuron.lightning  # noqa: E402,F401  (registers accelerator="neuron" and its strategies)

STEPS = 6
BATCH = 8


class MLP(pl.LightningModule):
    """2-layer MLP; records every step's loss and, per step, where it ran and
    what autocast did to its first Linear.  With ``expect=(device_type,
    dtype)`` the step itself asserts that autocast is on for that device type
    and that the Linear output has that dtype."""

    def __init__(self, lr: float = 0.1, expect: tuple[str, torch.dtype] | None = None) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 1)
        self.lr = lr
        self.expect = expect
        self.losses: list[torch.Tensor] = []
        self.steps: list[dict] = []
        self.backend: str | None = None

    def on_train_start(self) -> None:
        if torch.distributed.is_initialized():
            self.backend = str(torch.distributed.get_backend())

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = self.fc1(x)
        kind = x.device.type
        if self.expect is not None:
            assert torch.is_autocast_enabled(self.expect[0]), f"autocast({self.expect[0]!r}) is off"
            assert h.dtype == self.expect[1], f"Linear output is {h.dtype}"
        self.steps.append({"batch": kind, "weight": self.fc1.weight.device.type,
                           "autocast": torch.is_autocast_enabled(kind), "linear_dtype": h.dtype})
        out = self.fc2(torch.relu(h))
        loss = F.mse_loss(out.float(), y)
        self.losses.append(loss.detach().clone())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def make_model(seed: int = 0, **kwargs) -> MLP:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MLP(**kwargs)


def make_loader(samples: int, seed: int = 1) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 8, generator=g)
    y = torch.randn(samples, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=False)


def fit(accelerator: str, samples: int = STEPS * BATCH, expect=None, **trainer_kwargs) -> dict:
    """Train a fresh MLP for STEPS steps; losses, final parameters (CPU copies) and context."""
    model = make_model(expect=expect)
    trainer = pl.Trainer(
        accelerator=accelerator, max_steps=STEPS, max_epochs=1,
        enable_checkpointing=False, logger=False, enable_progress_bar=False,
        enable_model_summary=False, **trainer_kwargs)
    trainer.fit(model, make_loader(samples))
    plugin = trainer.strategy.precision_plugin
    return {
        "losses": [loss.cpu() for loss in model.losses],
        "params": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "steps": list(model.steps),
        "strategy": type(trainer.strategy).__name__,
        "root_device": str(trainer.strategy.root_device),
        "precision_plugin": (type(plugin).__name__, getattr(plugin, "device", None)),
        "scaler_enabled": getattr(plugin, "scaler", None) is not None and plugin.scaler.is_enabled(),
        "world_size": trainer.world_size,
        "global_rank": trainer.global_rank,
        "backend": model.backend,
        "lightning_preimported": LIGHTNING_PREIMPORTED,
    }


def main(outdir: str) -> None:
    for accelerator in ("neuron", "cpu"):
        if accelerator == "cpu":
            # A fresh group on a fresh port for the Gloo run (each rank does the same).
            os.environ["MASTER_PORT"] = os.environ["LIGHTNING_TEST_PORT2"]
        # 2 ranks x STEPS batches: each rank's DistributedSampler shard is STEPS batches.
        strategy = "ddp_neuron" if accelerator == "neuron" else "ddp"
        result = fit(accelerator, samples=2 * STEPS * BATCH, devices=2, strategy=strategy,
                     default_root_dir=outdir)
        torch.save(result, os.path.join(outdir, f"{accelerator}_rank{result['global_rank']}.pt"))
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
