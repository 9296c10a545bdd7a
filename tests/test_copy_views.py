"""Host/device/device copies, views, resize_, set_ and scalar reads."""
import pytest
import torch

import torchneuron
from conftest import assert_same, requires_async

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int8, torch.uint8, torch.bool, torch.complex64]


def _sample(dtype, shape=(5, 7)):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip(dtype):
    cpu = _sample(dtype)
    x = cpu.to("neuron")
    assert x.device.type == "neuron" and x.dtype == dtype
    assert torch.equal(x.cpu(), cpu)


def test_noncontiguous_host_to_device_and_back():
    cpu = torch.randn(6, 8)
    t = cpu.t()
    x = t.to("neuron")
    assert x.stride() == t.clone().stride()  # preserve_format, as CPU's own copy
    assert torch.equal(x.cpu(), t)
    sliced = torch.randn(10, 10)[::2, 1::3]
    assert torch.equal(sliced.to("neuron").cpu(), sliced)
    # device non-contiguous -> host
    d = torch.randn(8, 8).to("neuron")
    assert torch.equal(d.t().cpu(), d.cpu().t())
    assert torch.equal(d[1::2, ::3].cpu(), d.cpu()[1::2, ::3])


def test_converting_copies():
    cpu = torch.randn(4, 5) * 10
    dst = torch.empty(4, 5, dtype=torch.int32, device="neuron")
    dst.copy_(cpu)  # host float -> device int
    assert torch.equal(dst.cpu(), cpu.to(torch.int32))
    back = torch.empty(4, 5, dtype=torch.float64)
    back.copy_(dst)  # device int -> host double
    assert torch.equal(back, cpu.to(torch.int32).to(torch.float64))
    x = cpu.to("neuron")
    h = x.to(torch.float16)  # device -> device with conversion
    assert h.device.type == "neuron"
    assert torch.equal(h.cpu(), cpu.to(torch.float16))
    strided_dst = torch.zeros(5, 4, device="neuron").t()
    strided_dst.copy_(x)  # device -> device into a transposed view
    assert torch.equal(strided_dst.cpu(), cpu)


def test_broadcasting_copy():
    dst = torch.zeros(3, 4, device="neuron")
    dst.copy_(torch.arange(4.0))
    assert torch.equal(dst.cpu(), torch.arange(4.0).expand(3, 4))
    dst2 = torch.zeros(3, 4, device="neuron")
    dst2.copy_(torch.arange(4.0, device="neuron"))
    assert torch.equal(dst2.cpu(), torch.arange(4.0).expand(3, 4))


def test_cross_device_copies(two_devices):
    cpu = torch.randn(16, 16)
    x0 = cpu.to("neuron:0")
    x1 = x0.to("neuron:1")
    assert x1.device == torch.device("neuron", 1)
    assert torchneuron._C._pointer_device(x1.data_ptr()) == 1
    assert torch.equal(x1.cpu(), cpu)
    y1 = x0.t().to("neuron:1", dtype=torch.float64)
    assert torch.equal(y1.cpu(), cpu.t().double())


def test_non_blocking_copies_with_pinned_memory():
    cpu = torch.randn(1 << 16).pin_memory()
    x = cpu.to("neuron", non_blocking=True)
    out = torch.empty_like(cpu).pin_memory()
    out.copy_(x + 1, non_blocking=True)
    torch.neuron.current_stream().synchronize()
    assert torch.equal(out, cpu + 1)


def test_views_share_device_memory():
    cpu = torch.arange(24.0).reshape(4, 6)
    x = cpu.to("neuron")
    views = {
        "view": (x.view(6, 4), cpu.view(6, 4)),
        "reshape": (x.reshape(2, 12), cpu.reshape(2, 12)),
        "t": (x.t(), cpu.t()),
        "narrow": (x.narrow(1, 2, 3), cpu.narrow(1, 2, 3)),
        "slice": (x[1:3, ::2], cpu[1:3, ::2]),
        "select": (x[2], cpu[2]),
        "as_strided": (x.as_strided((3, 3), (2, 1), 1), cpu.as_strided((3, 3), (2, 1), 1)),
        "expand": (x[0:1].expand(3, 6), cpu[0:1].expand(3, 6)),
        "unsqueeze": (x.unsqueeze(1), cpu.unsqueeze(1)),
        "permute": (x.view(2, 2, 6).permute(2, 0, 1), cpu.view(2, 2, 6).permute(2, 0, 1)),
        "diagonal": (x.diagonal(), cpu.diagonal()),
        "unfold": (x.unfold(1, 2, 2), cpu.unfold(1, 2, 2)),
    }
    for name, (v, c) in views.items():
        assert v.device.type == "neuron", name
        assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr(), name
        assert v.stride() == c.stride() and v.storage_offset() == c.storage_offset(), name
        assert torch.equal(v.cpu(), c), name


