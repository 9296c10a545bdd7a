// The direct path of relu and relu_ (DirectOp.h). CPU's relu is
// clamp_min(self, 0), which is the kernel queued here, so the bits are CPU's.
// Large contiguous calls take the generic path, which queues them fusible
// (Fusion.h); the direct path is for the calls where host cost decides.
#include "aten/DirectOp.h"
#include "aten/Fusion.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/clamp_min_cpu_dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

// Whether relu of `self` may take the direct path.
bool direct(const at::Tensor& self) {
  if (!isNeuron(self) || !plainOn(self, self.device())) return false;
  if (!floatingDtype(self.scalar_type()) || self.numel() == 0) return false;
  // What a fusion pass could take stays on the path that offers it.
  return !(fusionEnabled() && self.numel() >= kMinFusibleElements && self.is_contiguous());
}

at::Tensor relu(const at::Tensor& self) {
  NEURON_DIRECT_OP("aten::relu");
  // TensorIterator gives a dense input's strides to the output; other
  // layouts get its own choice, on the generic path.
  if (direct(self) && self.is_non_overlapping_and_dense()) {
    OnDevice onDevice(self.device());
    at::Tensor out = emptyDeviceStrided(self.sizes(), self.strides(), self.scalar_type());
    // The output is laid out as the dense input: a flat call (DirectOp.h).
    launchDirect(kName, out, {&self},
                 [numel = self.numel(), o = FlatOperand::of(out, /*written=*/true),
                  in = FlatOperand::of(self)] {
                   at::Tensor result = o.cpu(numel);
                   at::cpu::clamp_min_out(result, in.cpu(numel), 0);
                 });
    recordOp(counters, OpPath::Async);
    return out;
  }
  static const auto& op = genericOp("aten::relu", "");
  return viaGeneric(op, {self});
}

at::Tensor& relu_(at::Tensor& self) {
  NEURON_DIRECT_OP("aten::relu_");
  // An input whose elements share memory raises on CPU: the generic path says so.
  if (direct(self) && at::has_internal_overlap(self) == at::MemOverlap::No) {
    OnDevice onDevice(self.device());
    launchDirect(kName, self, {}, [s = Operand::of(self, /*written=*/true)] {
      at::Tensor t = s.cpu();
      at::cpu::clamp_min_(t, 0);
    });
    recordOp(counters, OpPath::Async);
    return self;
  }
  static const auto& op = genericOp("aten::relu_", "");
  viaGeneric(op, {self});
  return self;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("relu", TORCH_FN(relu));
  m.impl("relu_", TORCH_FN(relu_));
}

}  // namespace torchneuron
