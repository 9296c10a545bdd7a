// A CPU scalar operand of a queued binary kernel, in the dtype the kernel
// computes in.
#pragma once

#include <ATen/core/Tensor.h>

namespace torchneuron {

// `scalar` (a 0-dim CPU tensor: a Python number's wrapped tensor or the
// user's) as a 0-dim CPU tensor of `type`, converted as TensorIterator
// converts an input to its common dtype on CPU (c10::convert, the copy
// kernel's element conversion), wrapped-number flag kept. Given this, a
// CPU kernel computes with the same value without making the temporary
// itself (for x.mul_(0.5) on 64 floats that copy was about half of the
// item's time on the device).
//
// Not for Half and BFloat16 (`convertibleScalarType`): there CPU's mul and
// div kernels read the scalar operand's original value in float
// (TensorIterator::original_scalar_value), and with the scalar converted
// first add, sub, mul and div all gave other bits than CPU's
// (tests/test_direct_ops.py, test_scalar_operands_match_cpu).
at::Tensor hostScalarAs(const at::Tensor& scalar, at::ScalarType type);

// The value hostScalarAs(scalar, kFloat) holds, without making the tensor.
float hostScalarAsFloat(const at::Tensor& scalar);

inline bool convertibleScalarType(at::ScalarType type) {
  return !at::isReducedFloatingType(type) && type != at::kComplexHalf;
}

}  // namespace torchneuron
