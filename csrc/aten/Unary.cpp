// The direct path of common floating unary ops (DirectOp.h): exp, log, sqrt,
// rsqrt, sin, cos, tanh, sigmoid, silu, erf, neg, abs, reciprocal, log1p and
// expm1, and relu (CPU's relu is clamp_min(self, 0), the kernel queued for
// it). Through the generic path each costs the host about twice what CPU
// spends on a small call. The kernel queued is CPU's own out= kernel, into
// an output laid out as CPU's functional call lays it out (a dense input's
// strides), so the bits are CPU's. Other dtypes (integer promotion, complex
// results), other layouts and in-place forms take the generic path, except
// relu_, which is common enough in models to have a direct path of its own.
// Large contiguous calls take the generic path too, which queues them
// fusible (Fusion.h); the direct path is for calls where host cost decides.
#include "aten/DirectOp.h"
#include "aten/Fusion.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/abs_cpu_dispatch.h>
#include <ATen/ops/clamp_min_cpu_dispatch.h>
#include <ATen/ops/cos_cpu_dispatch.h>
#include <ATen/ops/erf_cpu_dispatch.h>
#include <ATen/ops/exp_cpu_dispatch.h>
#include <ATen/ops/expm1_cpu_dispatch.h>
#include <ATen/ops/log1p_cpu_dispatch.h>
#include <ATen/ops/log_cpu_dispatch.h>
#include <ATen/ops/neg_cpu_dispatch.h>
#include <ATen/ops/reciprocal_cpu_dispatch.h>
#include <ATen/ops/rsqrt_cpu_dispatch.h>
#include <ATen/ops/sigmoid_cpu_dispatch.h>
#include <ATen/ops/silu_cpu_dispatch.h>
#include <ATen/ops/sin_cpu_dispatch.h>
#include <ATen/ops/sqrt_cpu_dispatch.h>
#include <ATen/ops/tanh_cpu_dispatch.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

using OutKernel = at::Tensor& (*)(at::Tensor&, const at::Tensor&);

// Whether a unary op of `self` may be queued by a direct path, in place.
bool queueable(const at::Tensor& self) {
  if (!isNeuron(self) || !plainOn(self, self.device())) return false;
  if (!floatingDtype(self.scalar_type()) || self.numel() == 0) return false;
  // What a fusion pass could take stays on the path that offers it.
  return !(fusionEnabled() && self.numel() >= kMinFusibleElements && self.is_contiguous());
}

// Whether a functional unary op of `self` may take the direct path: its
// output then takes a dense input's strides, as TensorIterator gives them
// (other layouts get its own choice, on the generic path).
bool direct(const at::Tensor& self) {
  return queueable(self) && self.is_non_overlapping_and_dense();
}

at::Tensor unary(const at::Tensor& self, const char* name, OpCounters* counters, OutKernel kernel,
                 const c10::OperatorHandle& generic) {
  if (!direct(self)) return viaGeneric(generic, {self});
  OnDevice onDevice(self.device());
  at::Tensor out = emptyDeviceStrided(self.sizes(), self.strides(), self.scalar_type());
  // The output is laid out as the dense input: a flat call (DirectOp.h).
  launchDirect(name, out, {&self},
               [kernel, numel = self.numel(), o = FlatOperand::of(out, /*written=*/true),
                in = FlatOperand::of(self)] {
                 at::Tensor result = o.cpu(numel);
                 kernel(result, in.cpu(numel));
               });
  recordOp(counters, OpPath::Async);
  return out;
}

#define NEURON_DIRECT_UNARY(OP)                                              \
  at::Tensor OP(const at::Tensor& self) {                                  \
    NEURON_DIRECT_OP("aten::" #OP);                                        \
    static const auto& generic = genericOp("aten::" #OP, "");              \
    return unary(self, kName, counters, &at::cpu::OP##_out, generic);      \
  }

NEURON_DIRECT_UNARY(exp)
NEURON_DIRECT_UNARY(log)
NEURON_DIRECT_UNARY(sqrt)
NEURON_DIRECT_UNARY(rsqrt)
NEURON_DIRECT_UNARY(sin)
NEURON_DIRECT_UNARY(cos)
NEURON_DIRECT_UNARY(tanh)
NEURON_DIRECT_UNARY(sigmoid)
NEURON_DIRECT_UNARY(silu)
NEURON_DIRECT_UNARY(erf)
NEURON_DIRECT_UNARY(neg)
NEURON_DIRECT_UNARY(abs)
NEURON_DIRECT_UNARY(reciprocal)
NEURON_DIRECT_UNARY(log1p)
NEURON_DIRECT_UNARY(expm1)

#undef NEURON_DIRECT_UNARY

at::Tensor& reluOut(at::Tensor& out, const at::Tensor& self) {
  return at::cpu::clamp_min_out(out, self, 0);
}

at::Tensor relu(const at::Tensor& self) {
  NEURON_DIRECT_OP("aten::relu");
  static const auto& generic = genericOp("aten::relu", "");
  return unary(self, kName, counters, &reluOut, generic);
}

at::Tensor& relu_(at::Tensor& self) {
  NEURON_DIRECT_OP("aten::relu_");
  // An input whose elements share memory raises on CPU: the generic path says so.
  if (queueable(self) && at::has_internal_overlap(self) == at::MemOverlap::No) {
    OnDevice onDevice(self.device());
    launchInPlace(kName, self, [](at::Tensor& t) { at::cpu::clamp_min_(t, 0); });
    recordOp(counters, OpPath::Async);
    return self;
  }
  static const auto& generic = genericOp("aten::relu_", "");
  viaGeneric(generic, {self});
  return self;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("exp", TORCH_FN(exp));
  m.impl("log", TORCH_FN(log));
  m.impl("sqrt", TORCH_FN(sqrt));
  m.impl("rsqrt", TORCH_FN(rsqrt));
  m.impl("sin", TORCH_FN(sin));
  m.impl("cos", TORCH_FN(cos));
  m.impl("tanh", TORCH_FN(tanh));
  m.impl("sigmoid", TORCH_FN(sigmoid));
  m.impl("silu", TORCH_FN(silu));
  m.impl("erf", TORCH_FN(erf));
  m.impl("neg", TORCH_FN(neg));
  m.impl("abs", TORCH_FN(abs));
  m.impl("reciprocal", TORCH_FN(reciprocal));
  m.impl("log1p", TORCH_FN(log1p));
  m.impl("expm1", TORCH_FN(expm1));
  m.impl("relu", TORCH_FN(relu));
  m.impl("relu_", TORCH_FN(relu_));
}

}  // namespace torchneuron
