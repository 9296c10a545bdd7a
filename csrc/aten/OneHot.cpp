// one_hot: CPU's checks of the class values, with CPU's messages, without a
// host wait when the number of classes is given.
//
// ATen's one_hot skips its value checks on CUDA and PrivateUse1 (it relies on
// scatter's device-side assert), so an out-of-range class would surface as
// scatter's "index 5 is out of bounds": not what CPU says.
// - num_classes given: the result's shape is known, so one queued kernel
//   checks the values (CPU's messages, CPU's order: negative first) and writes
//   the ones into a zeroed result; the host does not wait. A bad value is
//   reported as a failed `aten::one_hot` kernel at the next synchronizing
//   call, as CUDA reports its device-side assert (at the op under
//   NEURON_LAUNCH_BLOCKING=1).
// - num_classes == -1: the shape depends on the largest value, which the host
//   must read (CUDA waits too); then CPU's checks and ATen's one_hot run.
#include "aten/Common.h"
#include "aten/Launch.h"

#include <ATen/ops/one_hot_native.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <algorithm>

namespace torchneuron {
namespace {

// Checks `count` class values at `index` against [0, classes) and sets
// out[i * classes + index[i]] = 1. Runs on the device: values are read there.
void writeOneHot(const int64_t* index, int64_t count, int64_t classes, int64_t* out) {
  const auto [lo, hi] = std::minmax_element(index, index + count);
  TORCH_CHECK(*lo >= 0, "Class values must be non-negative.");
  TORCH_CHECK(classes > *hi, "Class values must be smaller than num_classes.");
  for (int64_t i = 0; i < count; ++i) out[i * classes + index[i]] = 1;
}

at::Tensor queuedOneHot(const at::Tensor& self, int64_t classes) {
  NEURON_RECORD_OP("aten::one_hot", Async);
  c10::DeviceGuard guard(self.device());
  const at::Tensor index = self.contiguous();
  std::vector<int64_t> shape = self.sizes().vec();
  shape.push_back(classes);
  at::Tensor out = at::zeros(shape, self.options());
  const int64_t count = index.numel();
  const int64_t* in = index.const_data_ptr<int64_t>();
  int64_t* result = out.mutable_data_ptr<int64_t>();
  WorkDesc work;
  work.name = "aten::one_hot";
  work.bytes = static_cast<uint64_t>(count) * sizeof(int64_t);
  work.reads.push_back({in, static_cast<size_t>(count) * sizeof(int64_t)});
  work.writes.push_back({result, static_cast<size_t>(out.numel()) * sizeof(int64_t)});
  // Raw pointers only (Launch.h): the caching allocator's stream order keeps
  // `index` (perhaps a temporary copy) valid until the kernel has run.
  launchWork(getCurrentStream(self.device().index()), work,
             [in, count, classes, result] { writeOneHot(in, count, classes, result); });
  return out;
}

at::Tensor one_hot(const at::Tensor& self, int64_t num_classes) {
  if (self.scalar_type() == at::kLong && self.numel() > 0 && num_classes > 0)
    return queuedOneHot(self, num_classes);
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
