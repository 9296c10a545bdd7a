"""The ecosystem picks `neuron` by itself: Hugging Face (transformers, accelerate,
PEFT, safetensors) and code written for AWS's TorchNeuron (`torch_neuronx`).

Each run on neuron is compared with the same run on CPU: losses and parameters
bitwise. Lightning has its own file (test_lightning.py)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import plain_pass_only
from ecosystem.models import state_on_cpu, tiny_llama, token_rows

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("NEURON_LAUNCH_BLOCKING", None)
    env.update(extra)
    return env


def _run(code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-c", textwrap.dedent(code)], env=_env(**env), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"parameters differ from the CPU run: {different[:5]}"


@pytest.fixture
def fresh_accelerate_state():
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(True)
    PartialState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    PartialState._reset_state()



# --- torch_neuronx: the compatibility module and the one-backend rule --------

def test_torch_neuronx_is_torchneurons_compatibility_module():
    import importlib.util

    import torch_neuronx
    import torchneuron._torch_neuronx as compat
    import torchneuron.kernels

    assert importlib.util.find_spec("torch_neuronx") is not None
    assert torch_neuronx is compat
    x = torch.ones(1024, device="neuron")
    assert torch_neuronx.memory_allocated() == torch.neuron.memory_allocated() > 0
    assert torch_neuronx.memory_stats()["allocated_bytes.all.current"] > 0
    torch_neuronx.synchronize()
    torch_neuronx.clear_op_tracking()
    (x + 1).sum().item()
    assert "aten::add.Tensor" in torch_neuronx.get_executed_ops()
    assert torch_neuronx.is_neuron_runtime_initialized()
    assert isinstance(torch_neuronx.Stream(), torch.neuron.Stream)
    assert torch_neuronx.nki_op is torchneuron.kernels.nki_op
    with pytest.raises(AttributeError, match="NKI"):
        torch_neuronx.wrap_nki
    from torch_neuronx.neuron_dynamo_backend import NEFFCompilationError, set_model_name
    from torch_neuronx.neuron_dynamo_backend.backend import neuron_backend
    from torchneuron.compiler.backend import neuron

    assert neuron_backend is neuron and issubclass(NEFFCompilationError, RuntimeError)
    set_model_name(None)


def test_hugging_face_sees_the_neuron_device(fresh_accelerate_state):
    from accelerate.utils import is_neuron_available
    from transformers.utils.import_utils import (
        is_torch_bf16_gpu_available, is_torch_neuron_available, is_torch_neuroncore_available)

    assert is_neuron_available() and is_torch_neuron_available()
    assert is_torch_bf16_gpu_available()
    assert not is_torch_neuroncore_available()  # the legacy torch-xla path stays off
    from accelerate import Accelerator

    accelerator = Accelerator()
    assert accelerator.device == torch.device("neuron") and accelerator.num_processes == 1


@pytest.fixture(scope="module")
def fake_aws_package(tmp_path_factory) -> Path:
    """A stand-in for AWS's torch-neuronx: a module of that name on sys.path."""
    root = tmp_path_factory.mktemp("aws")
    package = root / "torch_neuronx"
    package.mkdir()
    (package / "__init__.py").write_text("AWS_PACKAGE = True\n")
    return root


def _with_aws(root: Path, **env: str) -> dict[str, str]:
    path = os.pathsep.join((str(ROOT), str(root)))
    return dict(env, PYTHONPATH=path)


@plain_pass_only
def test_aws_installed_autoload_leaves_the_device_to_aws(fake_aws_package):
    result = _run("""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        import torch_neuronx, torchneuron
        messages = [str(w.message) for w in caught if "torch_neuronx" in str(w.message)]
        print(len(messages), getattr(torch_neuronx, "AWS_PACKAGE", False), hasattr(torch, "neuron"),
              torchneuron._active)
        print(messages[0])
        """, **_with_aws(fake_aws_package))
    assert result.returncode == 0, result.stderr
    first, message = result.stdout.splitlines()[:2]
    assert first == "1 True False False"
    assert "AWS's and torchneuron stays inactive" in message
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in message and "pip uninstall torch-neuronx" in message


