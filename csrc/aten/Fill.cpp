// The direct paths of fill_ and zero_ (DirectOp.h): what torch.zeros,
// torch.ones, torch.full, zeros_like and zero_grad(set_to_none=False) end in.
// Through the generic path they cost the host 5x what CPU spends on them
// (CPU's zero_ of a small tensor is a memset). The kernels queued are CPU's
// own, over the device memory, so the bits are CPU's.
#include "aten/DirectOp.h"
#include "core/SerialCompute.h"

#include <ATen/Dispatch.h>
#include <ATen/ops/fill_cpu_dispatch.h>
#include <ATen/ops/zero_cpu_dispatch.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

// CPU's fill_ and zero_ check no overlap (an expanded tensor is filled as
// it is), so any plain device tensor with elements may go direct.
bool direct(const at::Tensor& self) {
  return isNeuron(self) && plainOn(self, self.device()) && self.numel() > 0;
}

// Whether fill_ of a tensor of `dtype` with `value` may go direct. CPU's
// fill_ kernel first converts the value to the dtype with a range check
// (Scalar::to), the one step of it that can fail: run here, it raises what
// CPU raises, at the op. (Through the generic path, a call whose kind was
// verified before was queued, and a value out of range failed on the device,
// reported at a later call.) Other dtypes and symbolic values go the
// generic way.
bool fillable(at::ScalarType dtype, const c10::Scalar& value) {
  if (value.isSymbolic()) return false;
  switch (dtype) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kBool: case at::kComplexFloat: case at::kComplexDouble:
      break;
    default:
      return false;
  }
  AT_DISPATCH_ALL_TYPES_AND_COMPLEX_AND3(at::kHalf, at::kBFloat16, at::kBool, dtype, "fill_",
                                         [&] { (void)value.to<scalar_t>(); });
  return true;
}

at::Tensor& fill_(at::Tensor& self, const c10::Scalar& value) {
  NEURON_DIRECT_OP("aten::fill_.Scalar");
  if (direct(self) && fillable(self.scalar_type(), value)) {
    OnDevice onDevice(self.device());
    // Every element gets the same value: any split has the same bits,
    // so a small fill runs on one thread (SerialCompute.h).
    launchInPlace(kName, self, [value](at::Tensor& t) {
      SerialScope serial(serialWorthy(t.numel()));
      at::cpu::fill_(t, value);
    });
    recordOp(counters, OpPath::Async);
    return self;
  }
  static const auto& op = genericOp("aten::fill_", "Scalar");
  viaGeneric(op, {self, value});
  return self;
}

at::Tensor& zero_(at::Tensor& self) {
  NEURON_DIRECT_OP("aten::zero_");
  if (direct(self)) {
    OnDevice onDevice(self.device());
    launchInPlace(kName, self, [](at::Tensor& t) {
      SerialScope serial(serialWorthy(t.numel()));  // as fill_
      at::cpu::zero_(t);
    });
    recordOp(counters, OpPath::Async);
    return self;
  }
  static const auto& op = genericOp("aten::zero_", "");
  viaGeneric(op, {self});
  return self;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("fill_.Scalar", TORCH_FN(fill_));
  m.impl("zero_", TORCH_FN(zero_));
}

}  // namespace torchneuron
