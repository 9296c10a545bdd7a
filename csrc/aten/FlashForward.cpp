// _scaled_dot_product_flash_attention_for_cpu (the forward) on neuron: a
// guard in front of CPU's kernel, which the generic path runs. CPU's kernel
// divides by its block size, min(32, length): an empty query or key kills the
// process with SIGFPE, on CPU and, through the generic path, on the device's
// worker. F.scaled_dot_product_attention never sends such calls here (it
// handles empty inputs itself); a direct call of the op does. On neuron an
// empty query gets its empty results, in CPU's layouts, and empty keys with a
// non-empty query raise; every other call goes to the generic path.
#include "aten/Common.h"
#include "aten/DirectOp.h"

#include <c10/util/Exception.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

void flashForward(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  constexpr size_t kArgs = 7;
  const size_t begin = stack->size() - kArgs;
  for (size_t i = 0; i < 3; ++i)
    if (!(*stack)[begin + i].isTensor() || (*stack)[begin + i].toTensor().dim() != 4)
      return genericFallback(op, stack);
  const at::Tensor &q = (*stack)[begin].toTensor(), &k = (*stack)[begin + 1].toTensor();
  if (!isNeuron(q) || (q.size(2) != 0 && k.size(2) != 0)) return genericFallback(op, stack);
  TORCH_CHECK(q.size(2) == 0,
              "_scaled_dot_product_flash_attention_for_cpu: key and value have sequence length 0 "
              "for a query of length ", q.size(2), "; CPU's kernel cannot run that call (it "
              "divides by zero). Use F.scaled_dot_product_attention, which handles empty keys");
  const int64_t b = q.size(0), h = q.size(1), d = (*stack)[begin + 2].toTensor().size(3);
  OnDevice onDevice(q.device());
  // CPU's layouts: [B, S, H, D] and [B, S, H] memory seen through transpose(1, 2).
  at::Tensor out = emptyDeviceStrided({b, h, 0, d}, {h * d, d, h * d, 1}, q.scalar_type());
  const at::ScalarType lseType = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor lse = emptyDeviceStrided({b, h, 0}, {h, 1, h}, lseType);
  torch::jit::drop(*stack, kArgs);
  torch::jit::push(*stack, std::move(out), std::move(lse));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_flash_attention_for_cpu",
         torch::CppFunction::makeFromBoxedFunction<&flashForward>());
}

}  // namespace torchneuron
