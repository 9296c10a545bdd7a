"""The first call of an argument kind is verified without waiting for the
device (on scratch memory with the same layouts and aliasing), and falls back
to an inline run on the real data, after a recorded wait, when the kernel
raises on zeros."""
import os
import time

import pytest
import torch

import torchneuron

blocking = pytest.mark.skipif(os.environ.get("NEURON_LAUNCH_BLOCKING") == "1",
                              reason="observes asynchrony")


def fresh(*shape):
    # A shape no other test uses, so the kind is new in this process.
    return torch.randn(*shape).to("neuron")


@blocking
def test_new_kind_is_queued_behind_busy_stream():
    x = fresh(3, 7, 11)
    torch.neuron.synchronize()
    torchneuron.clear_op_tracking()
    torch.neuron._sleep(1_000_000)
    t0 = time.perf_counter()
    y = torch.nn.functional.softplus(x, beta=2.5) * 3  # new kinds for softplus and mul
    host = time.perf_counter() - t0
    if host < 0.5:  # (a first Meta pass can be slow on a loaded machine)
        assert not torch.neuron.current_stream().query()
    assert torchneuron.get_host_waits() == []
    paths = torchneuron.get_op_paths()
    assert paths["aten::softplus"]["async"] == 1 and paths["aten::softplus"]["inline"] == 0
    ref = torch.nn.functional.softplus(x.cpu(), beta=2.5) * 3
    assert torch.equal(y.cpu(), ref)


def test_kernel_raising_on_zeros_verifies_on_the_real_data():
    # multinomial refuses an all-zero row, so its scratch run cannot tell; one-hot
    # rows make its draw deterministic, so the result can be compared.
    probs = torch.zeros(4, 6)
    probs[torch.arange(4), torch.tensor([1, 5, 0, 3])] = 1
    x = probs.to("neuron")
    g = torch.Generator("neuron").manual_seed(0)
    torch.neuron.synchronize()
    torchneuron.clear_op_tracking()
    r = torch.multinomial(x, 1, generator=g)
    waits = [(w["cause"], w["op"]) for w in torchneuron.get_host_waits()]
    assert waits == [("verification", "aten::multinomial")], waits
    assert torchneuron.get_op_paths()["aten::multinomial"]["inline"] == 1
    assert torch.equal(r.cpu(), torch.tensor([[1], [5], [0], [3]]))
    torchneuron.clear_op_tracking()
    torch.multinomial(x, 1, generator=g)  # the kind is verified now: queued
    assert torchneuron.get_host_waits() == []


def test_empty_tensors_verify_without_waiting():
    torch.neuron.synchronize()
    torchneuron.clear_op_tracking()
    z = torch.zeros(0, 9, device="neuron")
    e = torch.exp(z)
    assert torchneuron.get_host_waits() == []
    assert e.shape == (0, 9)
