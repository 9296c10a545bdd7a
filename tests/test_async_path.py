"""The asynchronous generic path: ops queue on the stream and run CPU's
kernels on device memory in stream order; errors surface at the next
synchronizing call with the op's name; results equal the synchronous path's.
"""
import pytest
import torch
import torch.nn.functional as F

import torchneuron

from conftest import LAUNCH_BLOCKING, assert_same, requires_async, run_python


@pytest.fixture
def both_paths():
    yield
    torchneuron._C._set_async_path(True)


@requires_async
def test_ops_queue_behind_running_work():
    x = torch.randn(256, 256)
    nx = x.to("neuron")
    (nx @ nx).relu().sum(0)  # first calls of each kind run inline (checked against Meta)
    torch.neuron.synchronize()
    torch.neuron._sleep(300_000)  # the stream is busy for 300 ms
    torchneuron.clear_op_tracking()
    y = (nx @ nx).relu().sum(0)
    # Queued, not run: the host got here while the stream is still busy.
    assert not torch.neuron.current_stream().query()
    assert torchneuron.get_fallback_ops() == []
    assert torch.equal(y.cpu(), (x @ x).relu().sum(0))
    assert torch.neuron.current_stream().query()


@requires_async
def test_kernel_error_surfaces_at_sync_with_op_name_and_device_recovers():
    weight = torch.randn(10, 4, device="neuron")
    F.embedding(torch.tensor([0, 1], device="neuron"), weight)  # the first call ran inline
    bad = torch.tensor([1, 42], device="neuron")  # 42 is out of range
    out = F.embedding(bad, weight)  # queued; the bounds check runs on the device
    with pytest.raises(RuntimeError, match=r"aten::index_select.*out of range|index out of range"):
        out.cpu()
    # The stream and device keep working, and earlier data is intact.
    good = F.embedding(torch.tensor([1, 2], device="neuron"), weight)
    assert torch.equal(good.cpu(), weight.cpu()[[1, 2]])


def test_launch_blocking_reports_error_at_the_op():
    r = run_python(
        """
        import torch, torch.nn.functional as F
        w = torch.randn(10, 4, device="neuron")
        F.embedding(torch.tensor([1], device="neuron"), w)  # first of its kind: inline
        try:
            F.embedding(torch.tensor([42], device="neuron"), w)
        except RuntimeError as e:
            print("raised at op:", "index_select" in str(e))
        """,
        env={"NEURON_LAUNCH_BLOCKING": "1"},
    )
    assert r.returncode == 0, r.stderr
    assert "raised at op: True" in r.stdout


def test_meta_cache_distinguishes_shapes_and_arguments():
    x = torch.randn(3, 5)
    nx = x.to("neuron")
    for dim in (0, 1, -1):
        assert_same(nx.sum(dim), x.sum(dim))
    assert_same(nx.sum(0, keepdim=True), x.sum(0, keepdim=True))
    for shape in ((3, 5), (5,), (1, 5), (3, 1)):
        other = torch.randn(shape)
        assert_same(nx * other.to("neuron"), x * other)
    assert_same(nx.t().contiguous() + 1, x.t().contiguous() + 1)
    assert_same(nx.t() + 1, x.t() + 1)  # non-contiguous input: output strides follow CPU
    assert (nx.t() + 1).stride() == (x.t() + 1).stride()


def test_out_argument_of_the_wrong_size_is_resized_like_cpu():
    x = torch.randn(4, 3)
    out_cpu = torch.empty(0)
    out_dev = torch.empty(0, device="neuron")
    torch.sin(x, out=out_cpu)
    torch.sin(x.to("neuron"), out=out_dev)
    assert out_dev.shape == out_cpu.shape
    assert torch.equal(out_dev.cpu(), out_cpu)


def test_cpu_scalar_operands_are_captured_at_enqueue():
    nx = torch.ones(4, device="neuron")
    s = torch.tensor(2.0)
    torch.neuron._sleep(100_000)
    y = nx * s
    s.fill_(100.0)  # changing it afterwards must not change the queued op
    assert torch.equal(y.cpu(), torch.full((4,), 2.0))