def test_in_place_through_a_view_updates_the_base():
    cpu = torch.zeros(4, 4)
    x = cpu.to("neuron")
    x[1:3, 1:3].fill_(5)
    x.diagonal().add_(1)
    x[:, 0].mul_(0)
    cpu[1:3, 1:3].fill_(5)
    cpu.diagonal().add_(1)
    cpu[:, 0].mul_(0)
    assert torch.equal(x.cpu(), cpu)


def test_resize_keeps_contents():
    cpu = torch.arange(6.0)
    x = cpu.to("neuron")
    x.resize_(4, 4)
    assert x.shape == (4, 4) and x.device.type == "neuron"
    assert torch.equal(x.cpu().flatten()[:6], cpu)
    x.resize_(2)
    assert torch.equal(x.cpu(), cpu[:2])
    y = torch.empty(0, device="neuron")
    y.resize_(3, 5, memory_format=torch.contiguous_format)
    assert y.shape == (3, 5) and y.is_contiguous()


def test_set_overloads():
    src = torch.arange(12.0).to("neuron")
    t = torch.empty(0, device="neuron")
    t.set_(src)
    assert t.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
    assert torch.equal(t.cpu(), torch.arange(12.0))
    u = torch.empty(0, device="neuron")
    u.set_(src.untyped_storage(), 2, (2, 3), (3, 1))
    assert torch.equal(u.cpu(), torch.arange(12.0)[2:8].view(2, 3))
    w = torch.empty(0, device="neuron")
    w.set_(src.untyped_storage())
    assert w.numel() == 12
    src.set_()
    assert src.numel() == 0 and src.device.type == "neuron"
    assert torch.equal(u.cpu(), torch.arange(12.0)[2:8].view(2, 3))  # storage still alive


def test_item_and_scalars():
    for dtype, value in ((torch.float32, 2.5), (torch.int64, -7), (torch.bool, True),
                         (torch.float16, 0.5), (torch.complex64, 1 + 2j)):
        x = torch.tensor([value], dtype=dtype).to("neuron")
        assert x.item() == value
        assert x[0].item() == value
    x = torch.arange(10, device="neuron")
    assert int(x[7]) == 7 and float(x.sum()) == 45.0
    with pytest.raises(RuntimeError):
        x.item()


def test_conj_and_neg_views():
    cpu = torch.randn(3, dtype=torch.complex64)
    x = cpu.to("neuron")
    assert torch.equal(x.conj().cpu(), cpu.conj())
    assert torch.equal(x.conj().resolve_conj().cpu(), cpu.conj())
    assert_same(x.conj() * 2, cpu.conj() * 2)


def test_empty_tensors():
    x = torch.empty(0, 3, device="neuron")
    assert x.cpu().shape == (0, 3)
    y = torch.randn(0).to("neuron")
    assert y.numel() == 0
    assert torch.cat([y, torch.ones(2, device="neuron")]).cpu().tolist() == [1.0, 1.0]


def test_clone_and_contiguous():
    cpu = torch.randn(5, 6)
    x = cpu.to("neuron")
    c = x.t().contiguous()
    assert c.is_contiguous() and c.device.type == "neuron"
    assert torch.equal(c.cpu(), cpu.t().contiguous())
    d = x.clone()
    assert d.data_ptr() != x.data_ptr() and torch.equal(d.cpu(), cpu)


@requires_async
def test_non_blocking_upload_from_pageable_memory_is_staged_not_waited():
    cpu = torch.randn(1000)
    torch.neuron._sleep(200_000)  # the stream is busy
    x = cpu.to("neuron", non_blocking=True)
    assert not torch.neuron.current_stream().query()  # the host did not wait
    expected = cpu.clone()
    cpu.fill_(-1.0)  # the source may be reused at once: the data was staged
    assert torch.equal(x.cpu(), expected)
