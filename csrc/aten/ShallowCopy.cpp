// ShallowCopy.cpp — whether a CPU tensor may take a neuron tensor's place.
//
// `param.data = moved` (what nn.Module.to() does for every parameter) swaps
// the TensorImpl's contents only when the two tensors are "shallow-copy
// compatible". c10 answers yes for dense CPU/CUDA/... pairs but has no
// PrivateUse1 entry and lets the backend answer through this operator. If
// it answered no, Module.to("neuron") would make a new Parameter per module
// instead, and weights tied between modules (GPT-2's embedding and LM head)
// would silently come apart.
#include "aten/Common.h"

#include <torch/library.h>

namespace torchneuron {
namespace {

bool denseCpuOrNeuron(const at::Tensor& t) {
  return t.layout() == at::kStrided && !t.is_quantized() &&
         (t.device().is_cpu() || t.device().type() == kNeuron);
}

bool hasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  if (denseCpuOrNeuron(self) && denseCpuOrNeuron(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(hasCompatibleShallowCopyType));
}

}  // namespace torchneuron
