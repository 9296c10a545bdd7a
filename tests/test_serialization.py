"""torch.save / torch.load of neuron tensors, modules and storages."""
import io
import warnings

import torch

import torchneuron  # noqa: F401
from conftest import assert_same


def _roundtrip(obj, **load_kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kw)


def test_tensor_roundtrip_keeps_device():
    cpu = torch.randn(4, 5)
    x = cpu.to("neuron")
    y = _roundtrip(x)
    assert y.device == torch.device("neuron", 0)
    assert torch.equal(y.cpu(), cpu)


def test_map_location_cpu_and_other_device(two_devices):
    cpu = torch.randn(3, 3)
    x = cpu.to("neuron:0")
    y = _roundtrip(x, map_location="cpu")
    assert y.device.type == "cpu" and torch.equal(y, cpu)
    z = _roundtrip(x, map_location="neuron:1")
    assert z.device == torch.device("neuron", 1) and torch.equal(z.cpu(), cpu)
    w = _roundtrip(x.to("neuron:1"))
    assert w.device == torch.device("neuron", 1)


def test_shared_storage_is_preserved():
    base = torch.arange(10.0).to("neuron")
    views = {"a": base[2:6], "b": base.view(2, 5)}
    out = _roundtrip(views)
    assert out["a"].untyped_storage().data_ptr() == out["b"].untyped_storage().data_ptr()
    out["b"].zero_()
    assert out["a"].cpu().tolist() == [0.0] * 4


def test_module_state_dict_roundtrip():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).to("neuron")
    sd = _roundtrip(m.state_dict())
    for k, v in m.state_dict().items():
        assert sd[k].device.type == "neuron"
        assert torch.equal(sd[k].cpu(), v.cpu()), k
    m2 = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    m2.load_state_dict(_roundtrip(m.state_dict(), map_location="cpu"))
    x = torch.randn(3, 4)
    m.eval(), m2.eval()
    assert_same(m(x.to("neuron")), m2(x))


def test_storage_roundtrip():
    s = torch.arange(6, dtype=torch.float32).to("neuron").untyped_storage()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage deprecation
        s2 = _roundtrip(s)
        assert s2.device.type == "neuron"
    assert s2.cpu().tolist() == s.cpu().tolist()
    assert len(s.cpu().tolist()) == 24