def test_random_ops_same_on_both_paths(both_paths):
    def draw():
        torch.neuron.manual_seed(7)
        x = torch.ones(1000, device="neuron")
        return F.dropout(x, 0.5).cpu(), torch.rand(10, device="neuron").cpu()

    def paths():
        p = torchneuron.get_op_paths()
        return {op: p[op]["async"] and not p[op]["fallback"]
                for op in ("aten::bernoulli_.float", "aten::uniform_")}

    torchneuron._C._set_async_path(True)
    draw()  # the first call of a random op's kind is verified on its real run (inline)
    torchneuron.clear_op_tracking()
    a = draw()
    # The two runs really took different paths (else this compares a run with itself).
    assert paths() == {"aten::bernoulli_.float": True, "aten::uniform_": True}
    torchneuron._C._set_async_path(False)
    torchneuron.clear_op_tracking()
    b = draw()
    assert paths() == {"aten::bernoulli_.float": False, "aten::uniform_": False}
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_data_dependent_ops_take_the_synchronous_path():
    x = torch.tensor([0.0, 1.0, 0.0, 2.0])
    nx = x.to("neuron")
    torchneuron.clear_op_tracking()
    assert_same(torch.nonzero(nx), torch.nonzero(x))
    assert "aten::nonzero" in torchneuron.get_fallback_ops()
    assert torchneuron.get_op_paths()["aten::nonzero"]["fallback"] == 1  # counted once per call
    assert_same(nx[nx > 0], x[x > 0])


@requires_async
def test_an_argument_error_in_a_python_meta_kernel_leaves_the_op_asynchronous():
    # aten::add.Tensor's Meta kernel is Python (torch/_meta_registrations.py): a shape
    # mismatch raises there, as a Python RuntimeError. That is the user's error for this
    # call, not a refusal like nonzero's: later adds must still queue. (A fresh process:
    # the op's state is process-wide, and other tests' order must not hide a regression.)
    r = run_python(
        """
        import torch, torchneuron
        a, b = torch.randn(4, 3, device="neuron"), torch.randn(2, 3, device="neuron")
        try:
            torch.add(a, b)  # shapes do not broadcast
        except RuntimeError as e:
            print("raised:", "must match" in str(e))
        x = torch.randn(2, 3, device="neuron") > 0
        y = torch.randn(2, 3, device="neuron") > 0
        x + y  # bool + bool: the generic path (the first of its kind runs inline)
        torch.neuron.synchronize()
        torch.neuron._sleep(300_000)
        torchneuron.clear_op_tracking()
        z = x + y
        print("queued:", not torch.neuron.current_stream().query())
        print("waits:", torchneuron.get_host_waits())
        print("paths:", torchneuron.get_op_paths()["aten::add.Tensor"])
        print("equal:", torch.equal(z.cpu(), x.cpu() + y.cpu()))
        """
    )
    assert r.returncode == 0, r.stderr
    assert "raised: True" in r.stdout and "queued: True" in r.stdout, r.stdout
    assert "waits: []" in r.stdout and "equal: True" in r.stdout, r.stdout
    assert "'async': 1" in r.stdout and "'fallback': 0" in r.stdout, r.stdout


@requires_async
def test_a_user_error_a_meta_kernel_calls_not_implemented_leaves_the_op_asynchronous():
    # neg's Meta kernel raises NotImplementedError for a bool tensor, the word a Meta
    # kernel also uses for "no answer for this op". CPU raises too: the user's error,
    # and later negations must still queue (a whole Llama step waited on each
    # rotate_half after one such call). Fresh process: the op's state is process-wide.
    r = run_python(
        """
        import torch, torchneuron
        try:
            torch.neg(torch.tensor([True], device="neuron"))
        except RuntimeError as e:
            print("raised:", type(e).__name__, "bool tensor" in str(e))
        x = torch.tensor([[-3, 0, 4, 7]], dtype=torch.int32, device="neuron")[:, 1:]
        torch.neg(x)  # an int32 view: the generic path (the first of its kind runs inline)
        torch.neuron.synchronize()
        torch.neuron._sleep(300_000)
        torchneuron.clear_op_tracking()
        z = torch.neg(x)
        print("queued:", not torch.neuron.current_stream().query())
        print("waits:", torchneuron.get_host_waits())
        print("paths:", torchneuron.get_op_paths()["aten::neg"])
        print("equal:", z.cpu().tolist() == [[0, -4, -7]])
        """
    )
    assert r.returncode == 0, r.stderr
    assert "raised: NotImplementedError True" in r.stdout, r.stdout
    assert "queued: True" in r.stdout and "waits: []" in r.stdout, r.stdout
    assert "equal: True" in r.stdout and "'fallback': 0" in r.stdout, r.stdout


