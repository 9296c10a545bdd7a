// The direct paths of add and mul (DirectOp.h); large contiguous calls are
// queued fusible (Fusion.h).
#include "aten/DirectOp.h"
#include "aten/Fusion.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/result_type.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

enum class Kind { Add, Mul };

bool fastDtype(at::ScalarType t) {
  switch (t) {
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kHalf: case at::kFloat: case at::kDouble: case at::kBFloat16: case at::kBool:
    case at::kComplexFloat: case at::kComplexDouble:
      return true;
    default:
      return false;
  }
}

bool usableOperand(const at::Tensor& t, c10::Device device) {
  if (!t.defined() || t.is_conj() || t.is_neg()) return false;
  if (t.device() == device) return true;
  return t.device().is_cpu() && t.dim() == 0;
}

// Alpha must be acceptable to the CPU kernel without error.
bool alphaIsSimple(const at::Scalar& alpha, at::ScalarType result) {
  if (alpha.isIntegral(/*includeBool=*/false)) {
    return !(result == at::kBool && alpha.toLong() != 1);
  }
  if (alpha.isFloatingPoint()) return at::isFloatingType(result) || at::isComplexType(result);
  return false;
}

// Output strides for a result of shape `shape`: those of a dense same-shape
// input (like TensorIterator), else contiguous.
at::Tensor allocateOutput(c10::IntArrayRef shape, at::ScalarType dtype, const at::Tensor& a,
                          const at::Tensor& b) {
  for (const at::Tensor* t : {&a, &b}) {
    if (isNeuron(*t) && t->sizes() == shape && t->is_non_overlapping_and_dense()) {
      return emptyDeviceStrided(shape, t->strides(), dtype);
    }
  }
  return emptyDevice(shape, dtype);
}

void compute(Kind kind, at::Tensor out, const at::Tensor& a, const at::Tensor& b,
             const at::Scalar& alpha) {
  if (kind == Kind::Add) {
    at::cpu::add_out(out, a, b, alpha);
  } else {
    at::cpu::mul_out(out, a, b);
  }
}

// The queued op, for a fusion pass (Fusion.h) when every operand is a
// scalar or contiguous of the output's shape.
struct FastOp final : FusibleOp {
  Kind kind;
  Operand out, a, b;
  at::Scalar alpha;
  void run() override { compute(kind, out.cpu(), a.cpu(), b.cpu(), alpha); }
  void runRange(int64_t begin, int64_t end) override {
    compute(kind, out.piece(begin, end), a.piece(begin, end), b.piece(begin, end), alpha);
  }
};

bool fusible(const at::Tensor& t, const at::Tensor& out) {
  if (t.device().is_cpu() || t.dim() == 0) return true;
  return t.sizes() == out.sizes() && t.is_contiguous();
}

void enqueue(Kind kind, const char* name, const at::Tensor& out, const at::Tensor& a,
             const at::Tensor& b, const at::Scalar& alpha) {
  auto stream = getCurrentStream(out.device().index());
  if (out.numel() >= kMinFusibleElements && fusionEnabled() && out.is_contiguous() &&
      fusible(a, out) && fusible(b, out)) {
    auto op = std::make_unique<FastOp>();
    op->kind = kind;
    op->out = Operand::of(out, /*written=*/true);
    op->a = Operand::of(a);
    op->b = Operand::of(b);
    op->alpha = alpha;
    op->numel = out.numel();
    launchFusible(stream, describeDirect(name, out, {&a, &b}), std::move(op));
    return;
  }
  launchOnStream(stream, name, [kind, ro = Operand::of(out, /*written=*/true), ra = Operand::of(a),
                                rb = Operand::of(b), alpha]() {
    compute(kind, ro.cpu(), ra.cpu(), rb.cpu(), alpha);
  });
}

enum class Mode { Functional, InPlace, Out };

