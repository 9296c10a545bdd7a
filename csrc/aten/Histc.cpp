// Histc.cpp — torch.histc on integer tensors.
//
// CPU's histc takes floating inputs only; CUDA also counts integer tensors
// (result in the input's dtype), and libraries rely on it off CPU:
// transformers' grouped-mm mixture of experts counts tokens per expert with
// histc(expert_ids.int(), ...) on every device but cpu/mps. So neuron does
// what CUDA does: bins over the integers (bounds truncated to integers, as
// CUDA casts them to the input type), computed by CPU's kernel on a float64
// copy (exact for every int32 value and for int64 values below 2^53), then
// counts in the input's dtype. Floating inputs take the generic path
// unchanged: CPU's kernel, CPU's bits.
#include "aten/Common.h"

#include <ATen/ops/histc.h>
#include <c10/core/ScalarType.h>
#include <torch/library.h>

#include <cmath>

namespace torchneuron {
namespace {

void histcEntry(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // histc(Tensor self, int bins=100, Scalar min=0, Scalar max=0)
  const size_t begin = stack->size() - 4;
  const at::Tensor self = (*stack)[begin].toTensor();
  if (!c10::isIntegralType(self.scalar_type(), /*includeBool=*/false)) {
    genericFallback(op, stack);
    return;
  }
  const int64_t bins = (*stack)[begin + 1].toInt();
  const double lo = std::trunc((*stack)[begin + 2].toScalar().toDouble());
  const double hi = std::trunc((*stack)[begin + 3].toScalar().toDouble());
  torch::jit::drop(*stack, 4);
  at::Tensor counts = at::histc(self.to(at::kDouble), bins, lo, hi);
  stack->emplace_back(counts.to(self.scalar_type()));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&histcEntry>());
}

}  // namespace torchneuron
