// native_dropout: its CPU kernel draws from the CPU default generator (the op
// has no Generator argument), so on neuron it is composed from device ops
// that use the device's Philox generator: bernoulli_ mask, then scale.
#include "aten/Common.h"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  NEURON_RECORD_OP("aten::native_dropout", Native);
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (input.numel() == 0 || (train.has_value() && !*train)) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  const double p1m = 1. - p;
  const double scale = p1m == 0 ? 0. : 1. / p1m;
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(p1m);
  at::Tensor output = input.mul(mask).mul_(scale);
  return {output, mask};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", TORCH_FN(native_dropout));
}

}  // namespace torchneuron
