"""Your first custom kernel on neuron, end to end.

    python examples/custom_kernel.py

1. Write the kernel in C++ against the kernel ABI (torchneuron_kernel.h, which
   torchneuron prepends): a C function receiving the call's tensors (data
   pointer, sizes, strides, dtype) and numbers, splitting its work over the
   device's compute threads with tn_parallel.
2. Make it a Kernel: cpp_kernel(source, name) compiles it at the first launch
   (then it is cached on disk). Calling the Kernel queues it on the current
   neuron stream: the host returns at once.
3. Make it a PyTorch op with nki_op: the function allocates the outputs and
   launches the kernel; it is also the op's shape function, so the op works
   under torch.compile without a graph break. register_autograd gives it a
   backward.
4. Check it against PyTorch on CPU, train through it, compile it, profile it.
"""
import torch
from torch.profiler import ProfilerActivity, profile

from torchneuron.kernels import cpp_kernel, nki_op

# 1. y = x * sigmoid(x) (SiLU), for contiguous float32 tensors.
SOURCE = r"""
#include <cmath>
extern "C" void my_silu(const tn_args* args) {
  const float* x = static_cast<const float*>(args->tensors[0].data);
  float* y = static_cast<float*>(args->tensors[1].data);
  tn_parallel(args, 0, args->tensors[0].numel, 16384, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
  });
}
extern "C" void my_silu_backward(const tn_args* args) {
  const float* x = static_cast<const float*>(args->tensors[0].data);
  const float* g = static_cast<const float*>(args->tensors[1].data);
  float* dx = static_cast<float*>(args->tensors[2].data);
  tn_parallel(args, 0, args->tensors[0].numel, 16384, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float s = 1.0f / (1.0f + std::exp(-x[i]));
      dx[i] = g[i] * s * (1.0f + x[i] * (1.0f - s));
    }
  });
}
"""

# 2. Kernels (compiled at first use).
silu_kernel = cpp_kernel(SOURCE, "my_silu")
silu_backward_kernel = cpp_kernel(SOURCE, "my_silu_backward")


# 3. The op, with its backward.
@nki_op("example::silu", mutates_args=())
def silu(x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32:
        raise TypeError(f"example::silu takes float32, got {x.dtype}")
    x = x.contiguous()
    y = torch.empty_like(x)
    silu_kernel(x, y)
    return y


@nki_op("example::silu_backward", mutates_args=())
def silu_backward(x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    dx = torch.empty_like(x)
    silu_backward_kernel(x.contiguous(), grad.contiguous(), dx)
    return dx


silu.register_autograd(
    lambda ctx, grad: silu_backward(ctx.saved_tensors[0], grad),
    setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))


def main() -> None:
    # 4a. Against PyTorch on CPU.
    torch.manual_seed(0)
    x = torch.randn(1000, 257)
    y = silu(x.to("neuron"))
    diff = (y.cpu() - torch.nn.functional.silu(x)).abs().max().item()
    print(f"forward: max |kernel - torch.nn.functional.silu on CPU| = {diff:.2e}")

    # 4b. Train through it.
    model = torch.nn.Linear(257, 257).to("neuron")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inputs, target = x.to("neuron"), torch.randn(1000, 257).to("neuron")
    for step in range(3):
        loss = torch.nn.functional.mse_loss(silu(model(inputs)), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.5f}")

    # 4c. Compile a function using it: one graph, no break.
    compiled = torch.compile(lambda t: silu(t * 2).sum(-1), fullgraph=True)
    print("compiled:", compiled(inputs)[:3].cpu())

    # 4d. The profiler shows it under its own name, as a custom work item.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        silu(inputs)
        torch.neuron.synchronize()
    rows = [e for e in prof.key_averages() if e.key == "my_silu"]
    print("profiler:", [(e.key, e.count) for e in rows])


if __name__ == "__main__":
    main()
