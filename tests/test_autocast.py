"""torch.autocast("neuron") with CUDA's op policies, and GradScaler("neuron").

Expected values are computed on CPU with the casts autocast should make,
written out explicitly, so a wrong policy shows up as a wrong dtype or bits.
"""
import pytest
import torch
import torch.nn.functional as F

import torchneuron  # noqa: F401

DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_lower_precision_ops_cast_down(dtype):
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    w, bias = torch.randn(4, 16), torch.randn(4)
    na, nb, nw, nbias = (t.to("neuron") for t in (a, b, w, bias))
    with torch.autocast("neuron", dtype=dtype):
        mm = na @ nb
        lin = F.linear(na, nw, nbias)
    assert mm.dtype == dtype and lin.dtype == dtype
    assert torch.equal(mm.cpu(), a.to(dtype) @ b.to(dtype))
    assert torch.equal(lin.cpu(), F.linear(a.to(dtype), w.to(dtype), bias.to(dtype)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp32_ops_cast_up(dtype):
    x = torch.randn(4, 10).to(dtype)
    nx = x.to("neuron")
    with torch.autocast("neuron", dtype=dtype):
        sm = torch.softmax(nx, dim=-1)  # fp32 with optional dtype
        ex = torch.exp(nx)              # fp32
        ln = F.layer_norm(nx, (10,))    # fp32
    for t in (sm, ex, ln):
        assert t.dtype == torch.float32
    assert torch.equal(sm.cpu(), torch.softmax(x.float(), dim=-1))
    assert torch.equal(ex.cpu(), torch.exp(x.float()))
    assert torch.equal(ln.cpu(), F.layer_norm(x.float(), (10,)))


def test_promote_and_untouched_ops():
    a = torch.randn(5).to("neuron")
    b = torch.randn(5).to("neuron").half()
    with torch.autocast("neuron", dtype=torch.float16):
        s = torch.addcmul(a, a, b)  # promote: widest input type
        r = torch.relu(b)           # not listed: runs in its input dtype
    assert s.dtype == torch.float32
    assert r.dtype == torch.float16


def test_autocast_state_and_nesting():
    assert not torch.is_autocast_enabled("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("neuron")
        assert torch.get_autocast_dtype("neuron") == torch.bfloat16
        with torch.autocast("neuron", enabled=False):
            x = torch.randn(3, 3, device="neuron")
            assert (x @ x).dtype == torch.float32
    assert not torch.is_autocast_enabled("neuron")


def test_binary_cross_entropy_is_refused_under_autocast():
    p = torch.rand(4, device="neuron")
    t = torch.rand(4, device="neuron")
    with torch.autocast("neuron", dtype=torch.float16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(p, t)
        F.binary_cross_entropy_with_logits(p, t)  # the safe form works


def test_backward_through_autocast_matches_cpu_math():
    torch.manual_seed(0)
    w = torch.randn(16, 8, requires_grad=True)
    x = torch.randn(4, 16)
    nw = w.detach().to("neuron").requires_grad_()
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = (x.to("neuron") @ nw).float().sum()
    out.backward()
    ref = (x.bfloat16() @ w.bfloat16()).float().sum()
    ref.backward()
    assert torch.equal(out.cpu(), ref.detach())
    assert nw.grad.dtype == torch.float32
    assert torch.equal(nw.grad.cpu(), w.grad)


def test_grad_scaler_matches_cpu():
    def run(device):
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 3).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10, growth_interval=2)
        scales = []
        for step in range(6):
            x = torch.randn(5, 6, generator=torch.Generator().manual_seed(step)).to(device)
            loss = model(x).pow(2).mean()
            if step == 3:
                loss = loss * float("inf")  # an overflowing step is skipped
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        return scales, [p.detach().cpu() for p in model.parameters()]

    cpu_scales, cpu_params = run("cpu")
    dev_scales, dev_params = run("neuron")
    assert dev_scales == cpu_scales
    assert cpu_scales[3] < cpu_scales[2]  # the inf step halved the scale
    for a, b in zip(dev_params, cpu_params):
        assert torch.equal(a, b)
