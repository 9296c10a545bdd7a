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

namespace {

// Every value's maximum and minimum across the group, through the transport:
// one all-reduce (MAX) of the values and their negations.
void extremesThroughTransport(c10d::Backend& transport, const std::vector<int64_t>& values,
                              std::vector<int64_t>& hi, std::vector<int64_t>& lo) {
  const size_t n = values.size();
  // Host memory of this item's own (not an ATen allocation: kernels on the
  // executor may have their CPU allocations placed in device memory).
  std::vector<int64_t> buffer(2 * n);
  for (size_t i = 0; i < n; ++i) {
    buffer[i] = values[i];
    buffer[n + i] = -values[i];
  }
  std::vector<at::Tensor> tensors{at::from_blob(buffer.data(), {static_cast<int64_t>(2 * n)},
                                                at::TensorOptions().dtype(at::kLong))};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp(c10d::ReduceOp::MAX);
  transport.allreduce(tensors, opts)->wait();
  hi.assign(buffer.begin(), buffer.begin() + n);
  lo.resize(n);
  for (size_t i = 0; i < n; ++i) lo[i] = -buffer[n + i];
}

}  // namespace

void agree(c10d::Backend& transport, AgreementBoard* board, std::chrono::milliseconds timeout,
           const char* op, const Signature& signature) {
  std::vector<int64_t> hi, lo;
  if (board != nullptr) {
    board->exchange(op, signature.values, hi, lo, timeout);
  } else {
    extremesThroughTransport(transport, signature.values, hi, lo);
  }
  for (size_t i = 0; i < signature.values.size(); ++i) {
    if (hi[i] == lo[i]) continue;
    std::string field = signature.fields[i];
    std::string mine = std::to_string(signature.values[i]);
    if (field == "dtype") {
      mine = c10::toString(static_cast<c10::ScalarType>(signature.values[i]));
    }
    TORCH_CHECK(false, op, ": the ranks of the group called it with different arguments: ", field,
                " differs across ranks (from ", lo[i], " to ", hi[i], "; this rank: ", mine,
                "). Every rank must call the same collective, in the same order, with tensors of "
                "the same dtype and sizes.");
  }
}

}  // namespace torchneuron::distributed
