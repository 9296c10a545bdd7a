"""PyTorch Lightning / Fabric on neuron (torchneuron.lightning), bit for bit against CPU.

Every training test runs the same tiny model (tests/ecosystem/lightning_ddp.py:
2-layer MLP, SGD with momentum, 6 steps, data from a seeded torch.Generator)
once with ``accelerator="neuron"`` and once with ``accelerator="cpu"``, checks
that each run really ran where it says (device of the batch and weights inside
the step, strategy, backend), and requires every step's loss and the final
parameters to be bitwise equal.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

import torchneuron.lightning as tnl  # noqa: E402
from lightning_fabric.utilities.distributed import _get_default_process_group_backend_for_device  # noqa: E402
from pytorch_lightning.strategies import DDPStrategy, SingleDeviceStrategy  # noqa: E402
from pytorch_lightning.utilities.exceptions import MisconfigurationException  # noqa: E402

from conftest import plain_pass_only  # noqa: E402
from tests.distributed.launcher import free_port  # noqa: E402
from tests.ecosystem.lightning_ddp import STEPS, fit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "ecosystem" / "lightning_ddp.py"

needs_two = pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs two neuron devices")


def assert_same_training(a: dict, b: dict) -> None:
    assert len(a["losses"]) == len(b["losses"]) == STEPS
    for i, (x, y) in enumerate(zip(a["losses"], b["losses"])):
        assert torch.equal(x, y), f"step {i}: loss {x.item()!r} != {y.item()!r}"
    assert a["params"].keys() == b["params"].keys()
    for name in a["params"]:
        assert torch.equal(a["params"][name], b["params"][name]), f"parameter {name} differs"


def ran_on(result: dict, device_type: str) -> None:
    assert len(result["steps"]) == STEPS
    for step in result["steps"]:
        assert step["batch"] == step["weight"] == device_type, step


@functools.cache
def single(accelerator: str, precision: str = "32-true") -> dict:
    """One single-device run (cached: the fp32 runs also serve the bf16 test)."""
    strategy = "single_neuron" if accelerator == "neuron" else "auto"
    expect = (accelerator, torch.bfloat16) if precision == "bf16-mixed" else None
    return fit(accelerator, devices=1, strategy=strategy, precision=precision, expect=expect,
               default_root_dir=tempfile.gettempdir())


def test_registered():
    from lightning_fabric.accelerators import ACCELERATOR_REGISTRY
    from lightning_fabric.strategies import STRATEGY_REGISTRY
    from pytorch_lightning.accelerators import AcceleratorRegistry
    from pytorch_lightning.strategies import StrategyRegistry

    assert AcceleratorRegistry["neuron"]["accelerator"] is tnl.NeuronAccelerator
    assert ACCELERATOR_REGISTRY["neuron"]["accelerator"] is tnl.NeuronAccelerator
    assert StrategyRegistry["single_neuron"]["strategy"] is tnl.SingleNeuronStrategy
    assert StrategyRegistry["ddp_neuron"]["strategy"] is tnl.NeuronDDPStrategy
    assert STRATEGY_REGISTRY["single_neuron"]["strategy"] is tnl.FabricSingleNeuronStrategy
    # registration is idempotent (a second import must not raise "already present")
    tnl._register()


def test_single_device_fp32_bitwise():
    neuron, cpu = single("neuron"), single("cpu")
    ran_on(neuron, "neuron")
    ran_on(cpu, "cpu")
    assert neuron["strategy"] == "SingleNeuronStrategy" and neuron["root_device"] == "neuron:0"
    assert not any(s["autocast"] for s in neuron["steps"])
    assert_same_training(neuron, cpu)


def test_bf16_mixed_autocasts_on_neuron():
    # The step asserts torch.is_autocast_enabled("neuron") and a bf16 Linear
    # output itself (MLP.expect); the record confirms it ran on every step.
    neuron, cpu = single("neuron", "bf16-mixed"), single("cpu", "bf16-mixed")
    ran_on(neuron, "neuron")
    ran_on(cpu, "cpu")
    assert neuron["precision_plugin"] == ("MixedPrecision", "neuron") and not neuron["scaler_enabled"]
    assert cpu["precision_plugin"] == ("MixedPrecision", "cpu")
    for step in neuron["steps"] + cpu["steps"]:
        assert step["autocast"] and step["linear_dtype"] == torch.bfloat16, step
    # Real bf16 math: not the fp32 run's losses.
    fp32 = single("neuron")
    assert not torch.equal(neuron["losses"][0], fp32["losses"][0])
    # autocast("neuron") follows CUDA's op lists, autocast("cpu") its own; they
    # differ in general (e.g. which ops run in fp32), but for this model's ops
    # (linear: bf16 on both; relu: untouched; mse_loss: fp32 on both) the same
    # math runs, so CPU's bf16-mixed run is matched bit for bit.
    assert_same_training(neuron, cpu)


def test_single_device_without_strategy_fails_clearly(tmp_path):
    # Lightning's connector builds SingleDeviceStrategy(device="cpu") for a
    # third-party accelerator with one device; it must not train on CPU silently.
    trainer = pl.Trainer(accelerator="neuron", devices=1, max_steps=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    assert type(trainer.strategy) is SingleDeviceStrategy and trainer.strategy.root_device.type == "cpu"
    from tests.ecosystem.lightning_ddp import make_loader, make_model
    with pytest.raises(MisconfigurationException, match="strategy='single_neuron'"):
        trainer.fit(make_model(), make_loader(8))


@needs_two
def test_single_neuron_takes_device_from_devices(tmp_path):
    trainer = pl.Trainer(accelerator="neuron", devices=[1], strategy="single_neuron",
                         logger=False, default_root_dir=tmp_path)
    assert trainer.strategy.root_device == torch.device("neuron", 1)
    with pytest.raises(MisconfigurationException, match="exactly one neuron device"):
        pl.Trainer(accelerator="neuron", devices=2, strategy="single_neuron",
                   logger=False, default_root_dir=tmp_path)


@needs_two
@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_default_and_plain_ddp_use_neuron_backend_but_need_ddp_neuron(strategy, tmp_path):
    trainer = pl.Trainer(accelerator="neuron", devices=2, strategy=strategy,
                         logger=False, default_root_dir=tmp_path)
    ddp = trainer.strategy
    assert type(ddp) is DDPStrategy
    assert ddp.parallel_devices == [torch.device("neuron", 0), torch.device("neuron", 1)]
    assert ddp.root_device == torch.device("neuron", 0)
    assert _get_default_process_group_backend_for_device(ddp.root_device) == "neuron"
    assert ddp._get_process_group_backend() == "neuron"
    # DDPStrategy would wrap the model in torch.cuda.stream(...) (device_ids is
    # set for every non-CPU device): NeuronAccelerator.setup refuses it clearly,
    # in every rank, before the model is wrapped.
    assert ddp.determine_ddp_device_ids() == [0]
    with pytest.raises(MisconfigurationException, match="strategy='ddp_neuron'"):
        ddp.accelerator.setup(trainer)
    neuron_ddp = pl.Trainer(accelerator="neuron", devices=2, strategy="ddp_neuron",
                            logger=False, default_root_dir=tmp_path).strategy
    assert isinstance(neuron_ddp, tnl.NeuronDDPStrategy)
    assert neuron_ddp.determine_ddp_device_ids() is None
    assert neuron_ddp._get_process_group_backend() == "neuron"


@plain_pass_only
@needs_two
def test_ddp_two_processes_bitwise(tmp_path):
    env = dict(os.environ, MASTER_PORT=str(free_port()), LIGHTNING_TEST_PORT2=str(free_port()),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for var in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "GROUP_RANK"):
        env.pop(var, None)
    log = tmp_path / "ranks.log"
    with open(log, "w") as out:
        # Its own session: on a hang, the whole group (rank 0 and the rank 1
        # that Lightning's launcher starts) is killed.
        proc = subprocess.Popen([sys.executable, str(WORKER), str(tmp_path)], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            pytest.fail(f"DDP runs hung (240 s):\n{log.read_text()[-4000:]}")
    assert rc == 0, log.read_text()[-4000:]
    results = {(acc, rank): torch.load(tmp_path / f"{acc}_rank{rank}.pt", weights_only=False)
               for acc in ("neuron", "cpu") for rank in (0, 1)}
    for rank in (0, 1):
        neuron, cpu = results["neuron", rank], results["cpu", rank]
        assert not neuron["lightning_preimported"], "import torch/torchneuron imported Lightning"
        assert (neuron["global_rank"], neuron["world_size"]) == (rank, 2)
        assert (cpu["global_rank"], cpu["world_size"]) == (rank, 2)
        assert neuron["strategy"] == "NeuronDDPStrategy" and neuron["backend"] == "neuron"
        assert neuron["root_device"] == f"neuron:{rank}"
        assert cpu["strategy"] == "DDPStrategy" and cpu["backend"] == "gloo"
        ran_on(neuron, "neuron")
        ran_on(cpu, "cpu")
        assert_same_training(neuron, cpu)
    # The ranks saw different shards but end with the same (all-reduced) parameters.
    assert not torch.equal(results["neuron", 0]["losses"][0], results["neuron", 1]["losses"][0])
    for name, value in results["neuron", 0]["params"].items():
        assert torch.equal(value, results["neuron", 1]["params"][name]), name


def test_bad_devices_are_clear_errors(tmp_path):
    count = torch.neuron.device_count()
    with pytest.raises(MisconfigurationException, match=r"neuron device\(s\) \[5\] do not exist"):
        pl.Trainer(accelerator="neuron", devices=[5], logger=False, default_root_dir=tmp_path)
    with pytest.raises(MisconfigurationException, match=f"asks for {count + 1} devices"):
        pl.Trainer(accelerator="neuron", devices=count + 1, logger=False, default_root_dir=tmp_path)
    for bad in ("0,x", "many", [0, 0], 1.5, True):
        with pytest.raises(MisconfigurationException, match="accelerator='neuron'"):
            tnl.NeuronAccelerator.parse_devices(bad)
    with pytest.raises(MisconfigurationException, match="got cpu"):
        tnl.NeuronAccelerator().setup_device(torch.device("cpu"))
    with pytest.raises(MisconfigurationException, match="runs on a neuron device"):
        tnl.SingleNeuronStrategy(device="cpu")


def test_parse_devices():
    parse = tnl.NeuronAccelerator.parse_devices
    count = torch.neuron.device_count()
    assert parse(1) == [0]
    assert parse(-1) == parse("-1") == parse("auto") == list(range(count))
    assert parse("1") == [0]
    assert parse([0]) == parse("0,") == [0]
    assert tnl.NeuronAccelerator.get_parallel_devices([0]) == [torch.device("neuron", 0)]
    assert tnl.NeuronAccelerator.auto_device_count() == count
    assert tnl.NeuronAccelerator.is_available()
    if count >= 2:
        assert parse("0,1") == [0, 1] and parse([1]) == [1]
    stats = tnl.NeuronAccelerator().get_device_stats(torch.device("neuron", 0))
    assert "allocated_bytes.all.current" in stats and set(stats) == set(torch.neuron.memory_stats(0))


def test_auto_accelerator_does_not_select_neuron(tmp_path):
    """Documents a limitation: lightning_fabric's _select_auto_accelerator only
    knows tpu/mps/cuda/cpu (no registry hook), so "auto" never picks neuron
    even when it is available.  If this starts failing, Lightning gained a
    hook: use it and update torchneuron/lightning.py and the README."""
    from lightning_fabric.utilities.device_parser import _select_auto_accelerator

    assert tnl.NeuronAccelerator.is_available()
    assert _select_auto_accelerator() != "neuron"
    trainer = pl.Trainer(accelerator="auto", devices=1, logger=False, default_root_dir=tmp_path)
    assert not isinstance(trainer.accelerator, tnl.NeuronAccelerator)


def test_fabric_single_neuron_bf16_bitwise():
    from lightning_fabric import Fabric

    def run(accelerator: str) -> tuple[list[torch.Tensor], dict, list]:
        strategy = "single_neuron" if accelerator == "neuron" else "auto"
        fabric = Fabric(accelerator=accelerator, devices=1, strategy=strategy, precision="bf16-mixed")
        fabric.launch()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        seen = []
        model[0].register_forward_hook(lambda m, i, o: seen.append(
            (o.device.type, torch.is_autocast_enabled(o.device.type), o.dtype)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, optimizer = fabric.setup(model, optimizer)
        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(4):
            x, y = torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g)
            x, y = fabric.to_device((x, y))
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            losses.append(loss.detach().cpu())
        return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}, seen

    (nl, np_, nseen), (cl, cp, cseen) = run("neuron"), run("cpu")
    assert nseen == [("neuron", True, torch.bfloat16)] * 4
    assert cseen == [("cpu", True, torch.bfloat16)] * 4
    assert all(torch.equal(a, b) for a, b in zip(nl, cl)), (nl, cl)
    assert all(torch.equal(np_[k], cp[k]) for k in cp)


def test_fp16_mixed_matches_torch_amp_recipe(tmp_path):
    """precision="16-mixed" on neuron is fp16 autocast + GradScaler("neuron")
    (Lightning would build both for "cuda"); CPU has no fp16 AMP in Lightning
    (it switches to bf16), so the reference is the plain torch AMP loop on
    neuron that Lightning's MixedPrecision plugin performs."""
    from tests.ecosystem.lightning_ddp import make_loader, make_model

    result = fit("neuron", devices=1, strategy="single_neuron", precision="16-mixed",
                 expect=("neuron", torch.float16), default_root_dir=tmp_path)
    assert result["precision_plugin"] == ("MixedPrecision", "neuron") and result["scaler_enabled"]
    ran_on(result, "neuron")

    model = make_model().to("neuron")
    optimizer = model.configure_optimizers()
    scaler = torch.amp.GradScaler("neuron")
    losses = []
    for x, y in make_loader(STEPS * 8):
        x, y = x.to("neuron"), y.to("neuron")
        optimizer.zero_grad()
        with torch.autocast("neuron", dtype=torch.float16, cache_enabled=False):
            out = model.fc2(torch.relu(model.fc1(x)))
            loss = torch.nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.detach().cpu())
    reference = {"losses": losses, "params": {k: v.cpu() for k, v in model.state_dict().items()}}
    assert_same_training(result, reference)
