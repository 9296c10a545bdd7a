#include "distributed/Agreement.h"

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

namespace torchneuron::distributed {

Signature signatureOf(int opType, int64_t root, const std::vector<at::Tensor>& tensors) {
  Signature s;
  s.add("operation", opType);
  s.add("root rank", root);
  s.add("dtype", tensors.empty() ? -1 : static_cast<int64_t>(tensors.front().scalar_type()));
  s.add("tensor count", static_cast<int64_t>(tensors.size()));
  int64_t elements = 0;
  for (const auto& t : tensors) elements += t.numel();
  s.add("elements", elements);
  return s;
}

void agree(c10d::Backend& transport, const char* op, const Signature& signature) {
  const size_t n = signature.values.size();
  // Host memory of this item's own (not an ATen allocation: kernels on the
  // executor may have their CPU allocations placed in device memory).
  std::vector<int64_t> buffer(2 * n);
  for (size_t i = 0; i < n; ++i) {
    buffer[i] = signature.values[i];
    buffer[n + i] = -signature.values[i];
  }
  std::vector<at::Tensor> tensors{at::from_blob(buffer.data(), {static_cast<int64_t>(2 * n)},
                                                at::TensorOptions().dtype(at::kLong))};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp(c10d::ReduceOp::MAX);
  transport.allreduce(tensors, opts)->wait();
  for (size_t i = 0; i < n; ++i) {
    const int64_t hi = buffer[i], lo = -buffer[n + i];
    if (hi == lo) continue;
    std::string field = signature.fields[i];
    std::string mine = std::to_string(signature.values[i]);
    if (field == "dtype") {
      mine = c10::toString(static_cast<c10::ScalarType>(signature.values[i]));
    }
    TORCH_CHECK(false, op, ": the ranks of the group called it with different arguments: ", field,
                " differs across ranks (from ", lo, " to ", hi, "; this rank: ", mine,
                "). Every rank must call the same collective, in the same order, with tensors of "
                "the same dtype and sizes.");
  }
}

}  // namespace torchneuron::distributed
