"""Storage sizes: negative or huge sizes raise as on CPU, never alias other memory."""
import pytest
import torch

NEGATIVE = [-1, -2, -255, -256, -510, -511, -512, -4096, -(2**40)]


def _fresh_pair():
    a = torch.full((64,), 1.0, device="neuron")
    b = torch.full((64,), 2.0, device="neuron")
    return a, b


@pytest.mark.parametrize("n", NEGATIVE)
def test_negative_untyped_storage_raises_like_cpu(n):
    with pytest.raises(RuntimeError):
        torch.UntypedStorage(n)  # CPU's behaviour, the reference
    with pytest.raises(RuntimeError, match="negative"):
        torch.UntypedStorage(n, device="neuron")
    a, b = _fresh_pair()
    assert a.data_ptr() != b.data_ptr()
    assert a.sum().item() == 64 and b.sum().item() == 128


@pytest.mark.parametrize("n", NEGATIVE)
def test_negative_storage_resize_raises_like_cpu(n):
    with pytest.raises(RuntimeError):
        torch.UntypedStorage(4).resize_(n)
    x = torch.arange(8, dtype=torch.float32, device="neuron")
    s = x.untyped_storage()
    with pytest.raises(RuntimeError, match="negative"):
        s.resize_(n)
    # The storage is unchanged and a later allocation is not aliased with it.
    assert s.nbytes() == 32
    other = torch.full((8,), 7.0, device="neuron")
    assert other.data_ptr() != x.data_ptr()
    assert x.tolist() == list(range(8)) and other.sum().item() == 56
    del x, s, other  # freeing must not trip over an unknown pointer


def test_huge_storage_is_out_of_memory():
    for n in (2**62, 2**63 - 1, 2**40):
        with pytest.raises(torch.OutOfMemoryError):
            torch.UntypedStorage(n, device="neuron")
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(2**62, dtype=torch.uint8, device="neuron")
    a, b = _fresh_pair()
    assert a.sum().item() == 64 and b.sum().item() == 128


def test_storage_resize_still_works():
    s = torch.arange(4, dtype=torch.float32, device="neuron").untyped_storage()
    s.resize_(64)
    assert s.nbytes() == 64
    s.resize_(0)
    assert s.nbytes() == 0
