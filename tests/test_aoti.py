"""AOTInductor on neuron: torch.export, aoti_compile_and_package, aoti_load_package.

Reference: the same model exported on CPU and compiled by AOTInductor for CPU
(same inputs, same Inductor configuration); the neuron package runs the same
generated kernels, so the outputs are bitwise equal where Inductor lowers
both devices the same way (the models here avoid the few lowerings it makes
by device type: see test_compile.py). A neuron package's call is one queued
work item ("aoti::<model>"): the host does not wait behind a busy stream.
"""
import time

import pytest
import torch
import torch.nn as nn

import torchneuron
from conftest import compile_heavy as heavy, requires_async

N = torch.device("neuron")
# torch 2.14 precompiles a header named after the package's device, which it
# ships only for its own devices (torchneuron/compiler/aoti.py).
CONFIGS = {"aot_inductor.precompile_headers": False}



def _bitwise(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.detach().cpu().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))


def _package(model, args, path, dynamic_shapes=None):
    ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
    return torch._inductor.aoti_load_package(torch._inductor.aoti_compile_and_package(
        ep, package_path=str(path), inductor_configs=CONFIGS))


def _both(make, args, tmp_path, name, dynamic_shapes=None):
    """(neuron package, CPU package) of the same weights."""
    torch.manual_seed(0)
    cpu_model = make()
    neuron_model = make().to(N)
    neuron_model.load_state_dict(cpu_model.state_dict())
    on_neuron = _package(neuron_model, tuple(a.to(N) for a in args),
                         tmp_path / f"{name}_neuron.pt2", dynamic_shapes)
    on_cpu = _package(cpu_model, args, tmp_path / f"{name}_cpu.pt2", dynamic_shapes)
    return on_neuron, on_cpu


class MLP(nn.Module):
    """Linear layers, GELU, pointwise ops, and a view of the input as an output."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return torch.relu(self.l2(nn.functional.gelu(self.l1(x)))) * 2 + 1, x[1:]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return _both(MLP, (torch.randn(4, 16),), tmp_path_factory.mktemp("aoti"), "mlp")


def test_package_runs_on_neuron_bitwise_as_cpus(mlp):
    on_neuron, on_cpu = mlp
    assert on_neuron.get_metadata()["AOTI_DEVICE_KEY"] == "neuron"
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    xn = x.to(N)
    out, view = on_neuron(xn)
    ref_out, ref_view = on_cpu(x)
    assert out.device.type == "neuron" and view.device.type == "neuron"
    assert _bitwise(out, ref_out) and _bitwise(view, ref_view)
    # An output that is a view of an input stays one, as on CPU.
    assert view.untyped_storage().data_ptr() == xn.untyped_storage().data_ptr()
    assert view.storage_offset() == xn.storage_offset() + 16
    xn.add_(1)
    assert _bitwise(view, x[1:] + 1)


def test_inputs_must_be_neuron_tensors(mlp):
    on_neuron, _ = mlp
    with pytest.raises(RuntimeError, match=r"input 0 is on cpu.*\.to\('neuron'\)"):
        on_neuron(torch.randn(4, 16))
    out, _ = on_neuron(torch.ones(4, 16, device=N))  # the device keeps working
    assert out.device.type == "neuron"


@requires_async
def test_a_call_is_queued_behind_a_busy_stream(mlp):
    on_neuron, on_cpu = mlp
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    xn = x.to(N)
    on_neuron(xn)  # layouts learned for this input layout
    torch.neuron.synchronize()
    torchneuron.clear_op_tracking()
    torchneuron.clear_host_waits()
    torch.neuron._sleep(500_000)
    start = time.perf_counter()
    out, _ = on_neuron(xn)
    elapsed = time.perf_counter() - start
    still_busy = not torch.neuron.current_stream().query()
    assert elapsed < 0.25, f"the host waited {elapsed:.3f} s behind the stream"
    assert still_busy
    assert torchneuron.host_wait_counts() == {}
    assert torchneuron.get_op_paths()["aoti::model"]["async"] == 1
    assert _bitwise(out, on_cpu(x)[0])


@heavy
def test_dynamic_batch_each_shape_bitwise(tmp_path):
    on_neuron, on_cpu = _both(MLP, (torch.randn(4, 16),), tmp_path, "dyn",
                              dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    g = torch.Generator().manual_seed(3)
    for n in (4, 9, 33, 9):
        x = torch.randn(n, 16, generator=g)
        got, ref = on_neuron(x.to(N)), on_cpu(x)
        assert all(_bitwise(a, b) for a, b in zip(got, ref)), n


class Select(nn.Module):
    """An output whose size depends on the input's values."""

    def forward(self, x):
        return x[x > 0] * 2, x.sin()