@pytest.mark.parametrize("async_path", [True, False], ids=["queued", "synchronous"])
@pytest.mark.parametrize("n", [5, 40000])
def test_foreach_tensor_overloads_take_cpu_scalars_as_cuda_does(both_paths, async_path, n):
    # _foreach_addcdiv_/_foreach_addcmul_.Tensor read one value per list index
    # from a CPU tensor (CUDA's kernels require it on CPU). Read at the call:
    # changing the tensor afterwards changes nothing queued.
    torchneuron._C._set_async_path(async_path)
    g = torch.Generator().manual_seed(n)
    lists = [[torch.randn(n, generator=g) for _ in range(3)] for _ in range(3)]
    lists[2] = [t.abs() + 1 for t in lists[2]]
    scalars = torch.tensor([0.5, -1.25, 2.0])
    dev = [[t.to("neuron") for t in lst] for lst in lists]
    for _ in range(2):  # the first call of a kind runs inline, the second queues
        ref = [t.clone() for t in lists[0]]
        torch._foreach_addcdiv_(ref, lists[1], lists[2], scalars)
        torch._foreach_addcmul_(ref, lists[1], lists[2], scalars)
        out = [t.clone() for t in dev[0]]
        torch.neuron._sleep(20_000)
        host = scalars.clone()
        torch._foreach_addcdiv_(out, dev[1], dev[2], host)
        torch._foreach_addcmul_(out, dev[1], dev[2], host)
        host.fill_(100.0)
        for a, b in zip(out, ref):
            assert_same(a, b)
    assert "aten::_foreach_addcdiv_.Tensor" in torchneuron.get_executed_ops()


def test_first_call_of_a_kind_runs_inline_then_queues():
    x = torch.randn(64, 64, dtype=torch.float64)
    nx = x.to("neuron")
    torch.cosh(nx)  # first call with float64 contiguous 2-d: inline, checked
    torch.neuron.synchronize()
    if not LAUNCH_BLOCKING:
        other = torch.randn(3, 7, dtype=torch.float64, device="neuron")
        torch.neuron.synchronize()
        torch.neuron._sleep(200_000)
        y = torch.cosh(other)  # same kind, other shape: queued
        assert not torch.neuron.current_stream().query()
        y.cpu()
    torchneuron.clear_op_tracking()
    assert_same(torch.cosh(nx), torch.cosh(x))
    assert torchneuron.get_op_paths()["aten::cosh"]["async"] == 1


@pytest.mark.parametrize("case", ["layer_norm_half", "mse_loss_sum", "multilabel_margin_1d",
                                  "batch_norm_eval", "embedding_bag_mean"])
