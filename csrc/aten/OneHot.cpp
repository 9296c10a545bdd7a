// one_hot: CPU's checks of the class values, with CPU's messages.
//
// ATen's one_hot skips its value checks on CUDA and PrivateUse1 (it relies on
// scatter's device-side assert), so an out-of-range class would surface as
// scatter's "index 5 is out of bounds" — late, and not what CPU says. The
// checks read the data (min and max), so they wait for the device, as CPU's
// and as any data-dependent op (nonzero) do; then ATen's own one_hot runs.
#include "aten/Common.h"

#include <ATen/ops/one_hot_native.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

at::Tensor one_hot(const at::Tensor& self, int64_t num_classes) {
  NEURON_RECORD_OP("aten::one_hot", Native);
  if (self.scalar_type() == at::kLong && self.numel() > 0) {
    TORCH_CHECK(self.min().item().toLong() >= 0, "Class values must be non-negative.");
    if (num_classes != -1) {
      TORCH_CHECK(num_classes > self.max().item().toLong(),
                  "Class values must be smaller than num_classes.");
    }
  }
  return at::native::one_hot(self, num_classes);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("one_hot", TORCH_FN(one_hot)); }

}  // namespace torchneuron
