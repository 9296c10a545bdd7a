// The direct path of sum over dims (sum.dim_IntList, which a.sum() also
// calls) for floating tensors (DirectOp.h). The queued kernel is CPU's
// sum.out with the contiguous output CPU's functional sum allocates.
#include "aten/DirectOp.h"

#include <ATen/ops/sum_cpu_dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <bitset>

namespace torchneuron {
namespace {

// The result's shape, or nothing when the dims are not plainly valid (out
// of range, repeated): the generic path then raises CPU's error.
std::optional<at::DimVector> reducedShape(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                          bool keepdim) {
  const int64_t ndim = self.dim();
  std::bitset<64> reduced;
  if (!dim.has_value() || dim->empty()) {
    reduced.set();  // all dims
  } else {
    for (int64_t d : *dim) {
      if (d < -ndim || d >= ndim) return std::nullopt;
      const int64_t w = d < 0 ? d + ndim : d;
      if (reduced.test(w)) return std::nullopt;
      reduced.set(w);
    }
  }
  at::DimVector shape;
  for (int64_t d = 0; d < ndim; ++d) {
    if (!reduced.test(d)) shape.push_back(self.size(d));
    else if (keepdim) shape.push_back(1);
  }
  return shape;
}

at::Tensor sum_dim(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dtype) {
  NEURON_DIRECT_OP("aten::sum.dim_IntList");
  // Floating inputs keep their dtype; integer ones promote (generic path).
  const bool eligible = isNeuron(self) && plainOn(self, self.device()) &&
                        floatingDtype(self.scalar_type()) && self.dim() > 0 &&
                        self.dim() <= 64 && self.numel() > 0 &&
                        (!dtype.has_value() || *dtype == self.scalar_type());
  if (eligible) {
    if (auto shape = reducedShape(self, dim, keepdim)) {
      OnDevice onDevice(self.device());
      at::Tensor out = emptyDevice(*shape, self.scalar_type());
      std::optional<at::DimVector> dims;
      if (dim.has_value()) dims = at::DimVector(*dim);
      launchDirect(kName, out, {&self},
                   [o = Operand::of(out, /*written=*/true), in = Operand::of(self),
                    dims = std::move(dims), keepdim] {
                     at::Tensor result = o.cpu();
                     at::OptionalIntArrayRef d;
                     if (dims.has_value()) d = at::IntArrayRef(*dims);
                     at::cpu::sum_out(result, in.cpu(), d, keepdim, std::nullopt);
                   });
      recordOp(counters, OpPath::Async);
      return out;
    }
  }
  static const auto& op = genericOp("aten::sum", "dim_IntList");
  torch::jit::Stack stack{self, dim.has_value() ? c10::IValue(dim->vec()) : c10::IValue(),
                          keepdim, dtype.has_value() ? c10::IValue(*dtype) : c10::IValue()};
  return viaGeneric(op, std::move(stack));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("sum.dim_IntList", TORCH_FN(sum_dim)); }

}  // namespace torchneuron
