"""Philox generators: seeding, CUDA-layout state, offsets, torch.Generator('neuron')."""
import pytest
import torch

import torchneuron  # noqa: F401


def _draw(n=8, **kw):
    return torch.randn(n, device="neuron", **kw).cpu()


def test_manual_seed_is_reproducible_and_seed_dependent():
    torch.neuron.manual_seed(123)
    a = _draw()
    torch.neuron.manual_seed(123)
    b = _draw()
    torch.neuron.manual_seed(124)
    c = _draw()
    assert torch.equal(a, b) and not torch.equal(a, c)
    # Consecutive draws differ (the offset advances).
    assert not torch.equal(_draw(), _draw())


def test_torch_manual_seed_seeds_neuron():
    torch.manual_seed(7)
    a = _draw()
    torch.manual_seed(7)
    assert torch.equal(_draw(), a)
    assert torch.neuron.initial_seed() == 7


def test_state_layout_is_seed_then_offset():
    torch.neuron.manual_seed(42)
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    seed, offset = state.view(torch.int64).tolist()
    assert seed == 42 and offset == 0
    _draw()
    seed2, offset2 = torch.neuron.get_rng_state().view(torch.int64).tolist()
    assert seed2 == 42 and offset2 > 0


def test_set_rng_state_replays():
    torch.neuron.manual_seed(5)
    _draw()
    state = torch.neuron.get_rng_state()
    a = _draw()
    torch.neuron.set_rng_state(state)
    assert torch.equal(_draw(), a)
    # rewriting the offset tail (DTensor's OffsetBasedRNGTracker does this)
    st = state.clone()
    st.view(torch.int64)[1] += 4
    torch.neuron.set_rng_state(st)
    assert not torch.equal(_draw(), a)


def test_generator_objects():
    g = torch.Generator(device="neuron")
    assert g.device.type == "neuron"
    g.manual_seed(9)
    a = torch.rand(6, device="neuron", generator=g).cpu()
    g.manual_seed(9)
    default_before = torch.neuron.get_rng_state()
    b = torch.rand(6, device="neuron", generator=g).cpu()
    assert torch.equal(a, b)
    assert torch.equal(torch.neuron.get_rng_state(), default_before)  # untouched
    assert g.get_offset() > 0
    g.set_offset(0)
    assert torch.equal(torch.rand(6, device="neuron", generator=g).cpu(), a)
    g2 = torch.Generator(device="neuron")
    g2.set_state(g.get_state())
    assert torch.equal(torch.rand(6, device="neuron", generator=g2).cpu(),
                       torch.rand(6, device="neuron", generator=g).cpu())
    assert g.clone_state().get_state().numel() == 16


def test_per_device_generators(two_devices):
    torch.neuron.manual_seed_all(3)
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    torch.randn(4, device="neuron:1")
    assert torch.equal(torch.neuron.get_rng_state(0), states[0])
    assert not torch.equal(torch.neuron.get_rng_state(1), states[1])
    torch.neuron.set_rng_state_all(states)
    assert torch.equal(torch.neuron.get_rng_state(1), states[1])


def test_random_ops_on_device():
    torch.neuron.manual_seed(0)
    u = torch.rand(20000, device="neuron")
    assert u.device.type == "neuron"
    assert 0.45 < u.mean().item() < 0.55 and u.min().item() >= 0 and u.max().item() < 1
    n = torch.empty(20000, device="neuron").normal_(2.0, 3.0)
    assert 1.8 < n.mean().item() < 2.2 and 2.8 < n.std().item() < 3.2
    r = torch.randint(0, 10, (1000,), device="neuron")
    assert r.min().item() >= 0 and r.max().item() <= 9
    p = torch.randperm(50, device="neuron")
    assert sorted(p.cpu().tolist()) == list(range(50))
    b = torch.bernoulli(torch.full((4000,), 0.25, device="neuron"))
    assert 0.2 < b.mean().item() < 0.3
    x = torch.ones(1000, device="neuron")
    torch.neuron.manual_seed(1)
    d1 = torch.nn.functional.dropout(x, 0.5).cpu()
    torch.neuron.manual_seed(1)
    d2 = torch.nn.functional.dropout(x, 0.5).cpu()
    assert torch.equal(d1, d2) and set(d1.unique().tolist()) <= {0.0, 2.0}


def test_fork_rng_restores_neuron_state():
    torch.neuron.manual_seed(11)
    before = torch.neuron.get_rng_state()
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        _draw()
    assert torch.equal(torch.neuron.get_rng_state(), before)


def _seed_and_offset(device=None):
    return torch.neuron.get_rng_state(device if device is not None else "neuron").view(torch.int64).tolist()


def test_seed_and_seed_all():
    # seed(): a non-deterministic seed (53 random bits, as CUDA's) that is the
    # generator's real seed: initial_seed() reports it, the state starts at
    # offset 0, and manual_seed with it replays the same draws.
    torch.neuron.seed()
    s = torch.neuron.initial_seed()
    assert _seed_and_offset() == [s, 0]
    a = _draw()
    torch.neuron.manual_seed(s)
    assert torch.equal(_draw(), a)
    # A second seed() draws a new one (equal with probability 2**-53).
    torch.neuron.seed()
    s2 = torch.neuron.initial_seed()
    assert s2 != s and _seed_and_offset() == [s2, 0]
    # seed_all(): one new random seed on every device.
    torch.neuron.manual_seed_all(5)
    torch.neuron.seed_all()
    seeds = [_seed_and_offset(i) for i in range(torch.neuron.device_count())]
    assert seeds[0][0] not in (5, s, s2)
    assert seeds == [[seeds[0][0], 0]] * torch.neuron.device_count()
    assert torch.neuron.initial_seed() == seeds[0][0]
    with pytest.raises(RuntimeError):
        torch.neuron.set_rng_state(torch.zeros(3, dtype=torch.uint8))
