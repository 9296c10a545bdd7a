"""Sparse COO tensors on neuron (SparsePrivateUse1, csrc/aten/Sparse.cpp):
every result is compared bitwise with the same computation on CPU."""
import warnings

import pytest
import torch

from conftest import NEURON, assert_same

warnings.filterwarnings("ignore", message="Sparse invariant checks")

EXACT = dict(rtol=0, atol=0, equal_nan=True)


def assert_sparse_same(n, c):
    """n: a sparse COO neuron tensor equal to the sparse COO CPU tensor c,
    indices and values bitwise (uncoalesced ones in the same order)."""
    assert n.device.type == "neuron", n.device
    assert n.layout == torch.sparse_coo and c.layout == torch.sparse_coo
    assert (n.shape, n.dtype) == (c.shape, c.dtype)
    assert (n.sparse_dim(), n.dense_dim(), n._nnz()) == (c.sparse_dim(), c.dense_dim(), c._nnz())
    assert n.is_coalesced() == c.is_coalesced()
    assert n._indices().device.type == "neuron" and n._values().device.type == "neuron"
    torch.testing.assert_close(n._indices().cpu(), c._indices(), **EXACT)
    torch.testing.assert_close(n._values().cpu(), c._values(), **EXACT)


def sample(dense_dim=0, dtype=torch.float32, seed=0):
    """An uncoalesced CPU sparse tensor (a duplicate index) of size (4, 5[, 3])."""
    g = torch.Generator().manual_seed(seed)
    i = torch.tensor([[0, 1, 3, 1, 2, 0], [2, 0, 4, 0, 1, 3]])
    vshape = (6,) + ((3,) if dense_dim else ())
    v = torch.randn(vshape, generator=g).to(dtype)
    size = (4, 5) + ((3,) if dense_dim else ())
    return torch.sparse_coo_tensor(i, v, size)


# --- creation and copies ----------------------------------------------------


@pytest.mark.parametrize("dense_dim", [0, 1])
def test_sparse_coo_tensor_on_neuron(dense_dim):
    c = sample(dense_dim)
    i, v = c._indices(), c._values()
    n = torch.sparse_coo_tensor(i.to(NEURON), v.to(NEURON), c.shape)
    assert_sparse_same(n, c)
    n = torch.sparse_coo_tensor(i, v, c.shape, device=NEURON)
    assert_sparse_same(n, c)
    assert n.device == torch.device("neuron", 0)


