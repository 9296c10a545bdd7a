"""Custom kernels (torchneuron.kernels): C++ against the kernel ABI, queued on
the stream, as PyTorch ops (nki_op) in eager, autograd and torch.compile, and
the kernel library's fused RMSNorm against the eager composition on CPU."""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import torchneuron
from conftest import chrome_trace_events, requires_async
from torchneuron.kernels import cpp_kernel, nki_op, rms_norm

N = "neuron"

# out = a * alpha + b, elementwise over contiguous float tensors: the first
# kernel of examples/custom_kernel.py.
AXPY = r"""
extern "C" void test_axpy(const tn_args* args) {
  const float* a = static_cast<const float*>(args->tensors[0].data);
  const float* b = static_cast<const float*>(args->tensors[1].data);
  float* out = static_cast<float*>(args->tensors[2].data);
  const float alpha = static_cast<float>(args->scalars[0].f);
  tn_parallel(args, 0, args->tensors[2].numel, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = a[i] * alpha + b[i];
  });
}
"""
axpy_kernel = cpp_kernel(AXPY, "test_axpy")


@nki_op("torchneuron_test::axpy", mutates_args=())
def axpy(a: torch.Tensor, b: torch.Tensor, alpha: float) -> torch.Tensor:
    out = torch.empty_like(a)
    axpy_kernel(a.contiguous(), b.contiguous(), out, alpha)
    return out


def _axpy_backward(ctx, grad):
    return grad * ctx.alpha, grad, None


def _axpy_setup(ctx, inputs, output):
    ctx.alpha = inputs[2]


axpy.register_autograd(_axpy_backward, setup_context=_axpy_setup)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.int32 if t.element_size() == 4 else torch.int16)


def test_kernel_matches_the_same_math_on_cpu_bitwise():
    a, b = torch.randn(3, 10_000), torch.randn(3, 10_000)
    expected = torch.empty_like(a)
    axpy_kernel(a, b, expected, 0.5)          # CPU tensors: runs on this thread
    assert torch.equal(expected, a * 0.5 + b)  # one rounding per op: the same as ATen's
    out = axpy(a.to(N), b.to(N), 0.5)
    assert out.device.type == "neuron"
    assert torch.equal(_bits(out), _bits(expected))


@requires_async
def test_launch_is_queued_behind_earlier_work():
    a, b = torch.randn(1 << 16, device=N), torch.randn(1 << 16, device=N)
    axpy(a, b, 2.0).cpu()                     # compiled and loaded
    torchneuron.clear_host_waits()
    torch.neuron._sleep(1_000_000)
    start = time.perf_counter()
    out = axpy(a, b, 2.0)
    host = time.perf_counter() - start
    assert host < 0.5, f"the kernel launch took {host:.3f} s behind a 1 s kernel"
    assert not torch.neuron.current_stream().query()
    assert not torchneuron.get_host_waits()
    assert torch.equal(out.cpu(), a.cpu() * 2.0 + b.cpu())


def test_profiler_shows_the_kernel_under_its_name():
    a, b = torch.randn(4096, device=N), torch.randn(4096, device=N)
    axpy(a, b, 1.0)
    torch.neuron.synchronize()
    torchneuron._C._drain_activity_records()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        axpy(a, b, 1.0)
        torch.neuron.synchronize()
    events = chrome_trace_events(prof)
    work = [e for e in events if e.get("name") == "test_axpy" and e.get("cat") == "kernel"]
    assert len(work) == 1, [e.get("name") for e in events if e.get("cat") == "kernel"]
    assert work[0]["args"]["kind"] == "custom"


def test_nki_op_autograd_against_cpu():
    a = torch.randn(64, 33, requires_grad=True)
    b = torch.randn(64, 33, requires_grad=True)
    an = a.detach().to(N).requires_grad_()
    bn = b.detach().to(N).requires_grad_()
    (axpy(an, bn, 3.0) * 2).sum().backward()
    (axpy(a, b, 3.0) * 2).sum().backward()     # the op on CPU runs the same kernel
    assert torch.equal(an.grad.cpu(), a.grad) and torch.equal(bn.grad.cpu(), b.grad)


def test_nki_op_compiles_without_a_graph_break():
    def f(a, b):
        return axpy(a.sin(), b, 0.25).cos()

    a, b = torch.randn(128, 64, device=N), torch.randn(128, 64, device=N)
    explanation = torch._dynamo.explain(f)(a, b)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(f, fullgraph=True)
    # The reference for compiled code is Inductor on CPU (its sin/cos are not
    # eager's); the op runs the same kernel on CPU tensors.
    on_cpu = torch.compile(f, fullgraph=True)(a.cpu(), b.cpu())
    assert torch.equal(compiled(a, b).cpu(), on_cpu)