@heavy
def test_value_dependent_output_shapes_run_after_a_host_wait(tmp_path):
    on_neuron, on_cpu = _both(Select, (torch.randn(5, 7),), tmp_path, "select")
    for seed in (0, 1):
        x = torch.randn(5, 7, generator=torch.Generator().manual_seed(seed))
        torchneuron.clear_host_waits()
        got, ref = on_neuron(x.to(N)), on_cpu(x)
        assert all(_bitwise(a, b) for a, b in zip(got, ref))
        assert torchneuron.host_wait_counts().get("data_dependent") == 1


class Cholesky(nn.Module):
    """Raises on zero-filled inputs (not positive-definite)."""

    def forward(self, a):
        return torch.linalg.cholesky(a) + 1


@heavy
def test_a_model_that_raises_on_zeros_learns_from_one_real_run(tmp_path):
    a = torch.randn(4, 4, generator=torch.Generator().manual_seed(4))
    a = a @ a.T + 4 * torch.eye(4)
    on_neuron, on_cpu = _both(Cholesky, (a,), tmp_path, "cholesky")
    torchneuron.clear_host_waits()
    assert _bitwise(on_neuron(a.to(N)), on_cpu(a))
    assert torchneuron.host_wait_counts().get("verification") == 1
    torchneuron.clear_host_waits()
    got = on_neuron(a.to(N))
    assert "verification" not in torchneuron.host_wait_counts()
    assert _bitwise(got, on_cpu(a))


class Gather(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(10, 4)

    def forward(self, idx):
        return self.table(idx) * 3


@heavy
def test_a_failing_run_is_reported_naming_the_model(tmp_path):
    on_neuron, on_cpu = _both(Gather, (torch.tensor([1, 2, 3]),), tmp_path, "gather")
    idx = torch.tensor([1, 2, 3])
    assert _bitwise(on_neuron(idx.to(N)), on_cpu(idx))
    on_neuron(torch.tensor([1, 99, 3], device=N))
    with pytest.raises(RuntimeError, match=r"aoti::model.*out of bounds|out of bounds.*aoti::model"):
        torch.neuron.synchronize()
    assert _bitwise(on_neuron(idx.to(N)), on_cpu(idx))  # the device keeps working


def test_compiling_without_the_setting_says_what_to_pass(tmp_path):
    ep = torch.export.export(MLP().to(N), (torch.randn(4, 16, device=N),))
    with pytest.raises(Exception, match=r"aot_inductor\.precompile_headers"):
        torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "m.pt2"))


def test_jit_cpp_wrapper_is_refused_with_a_reason():
    f = torch.compile(lambda x: x.sin() + 1, options={"cpp_wrapper": True})
    with pytest.raises(Exception, match=r"cpp_wrapper=True is not supported for neuron"):
        f(torch.randn(8, device=N))


@heavy
def test_load_constants_takes_cpu_tensors(tmp_path):
    on_neuron, on_cpu = _both(MLP, (torch.randn(4, 16),), tmp_path, "weights")
    names = on_neuron.get_constant_fqns()
    assert names == on_cpu.get_constant_fqns()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 16, generator=g)
    before = on_neuron(x.to(N))[0].cpu()
    new = {k: torch.randn(v.shape, generator=g) for k, v in MLP().state_dict().items()
           if k in names}
    for package in (on_neuron, on_cpu):
        package.load_constants(new, check_full_update=True)
    got, ref = on_neuron(x.to(N)), on_cpu(x)
    assert not torch.equal(got[0].cpu(), before)
    assert all(_bitwise(a, b) for a, b in zip(got, ref))