@plain_pass_only
def test_aws_installed_explicit_import_selects_torchneuron(fake_aws_package):
    result = _run("""
        import warnings
        import torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torchneuron
        import torch_neuronx
        print(getattr(torch_neuronx, "AWS_PACKAGE", False), torch.neuron.is_available(),
              torch.ones(2, device="neuron").sum().item())
        print([str(w.message) for w in caught if "torch_neuronx" in str(w.message)][0])
        """, **_with_aws(fake_aws_package, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    assert result.returncode == 0, result.stderr
    first, message = result.stdout.splitlines()[:2]
    assert first == "False True 2.0"
    assert "torchneuron is the active 'neuron' backend" in message
    assert str(fake_aws_package) in message


@plain_pass_only
@pytest.mark.parametrize("autoload", ["1", "0"])
def test_aws_module_already_imported(fake_aws_package, autoload):
    result = _run("""
        import warnings
        warnings.simplefilter("always")
        import torch_neuronx
        import torch
        try:
            import torchneuron
            print("loaded", torchneuron._active, hasattr(torch, "neuron"))
        except RuntimeError as error:
            print("raised", error)
        """, **_with_aws(fake_aws_package, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload))
    assert result.returncode == 0, result.stderr
    out = result.stdout.strip()
    if autoload == "1":  # torch's autoload: a warning, and torchneuron inert
        assert out == "loaded False False"
        assert "already loaded in this process" in result.stderr
    else:  # an explicit import: the error says which backend owns the device
        assert out.startswith("raised AWS TorchNeuron (torch_neuronx) is already loaded")
        assert "only one of the two can be used per process" in out


@plain_pass_only
def test_compatibility_module_can_be_turned_off():
    result = _run("""
        import importlib.util, torch
        print(importlib.util.find_spec("torch_neuronx"), torch.neuron.is_available())
        """, TORCHNEURON_TORCH_NEURONX="0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None True"


# --- Hugging Face Trainer -----------------------------------------------------

def _train_with_trainer(tmp_path, use_cpu: bool, **arguments):
    from transformers import Trainer, TrainingArguments

    model = tiny_llama()
    data = [{"input_ids": row, "labels": row.clone()} for row in token_rows(40)]
    losses, seen = [], []

    class Recording(Trainer):
        def compute_loss(self, model, inputs, **kwargs):
            out = super().compute_loss(model, inputs, **kwargs)
            losses.append((out[0] if isinstance(out, tuple) else out).detach())
            return out

    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(
        lambda module, args, out: seen.append(
            (out.device.type, out.dtype, torch.is_autocast_enabled(out.device.type))))
    # PyTorch's and transformers' defaults: AdamW, a linear LR schedule with
    # decay, gradient clipping; only the length of the run and the output are set.
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=5,
                             per_device_train_batch_size=8, report_to="none",
                             save_strategy="no", disable_tqdm=True, use_cpu=use_cpu, **arguments)
    Recording(model=model, args=args, train_dataset=data).train()
    hook.remove()
    return args.device, [l.cpu() for l in losses], state_on_cpu(model), seen


@plain_pass_only
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_trainer_default_arguments_train_on_neuron(tmp_path, fresh_accelerate_state, bf16):
    device, losses, params, seen = _train_with_trainer(tmp_path, use_cpu=False, bf16=bf16)
    assert device == torch.device("neuron", 0)
    assert seen[0] == ("neuron", torch.bfloat16 if bf16 else torch.float32, bf16)
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(True)
    PartialState._reset_state()
    cpu_device, cpu_losses, cpu_params, cpu_seen = _train_with_trainer(
        tmp_path, use_cpu=True, bf16=bf16)
    assert cpu_device.type == "cpu" and cpu_seen[0][0] == "cpu"
    assert len(losses) == 5
    # bf16: the linear layers run in bf16 under both autocasts (the same
    # kernels on the same bf16 inputs), so the steps agree bit for bit too.
    assert all(torch.equal(a, b) for a, b in zip(losses, cpu_losses)), (losses, cpu_losses)
    _assert_same_state(params, cpu_params)


# --- accelerate launch: two processes on two neuron devices -------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(command: list[str], out: Path, **env: str) -> dict:
    result = subprocess.run(command + ["-m", "tests.ecosystem.accelerate_train", str(out)],
                            env=_env(**env), cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return torch.load(out)


@plain_pass_only
def test_accelerate_launch_two_processes_match_cpu_gloo(tmp_path):
    bindir = Path(PYTHON).parent
    neuron = _launch([str(bindir / "accelerate"), "launch", "--num_processes", "2",
                      "--main_process_port", str(_free_port())], tmp_path / "neuron.pt")
    assert neuron["distributed_type"] == "DistributedType.MULTI_NEURON"
    assert neuron["num_processes"] == 2
    assert neuron["device_type"] == "neuron" and neuron["device_indices"] == [0, 1]
    cpu = _launch([str(bindir / "torchrun"), "--standalone", "--nproc-per-node", "2"],
                  tmp_path / "cpu.pt", ACCELERATE_USE_CPU="true")
    assert cpu["distributed_type"] == "DistributedType.MULTI_CPU" and cpu["device_type"] == "cpu"
    assert neuron["losses"].numel() == 8
    assert torch.equal(neuron["losses"], cpu["losses"]), (neuron["losses"], cpu["losses"])
    _assert_same_state(neuron["params"], cpu["params"])


# --- device_map, generate(), PEFT, safetensors --------------------------------

@pytest.fixture(scope="module")
def saved_tiny_llama(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama().save_pretrained(path)
    return path


def test_device_map_auto_places_the_model_by_free_memory(saved_tiny_llama):
    import torchneuron.ecosystem
    from transformers import AutoModelForCausalLM

    budget = torchneuron.ecosystem.max_memory()
    assert set(budget) >= {0, 1} and all(budget[i] > 0 for i in (0, 1))
    placed = AutoModelForCausalLM.from_pretrained(
        saved_tiny_llama, device_map="auto", max_memory=budget)
    # transformers' "auto" is accelerate's balanced placement over the budget.
    assert {p.device.type for p in placed.parameters()} == {"neuron"}
    # A small budget on device 0 puts the later layers on device 1.
    layer_bytes = sum(p.numel() * 4 for p in placed.model.layers[0].parameters())
    embed_bytes = sum(p.numel() * 4 for p in placed.model.embed_tokens.parameters())
    split = AutoModelForCausalLM.from_pretrained(
        saved_tiny_llama, device_map="auto",
        max_memory={0: embed_bytes + layer_bytes + 1024, 1: budget[1]})
    assert {p.device for p in split.parameters()} == {torch.device("neuron", i) for i in (0, 1)}
    cpu = AutoModelForCausalLM.from_pretrained(saved_tiny_llama)
    prompt = token_rows(2, length=5, seed=3)
    expected = cpu.generate(prompt, max_new_tokens=6, do_sample=False)
    for model in (placed, split):
        tokens = model.generate(prompt.to("neuron:0"), max_new_tokens=6, do_sample=False)
        assert torch.equal(tokens.cpu(), expected)
    with torch.no_grad():
        assert torch.equal(split(prompt.to("neuron:0")).logits.cpu(), cpu(prompt).logits)


def test_device_map_auto_alone_is_cpu_today(saved_tiny_llama):
    """accelerate's get_max_memory has no neuron branch: README says to pass max_memory.
    When accelerate learns the device this fails, and the README should change."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(saved_tiny_llama, device_map="auto")
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_peft_lora_trains_bitwise_like_cpu():
    peft = pytest.importorskip("peft")

    def train(device: str):
        model = peft.get_peft_model(
            tiny_llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                          lora_dropout=0.0, init_lora_weights="gaussian"))
        model.to(device)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        losses = []
        for batch in token_rows(12).to(device).split(4):
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach().cpu())
        return losses, state_on_cpu(model)

    torch.manual_seed(5)
    losses, params = train("neuron")
    torch.manual_seed(5)
    cpu_losses, cpu_params = train("cpu")
    assert all(torch.equal(a, b) for a, b in zip(losses, cpu_losses))
    _assert_same_state(params, cpu_params)
    assert any("lora_" in k for k in params)


def test_safetensors_loads_onto_neuron_by_index(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    from safetensors import SafetensorError

    tensors = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.arange(3, dtype=torch.int64)}
    path = tmp_path / "t.safetensors"
    safetensors_torch.save_file(tensors, path)
    loaded = safetensors_torch.load_file(path, device=1)
    assert {v.device for v in loaded.values()} == {torch.device("neuron", 1)}
    assert all(torch.equal(loaded[k].cpu(), tensors[k]) for k in tensors)
    # safetensors' own device parser knows a fixed list of device names (the
    # README's workaround is the index; the upstream change is to accept the
    # PrivateUse1 backend's name). When it learns "neuron", this fails.
    with pytest.raises(SafetensorError, match="invalid"):
        safetensors_torch.load_file(path, device="neuron")


# --- MFU: the device's peak FLOPS -------------------------------------------

def test_peak_flops_are_measured_on_the_device():
    import time

    props = torch.neuron.get_device_properties(0)
    fp32, bf16 = props.peak_flops_fp32, props.peak_flops_bf16
    assert props.peak_flops_fp32 == fp32  # measured once per process
    # The same matmul on the host's CPU backend, measured here: the software
    # core runs on those cores, so its peak is of the same order (the bounds
    # are wide because both are timings on a possibly busy machine).
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.3:
        a @ b
        count += 1
    cpu = 2.0 * 1024 ** 3 * count / (time.perf_counter() - start)
    assert 0.2 < fp32 / cpu < 5, (fp32, cpu)
    assert bf16 > 0