def test_bad_launches_raise_and_the_device_keeps_working():
    a = torch.randn(8, device=N)
    with pytest.raises(RuntimeError, match="one device"):
        axpy_kernel(a, torch.randn(8), a, 1.0)
    with pytest.raises(ValueError, match="at most 8 dims"):
        axpy_kernel(torch.randn([1] * 9, device=N), a, a, 1.0)
    with pytest.raises(TypeError, match="ints, floats and bools"):
        axpy_kernel(a, a, a, "x")
    with pytest.raises(RuntimeError, match="no function of that name"):
        cpp_kernel(AXPY, "not_defined")(a)
    assert torch.equal(axpy(a, a, 1.0).cpu(), a.cpu() * 1.0 + a.cpu())


def test_kernel_abi_matches_the_header():
    from torchneuron.kernels import _kernel

    header = (torchneuron.kernels.include_dir() + "/torchneuron_kernel.h")
    text = open(header).read()
    for macro, value in (("TN_ABI_VERSION", _kernel.ABI_VERSION), ("TN_MAX_DIMS", _kernel.MAX_DIMS),
                         ("TN_MAX_TENSORS", _kernel.MAX_TENSORS),
                         ("TN_MAX_SCALARS", _kernel.MAX_SCALARS)):
        assert f"#define {macro} {value}\n" in text
    size = cpp_kernel("extern \"C\" int64_t args_size() { return sizeof(tn_args); }",
                      "args_size")
    import ctypes

    library_size = ctypes.CFUNCTYPE(ctypes.c_int64)(size._entry())()
    assert library_size == ctypes.sizeof(_kernel._Args)


# --- the kernel library: fused RMSNorm -------------------------------------

def _ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference in units of the reference's magnitude per element."""
    scale = torch.finfo(b.dtype).eps * b.abs().clamp_min(torch.finfo(b.dtype).tiny)
    return ((a.float() - b.float()).abs() / scale.float()).max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_forward_backward_against_the_eager_composition(dtype):
    torch.manual_seed(0)
    x = torch.randn(4, 37, 96, dtype=dtype, requires_grad=True)
    w = torch.randn(96, dtype=dtype, requires_grad=True)
    grad = torch.randn(4, 37, 96, dtype=dtype)
    ref = F.rms_norm(x, (96,), w, 1e-6)
    ref.backward(grad)
    xn = x.detach().to(N).requires_grad_()
    wn = w.detach().to(N).requires_grad_()
    out = rms_norm(xn, wn, 1e-6)
    out.backward(grad.to(N))
    # The same formula with its sums in another order (8 lanes), so not bit for
    # bit. float32: the output within 8 ulp of each element; the gradients,
    # whose terms cancel (dx = rstd * (g - xhat * mean)), within 16 ulp of the
    # tensor's largest magnitude (measured: 2.4 ulp; 1.0e-7 and 4.2e-7 of the
    # largest dx and dw). bfloat16: each result rounded once from float as the
    # composition's last op rounds it, within one bf16 ulp (measured 0.56).
    eps = torch.finfo(dtype).eps
    assert _ulps(out.detach().cpu(), ref.detach()) <= (8 if dtype == torch.float32 else 1)
    for got, want in ((xn.grad.cpu(), x.grad), (wn.grad.cpu(), w.grad)):
        if dtype == torch.float32:
            assert (got - want).abs().max() <= 16 * eps * want.abs().max()
        else:
            assert _ulps(got, want) <= 1
    eager = F.rms_norm(xn.detach(), (96,), wn.detach(), 1e-6)   # the device's own composition
    assert torch.equal(_bits(eager), _bits(ref))


def test_rms_norm_compiles_and_rejects_bad_input():
    x, w = torch.randn(16, 64, device=N), torch.randn(64, device=N)
    compiled = torch.compile(lambda x, w: rms_norm(x * 2, w, 1e-5) + 1, fullgraph=True)
    assert torch.equal(compiled(x, w).cpu(), (rms_norm(x * 2, w, 1e-5) + 1).cpu())
    with pytest.raises(ValueError, match="weight of shape"):
        rms_norm(x, torch.randn(32, device=N))
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        rms_norm(x.double(), w.double())


def test_first_kernel_example_runs():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    env.pop("NEURON_LAUNCH_BLOCKING", None)
    result = subprocess.run([sys.executable, str(root / "examples" / "custom_kernel.py")],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    forward = float(result.stdout.split("= ")[1].split()[0])
    assert forward < 1e-5
    assert "profiler: [('my_silu', 1)]" in result.stdout


THREAD_IDS = r"""
#include <functional>
#include <thread>
extern "C" void test_thread_ids(const tn_args* args) {
  int64_t* out = static_cast<int64_t*>(args->tensors[0].data);
  tn_parallel(args, 0, args->tensors[0].numel, 1, [&](int64_t lo, int64_t hi) {
    volatile double spin = 0;  // long enough that one thread cannot take every chunk
    for (int k = 0; k < 2000000; ++k) spin = spin + k;
    for (int64_t i = lo; i < hi; ++i)
      out[i] = static_cast<int64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  });
}
"""


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one intra-op thread")
@pytest.mark.parametrize("device", ["cpu", N])
def test_tn_parallel_splits_work_over_threads(device):
    ids = torch.zeros(8, dtype=torch.int64, device=device)
    cpp_kernel(THREAD_IDS, "test_thread_ids")(ids)
    assert len(set(ids.cpu().tolist())) > 1