def test_meta_kernels_that_disagree_with_cpu_give_cpus_results(case):
    """Where PyTorch's Meta kernel predicts another dtype or shape than CPU's
    kernel produces, the first call notices and the op runs synchronously:
    results equal CPU's, every time (a loop calls it again)."""
    torch.manual_seed(0)
    if case == "layer_norm_half":
        args = (torch.randn(4, 8, dtype=torch.float16), [8])
        fn = lambda x, s: torch.native_layer_norm(x, s, None, None, 1e-5)  # noqa: E731
    elif case == "mse_loss_sum":
        args = (torch.randn(5, 3), torch.randn(5, 3))
        fn = lambda a, b: F.mse_loss(a, b, reduction="sum")  # noqa: E731
    elif case == "multilabel_margin_1d":
        args = (torch.randn(10), torch.randint(0, 10, (10,)))
        fn = lambda a, b: F.multilabel_margin_loss(a, b, reduction="none")  # noqa: E731
    elif case == "batch_norm_eval":
        args = (torch.randn(4, 3, 5), torch.zeros(3), torch.ones(3))
        fn = lambda x, m, v: F.batch_norm(x, m, v, training=False)  # noqa: E731
    else:
        args = (torch.randint(0, 10, (2, 4)), torch.randn(10, 3))
        fn = lambda i, w: F.embedding_bag(i, w, mode="mean")  # noqa: E731
    expected = fn(*args)
    dev = [a.to("neuron") if isinstance(a, torch.Tensor) else a for a in args]
    for _ in range(3):
        assert_same(fn(*dev), expected)


def test_inplace_op_cannot_grow_self_by_broadcasting():
    for op in ("logical_and_", "add_", "ldexp_"):
        a = torch.ones(5, 1, device="neuron")
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            getattr(a, op)(torch.ones(5, device="neuron"))
        assert a.shape == (5, 1)  # untouched, and the device keeps working
        assert_same(a + 1, torch.full((5, 1), 2.0))


def test_batch_norm_training_on_a_non_contiguous_input():
    """CPU's out= kernel for training batch norm misreads non-contiguous
    inputs; neuron uses the functional kernel for them."""
    x = torch.randn(2, 3, 8)[..., ::2]
    expected = torch.ops.aten.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5)
    nx = torch.randn(2, 3, 8, device="neuron")[..., ::2]
    nx.copy_(x.to("neuron"))
    for _ in range(2):
        got = torch.ops.aten.native_batch_norm(nx, None, None, None, None, True, 0.1, 1e-5)
        assert_same(got, expected)


@pytest.mark.parametrize("name", ["add", "mul", "flip", "relu6", "exp"])
def test_zero_element_results_have_cpus_strides_without_a_host_wait(name):
    # CPU's kernels lay out an empty result each their own way (TensorIterator makes
    # it contiguous, flip keeps a sliced input's strides): CPU's kernel decides, and
    # as no data is read or written the device does not wait for it.
    f = {"add": lambda x: x + x, "mul": lambda x: x * 2, "flip": lambda x: x.flip(0),
         "relu6": torch.nn.functional.relu6, "exp": torch.exp}[name]
    base = torch.randn(0, 20, 6)
    dev = base.to("neuron")
    torch.neuron.synchronize()
    torchneuron.clear_op_tracking()  # (host waits are recorded whether or not work is queued)
    got, want = f(dev[:, ::2, ::2]), f(base[:, ::2, ::2])
    assert got.shape == want.shape and got.stride() == want.stride(), (got.stride(), want.stride())
    assert torchneuron.get_host_waits() == []