// Tries the fast path; returns an undefined tensor when the generic path
// must run.
at::Tensor tryFast(Kind kind, const char* name, const at::Tensor& self, const at::Tensor& other,
                   const at::Scalar& alpha, Mode mode, const at::Tensor* out_arg) {
  if (!isNeuron(self)) return {};
  const c10::Device device = self.device();
  if (!usableOperand(self, device) || !usableOperand(other, device)) return {};
  if (self.scalar_type() == at::kBool && kind == Kind::Add) return {};
  // Only dtypes CPU's add and mul kernels have: the others (uint16/32/64,
  // float8) take the generic path, which raises CPU's NotImplementedError at
  // the op instead of failing a queued kernel.
  for (const at::Tensor* t : {&self, &other})
    if (!fastDtype(t->scalar_type())) return {};
  at::ScalarType rtype;
  at::DimVector shape;
  try {
    // Operands of one dtype give that dtype (at::result_type, without its
    // dispatcher call); equal sizes need no broadcast.
    rtype = self.scalar_type() == other.scalar_type() ? self.scalar_type()
                                                      : at::result_type(self, other);
    shape = self.sizes() == other.sizes() ? at::DimVector(self.sizes())
                                          : at::infer_size_dimvector(self.sizes(), other.sizes());
  } catch (const c10::Error&) {
    return {};
  }
  if (kind == Kind::Add && !alphaIsSimple(alpha, rtype)) return {};
  // A zero-element result's strides are TensorIterator's choice (a sliced
  // input's are not kept): the generic path gives CPU's.
  if (mode == Mode::Functional && c10::multiply_integers(shape) == 0) return {};
  at::Tensor out;
  if (mode == Mode::Functional) {
    c10::DeviceGuard guard(device);
    out = allocateOutput(shape, rtype, self, other);
  } else {
    out = mode == Mode::InPlace ? self : *out_arg;
    if (!isNeuron(out) || out.device() != device || out.sizes() != c10::IntArrayRef(shape)) {
      return {};
    }
    if (out.is_conj() || out.is_neg()) return {};
    if (!at::canCast(rtype, out.scalar_type())) return {};
    if (at::has_internal_overlap(out) != at::MemOverlap::No) return {};
    for (const at::Tensor* in : {&self, &other}) {
      if (isNeuron(*in) && at::get_overlap_status(out, *in) == at::MemOverlapStatus::Partial) {
        return {};
      }
    }
  }
  if (out.numel() > 0) {
    c10::DeviceGuard guard(device);
    enqueue(kind, name, out, self, other, alpha);
  }
  return out;
}

at::Tensor add_tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  NEURON_DIRECT_OP("aten::add.Tensor");
  at::Tensor r = tryFast(Kind::Add, kName, self, other, alpha, Mode::Functional, nullptr);
  if (r.defined()) {
    recordOp(counters, OpPath::Async);
    return r;
  }
  static const auto& op = genericOp("aten::add", "Tensor");
  return viaGeneric(op, {self, other, alpha});
}

at::Tensor& add_inplace(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  NEURON_DIRECT_OP("aten::add_.Tensor");
  if (tryFast(Kind::Add, kName, self, other, alpha, Mode::InPlace, nullptr).defined()) {
    recordOp(counters, OpPath::Async);
    return self;
  }
  static const auto& op = genericOp("aten::add_", "Tensor");
  viaGeneric(op, {self, other, alpha});
  return self;
}

at::Tensor& add_out(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha,
                    at::Tensor& out) {
  NEURON_DIRECT_OP("aten::add.out");
  if (tryFast(Kind::Add, kName, self, other, alpha, Mode::Out, &out).defined()) {
    recordOp(counters, OpPath::Async);
    return out;
  }
  static const auto& op = genericOp("aten::add", "out");
  viaGeneric(op, {self, other, alpha, out});
  return out;
}

at::Tensor mul_tensor(const at::Tensor& self, const at::Tensor& other) {
  NEURON_DIRECT_OP("aten::mul.Tensor");
  at::Tensor r = tryFast(Kind::Mul, kName, self, other, 1, Mode::Functional, nullptr);
  if (r.defined()) {
    recordOp(counters, OpPath::Async);
    return r;
  }
  static const auto& op = genericOp("aten::mul", "Tensor");
  return viaGeneric(op, {self, other});
}

at::Tensor& mul_inplace(at::Tensor& self, const at::Tensor& other) {
  NEURON_DIRECT_OP("aten::mul_.Tensor");
  if (tryFast(Kind::Mul, kName, self, other, 1, Mode::InPlace, nullptr).defined()) {
    recordOp(counters, OpPath::Async);
    return self;
  }
  static const auto& op = genericOp("aten::mul_", "Tensor");
  viaGeneric(op, {self, other});
  return self;
}

at::Tensor& mul_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  NEURON_DIRECT_OP("aten::mul.out");
  if (tryFast(Kind::Mul, kName, self, other, 1, Mode::Out, &out).defined()) {
    recordOp(counters, OpPath::Async);
    return out;
  }
  static const auto& op = genericOp("aten::mul", "out");
  viaGeneric(op, {self, other, out});
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("add.Tensor", TORCH_FN(add_tensor));
  m.impl("add_.Tensor", TORCH_FN(add_inplace));
  m.impl("add.out", TORCH_FN(add_out));
  m.impl("mul.Tensor", TORCH_FN(mul_tensor));
  m.impl("mul_.Tensor", TORCH_FN(mul_inplace));
  m.impl("mul.out", TORCH_FN(mul_out));
}

}  // namespace torchneuron