def test_cpu_sparse_to_neuron_and_back():
    c = sample(1)
    n = c.to(NEURON)
    assert_sparse_same(n, c)
    back = n.cpu()
    assert back.layout == torch.sparse_coo and back.device.type == "cpu"
    assert back.is_coalesced() == c.is_coalesced()
    assert torch.equal(back._indices(), c._indices())
    assert torch.equal(back._values(), c._values())
    cc = c.coalesce()
    assert_sparse_same(cc.to(NEURON), cc)
    assert_sparse_same(c.to(NEURON, torch.float64), c.to(torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
def test_to_sparse_from_dense_neuron(dtype):
    d = (torch.randn(5, 6) * (torch.rand(5, 6) > 0.6)).to(dtype)
    assert_sparse_same(d.to(NEURON).to_sparse(), d.to_sparse())
    assert_sparse_same(d.to(NEURON).to_sparse(1), d.to_sparse(1))
    # non-contiguous source
    assert_sparse_same(d.to(NEURON).t().to_sparse(), d.t().to_sparse())


def test_to_dense_coalesce_and_accessors():
    c = sample(1)
    n = c.to(NEURON)
    assert_same(n.to_dense(), c.to_dense())
    assert_sparse_same(n.coalesce(), c.coalesce())
    nc, cc = n.coalesce(), c.coalesce()
    assert_same(nc.indices(), cc.indices())
    assert_same(nc.values(), cc.values())
    assert_same(n._indices(), c._indices())
    assert_same(n._values(), c._values())
    assert n._nnz() == c._nnz() and nc._nnz() == cc._nnz()
    with pytest.raises(RuntimeError, match="coalesced"):
        n.indices()  # as on CPU: uncoalesced tensors have no indices()


def test_empty_zeros_and_clone():
    n = torch.zeros(3, 4, layout=torch.sparse_coo, device=NEURON)
    assert_sparse_same(n, torch.zeros(3, 4, layout=torch.sparse_coo))
    c = sample()
    assert_sparse_same(c.to(NEURON).clone(), c.clone())
    z = c.to(NEURON)
    z.zero_()
    assert_sparse_same(z, c.clone().zero_())


# --- arithmetic -------------------------------------------------------------


def test_add_mul_of_sparse_tensors():
    a, b = sample(seed=1), sample(seed=2)
    na, nb = a.to(NEURON), b.to(NEURON)
    assert_sparse_same(na + nb, a + b)
    assert_sparse_same(na * nb, a * b)
    assert_sparse_same(na * 2.5, a * 2.5)
    assert_sparse_same(torch.add(na, nb, alpha=-0.5), torch.add(a, b, alpha=-0.5))
    # sparse + dense -> dense, dense += sparse
    d = torch.randn(4, 5)
    assert_same(d.to(NEURON) + na, d + a)
    nd, cd = d.to(NEURON), d.clone()
    nd.add_(na, alpha=2.0)
    cd.add_(a, alpha=2.0)
    assert_same(nd, cd)


def test_in_place_on_sparse_neuron():
    a, b = sample(seed=3), sample(seed=4)
    na, nb = a.to(NEURON), b.to(NEURON)
    na.add_(nb)
    a.add_(b)
    assert_sparse_same(na, a)
    na.mul_(3.0)
    a.mul_(3.0)
    assert_sparse_same(na, a)


def test_sparse_times_dense():
    s = sample(seed=5)
    d = torch.randn(5, 7)
    ns, nd = s.to(NEURON), d.to(NEURON)
    assert_same(torch.sparse.mm(ns, nd), torch.sparse.mm(s, d))
    assert_same(torch.mm(ns, nd), torch.mm(s, d))
    assert_same(ns @ nd, s @ d)
    bias = torch.randn(4, 7)
    assert_same(torch.addmm(bias.to(NEURON), ns, nd), torch.addmm(bias, s, d))
    # sparse @ sparse -> sparse
    t = sample(seed=6).t().coalesce()
    assert_sparse_same(torch.sparse.mm(ns, t.to(NEURON)), torch.sparse.mm(s, t))


def test_sparse_sum():
    c = sample(1, seed=7)
    n = c.to(NEURON)
    assert_same(torch.sparse.sum(n), torch.sparse.sum(c))
    assert_sparse_same(torch.sparse.sum(n, dim=0), torch.sparse.sum(c, dim=0))
    assert_same(torch.sparse.sum(n, dim=(0, 1)), torch.sparse.sum(c, dim=(0, 1)))


# --- autograd ---------------------------------------------------------------


def test_backward_through_to_sparse():
    d = torch.randn(4, 5)
    w = torch.randn(5, 3)
    grads = []
    for dev in ("cpu", NEURON):
        x = d.to(dev).detach().requires_grad_()
        y = torch.sparse.mm(x.to_sparse(), w.to(dev))
        (y * y).sum().backward()
        grads.append(x.grad)
    assert_same(grads[1], grads[0])


def test_sparse_mm_and_sum_gradients():
    s = sample(seed=8).coalesce()
    d = torch.randn(5, 6)
    results = []
    for dev in ("cpu", NEURON):
        a = s.to(dev).detach().requires_grad_()
        b = d.to(dev).detach().requires_grad_()
        out = torch.sparse.mm(a, b)
        loss = (out.sin()).sum() + torch.sparse.sum(a * 2.0)
        loss.backward()
        results.append((a.grad, b.grad, loss.detach()))
    (ga_n, gb_n, l_n), (ga_c, gb_c, l_c) = results[1], results[0]
    assert ga_c.layout == torch.sparse_coo
    assert_sparse_same(ga_n, ga_c)
    assert_same(gb_n, gb_c)
    assert_same(l_n, l_c)


def test_sparse_embedding_training_matches_cpu():
    torch.manual_seed(0)
    cpu_emb = torch.nn.Embedding(20, 8, sparse=True)
    dev_emb = torch.nn.Embedding(20, 8, sparse=True)
    dev_emb.load_state_dict(cpu_emb.state_dict())
    dev_emb.to(NEURON)
    opt_c = torch.optim.SGD(cpu_emb.parameters(), lr=0.1)
    opt_n = torch.optim.SGD(dev_emb.parameters(), lr=0.1)
    for step in range(3):
        idx = torch.tensor([[1, 4, 4, 7], [19, 0, 4, 3]]) + step
        idx = idx.clamp(max=19)
        out_c = cpu_emb(idx)
        out_n = dev_emb(idx.to(NEURON))
        assert_same(out_n, out_c)
        opt_c.zero_grad()
        opt_n.zero_grad()
        (out_c.pow(2).sum()).backward()
        (out_n.pow(2).sum()).backward()
        assert cpu_emb.weight.grad.layout == torch.sparse_coo
        assert_sparse_same(dev_emb.weight.grad, cpu_emb.weight.grad)
        opt_c.step()
        opt_n.step()
        assert_same(dev_emb.weight.detach(), cpu_emb.weight.detach())


# --- errors -----------------------------------------------------------------


def test_mismatched_devices_raise():
    s = sample(seed=9)
    ns = s.to(NEURON)
    with pytest.raises(RuntimeError, match="same device|device"):
        torch.sparse.mm(ns, torch.randn(5, 2))
    with pytest.raises(RuntimeError, match="same device|device"):
        ns + s
    with pytest.raises(RuntimeError):
        torch.sparse_coo_tensor(s._indices(), s._values().to(NEURON), s.shape)
    # the device keeps working
    assert_sparse_same(ns * 2.0, s * 2.0)


def test_unsupported_layout_raises_clearly():
    with pytest.raises(NotImplementedError, match="sparse COO"):
        torch.randn(3, 3, device=NEURON).to_sparse_csr()


def test_second_device(two_devices):
    c = sample(1, seed=10)
    n = c.to("neuron:1")
    assert n.device == torch.device("neuron", 1)
    assert n._values().device == torch.device("neuron", 1)
    r = (n * 2.0).coalesce()
    assert r.device == torch.device("neuron", 1) and r._indices().device == r.device
    assert_sparse_same(r, (c * 2.0).coalesce())
    d = torch.randn(4, 6).to("neuron:1").to_sparse()
    assert d.device == torch.device("neuron", 1) and d._values().device == d.device
    assert_sparse_same(n.to("neuron:0"), c)