@requires_async
def test_layouts_cpus_kernel_chooses_are_learned_without_a_host_wait():
    """CPU's convolutions keep channels_last inputs channels_last where PyTorch's
    Meta kernel answers contiguous. The first call of each exact argument layout
    learns CPU's layouts on scratch memory, so no call waits for the device, a
    second shape of the same kind included; the values are CPU's."""
    torch.manual_seed(0)
    weight = torch.randn(16, 8, 3, 3).to(memory_format=torch.channels_last)
    bias = torch.randn(16)
    nweight, nbias = weight.to("neuron"), bias.to("neuron")

    def step(x, grad, w, b):
        out = torch.ops.aten.convolution(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        grads = torch.ops.aten.convolution_backward(grad, x, w, [16], [1, 1], [1, 1], [1, 1],
                                                    False, [0, 0], 1, [True, True, True])
        return (out, *grads)

    for batch in (2, 3):
        x = torch.randn(batch, 8, 12, 12).to(memory_format=torch.channels_last)
        grad = torch.randn(batch, 16, 12, 12)
        nx, ngrad = x.to("neuron"), grad.to("neuron")
        torch.neuron.synchronize()
        torchneuron.clear_host_waits()
        torch.neuron._sleep(300_000)
        got = step(nx, ngrad, nweight, nbias)
        assert not torch.neuron.current_stream().query()
        assert torchneuron.get_host_waits() == []
        for g, want in zip(got, step(x, grad, weight, bias)):
            # Values are CPU's; results are contiguous, as FakeTensor predicts for this device.
            assert g.is_contiguous()
            assert torch.equal(g.cpu(), want.contiguous())


@requires_async
def test_functional_kernels_compute_their_results_in_the_device_outputs():
    # Ops without an out= kernel of CPU's own (layer_norm and its backward,
    # CPU's flash attention, gelu_backward) run their functional kernel
    # queued; its results land in the outputs' memory (ResultPlacement), so
    # nothing is copied after it, and the bits are CPU's.
    torch.manual_seed(0)
    x = torch.randn(4, 16, 64, requires_grad=True)
    q, k, v = (torch.randn(2, 4, 16, 32, requires_grad=True) for _ in range(3))
    w = torch.randn(64, requires_grad=True)

    def run(device):
        xs, qs, ks, vs, ws = (t.detach().to(device).requires_grad_() for t in (x, q, k, v, w))
        y = F.gelu(F.layer_norm(xs, (64,), ws), approximate="tanh")
        a = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        (y.sum() + a.sum()).backward()
        return [y, a, xs.grad, qs.grad, ks.grad, vs.grad, ws.grad]

    expected = run("cpu")
    run("neuron")  # first calls of each kind are verified
    torch.neuron.synchronize()
    torchneuron.clear_op_tracking()
    before = torchneuron._C._fresh_output_copies()
    got = run("neuron")
    torch.neuron.synchronize()
    assert torchneuron._C._fresh_output_copies() == before
    assert torchneuron.get_result_copies() == {}
    paths = torchneuron.get_op_paths()
    for op in ("aten::native_layer_norm", "aten::native_layer_norm_backward",
               "aten::_scaled_dot_product_flash_attention_for_cpu_backward"):
        assert paths[op]["async"] >= 1, (op, paths[op])
    for g, e in zip(got, expected):
        assert_same(g, e)


@requires_async
def test_convolution_results_are_placed_after_a_call_shows_where_they_come_from():
    # oneDNN's NCHW convolution (and its backward) computes into a buffer of
    # its own of the output's size and reorders into the result: serving the
    # first allocation of that size placed the buffer, and every result was
    # copied. The first call's copy shows which allocation the result is;
    # later calls with these sizes compute every result in place.
    def run(device):
        torch.manual_seed(0)
        x = torch.randn(4, 16, 8, 8).to(device).requires_grad_()
        w = torch.randn(16, 16, 3, 3).to(device).requires_grad_()
        y = F.conv2d(x, w, padding=1)
        y.square().sum().backward()
        return [y, x.grad, w.grad]

    expected = run("cpu")
    run("neuron")  # verified
    run("neuron")  # its copies show where the results come from
    torch.neuron.synchronize()
    torchneuron.clear_op_tracking()
    got = run("neuron")
    torch.neuron.synchronize()
    assert torchneuron.get_op_paths()["aten::convolution_backward"]["async"] >= 1
    assert torchneuron.get_result_copies() == {}
    for g, e in zip(got, expected):
        assert_same(g, e)


def _placement_ops():
    """Custom ops whose CPU kernels allocate in awkward orders, to put
    ResultPlacement's fallbacks to the test."""
    lib = torch.library.Library("tnplace", "DEF")
    lib.define("swapped(Tensor x) -> (Tensor, Tensor)")
    lib.define("crossed(Tensor x) -> (Tensor, Tensor)")
    lib.define("keeps(Tensor x) -> Tensor")
    kept = []

    def crossed(x):
        b = torch.empty_like(x)  # takes the first output's memory
        a = torch.empty_like(x)  # takes the second's
        a.copy_(x * 2)
        b.copy_(x + 1)
        return a, b

    def swapped(x):
        scratch = torch.empty_like(x).fill_(7.0)  # a temporary of the results' size, first
        del scratch
        b = torch.empty_like(x)  # the second result allocated before the first
        a = torch.empty_like(x)
        a.copy_(x * 2)
        b.copy_(x + 1)
        return a, b

    def keeps(x):
        out = x * 3
        if x.numel() and x[0].item() > 100:  # a cache the scratch run (zeros) never fills
            kept.append(out)
        return out

    lib.impl("swapped", swapped, "CPU")
    lib.impl("swapped", lambda x: (torch.empty_like(x), torch.empty_like(x)), "Meta")
    lib.impl("crossed", crossed, "CPU")
    lib.impl("crossed", lambda x: (torch.empty_like(x), torch.empty_like(x)), "Meta")
    lib.impl("keeps", keeps, "CPU")
    lib.impl("keeps", lambda x: torch.empty_like(x), "Meta")
    return lib, kept


@requires_async
def test_results_placed_in_another_output_are_moved_safely_and_kept_ones_raise():
    lib, kept = _placement_ops()
    x = torch.randn(1000)
    nx = x.to("neuron")
    torch.ops.tnplace.swapped(nx)  # verified (scratch), then run
    torch.ops.tnplace.crossed(nx)
    torch.ops.tnplace.keeps(nx)
    torch.neuron.synchronize()
    y = torch.randn(999)
    ny = y.to("neuron")
    torchneuron.clear_op_tracking()
    torch.neuron._sleep(50_000)
    a, b = torch.ops.tnplace.swapped(ny)  # arguments of a new size: a call of its own
    assert torchneuron.get_op_paths()["tnplace::swapped"]["async"] == 1
    # The temporary took the first output's memory and the second result the
    # second's; the first result was computed elsewhere and copied.
    assert torch.equal(a.cpu(), y * 2) and torch.equal(b.cpu(), y + 1)
    assert torchneuron.get_result_copies() == {"tnplace::swapped": 1}  # tracking names the op
    # The copy showed which allocation the result came from (the third of
    # its size): the call's next run serves that one, and nothing is copied.
    a, b = torch.ops.tnplace.swapped(ny)
    assert torch.equal(a.cpu(), y * 2) and torch.equal(b.cpu(), y + 1)
    a, b = torch.ops.tnplace.swapped(nx)  # learned in the run after verification
    assert torch.equal(a.cpu(), x * 2) and torch.equal(b.cpu(), x + 1)
    assert torchneuron.get_result_copies() == {"tnplace::swapped": 1}
    # Each result in the other's output: both are read before either is written.
    before = torchneuron._C._fresh_output_copies()
    a, b = torch.ops.tnplace.crossed(nx)
    assert torch.equal(a.cpu(), x * 2) and torch.equal(b.cpu(), x + 1)
    assert torchneuron._C._fresh_output_copies() == before + 2
    assert torchneuron.get_result_copies() == {"tnplace::swapped": 1, "tnplace::crossed": 2}

    big = torch.full((1000,), 500.0, device="neuron")
    out = torch.ops.tnplace.keeps(big)
    with pytest.raises(RuntimeError, match="tnplace::keeps.*kept a reference"):
        torch.neuron.synchronize()
    del out
    assert len(kept) == 1
    # The device keeps working and earlier data is intact. It reuses the
    # memory the kept tensor refers to; no result is computed there again
    # (the kernel's result lands elsewhere and is copied, not refused).
    assert torch.equal(nx.cpu(), x)
    stale = kept[0].data_ptr()
    before = torchneuron._C._fresh_output_copies()
    y = torch.ops.tnplace.keeps(nx)  # small values: keeps nothing
    assert y.data_ptr() == stale
    assert torch.equal(y.cpu(), x * 3)
    assert torchneuron._C._fresh_output_copies() == before + 1  # not served again
    assert torchneuron.get_result_copies()["tnplace::keeps"] == 1
    a, b = torch.ops.tnplace.swapped(nx)
    assert torch.equal(a.cpu(), x * 2) and torch.equal(b.cpu(), x + 1)
    kept.clear()
    del lib
