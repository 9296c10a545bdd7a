// Asynchronous kernels for hot pointwise ops (add, mul): the host thread
// validates the arguments, computes the output metadata, allocates the
// output and enqueues the CPU kernel on the current stream; it does not wait.
// Whenever a precondition is not met the op takes the generic path, which
// produces the same results (and the same errors) synchronously.
#include "aten/Common.h"
#include "aten/Fusion.h"
#include "aten/Launch.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/result_type.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

// What a kernel needs to rebuild an operand on the executor. Device operands
// are raw pointers plus geometry (the closure must own no device memory).
struct Operand {
  void* data = nullptr;  // first element (storage offset applied)
  at::DimVector sizes;
  at::DimVector strides;
  at::ScalarType dtype = at::kFloat;
  at::Tensor host;  // a CPU scalar operand, kept as is

  // Inputs are read without materializing a copy-on-write storage (as on
  // CPU); the output is materialized.
  static Operand of(const at::Tensor& t, bool written = false) {
    Operand r;
    if (t.device().is_cpu()) {
      // A CPU scalar is read at launch time, like CUDA kernel arguments: a
      // user tensor is snapshotted (wrapped numbers are the binding's own
      // temporaries).
      r.host = t.unsafeGetTensorImpl()->is_wrapped_number() ? t : t.clone();
      return r;
    }
    r.data = written ? t.mutable_data_ptr() : const_cast<void*>(t.const_data_ptr());
    r.sizes = at::DimVector(t.sizes());
    r.strides = at::DimVector(t.strides());
    r.dtype = t.scalar_type();
    return r;
  }

  at::Tensor cpu() const {
    if (host.defined()) return host;
    return at::from_blob(data, sizes, strides, at::TensorOptions().dtype(dtype));
  }

  // Elements [begin, end) of a contiguous operand; a scalar whole.
  at::Tensor piece(int64_t begin, int64_t end) const {
    if (host.defined() || sizes.empty()) return cpu();
    return at::from_blob(static_cast<char*>(data) + begin * c10::elementSize(dtype), {end - begin},
                         at::TensorOptions().dtype(dtype));
  }
};

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
      return at::detail::empty_strided_generic(shape, t->strides(), getDeviceAllocator(),
                                               c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                               dtype);
    }
  }
  return at::detail::empty_generic(shape, getDeviceAllocator(),
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype,
                                   std::nullopt);
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

WorkDesc describe(const char* name, const at::Tensor& out, const at::Tensor& a,
                  const at::Tensor& b) {
  WorkDesc work;
  work.name = name;
  auto span = [](const at::Tensor& t) {
    return bufferSpan(t.const_data_ptr(), t.sizes(), t.strides(), t.element_size());
  };
  work.writes.push_back(span(out));
  for (const at::Tensor* in : {&a, &b})
    if (!in->device().is_cpu()) work.reads.push_back(span(*in));
  return work;
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
    launchFusible(stream, describe(name, out, a, b), std::move(op));
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
    rtype = at::result_type(self, other);
    shape = at::infer_size_dimvector(self.sizes(), other.sizes());
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

// The generic path for an unboxed call: box the arguments and run it.
const c10::OperatorHandle& handle(const char* name, const char* overload) {
  return *new c10::OperatorHandle(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload));
}

at::Tensor viaGeneric(const c10::OperatorHandle& op, torch::jit::Stack stack) {
  genericFallback(op, &stack);
  return stack.back().toTensor();
}

#define NEURON_FAST_COUNTERS(NAME)                          \
  static OpCounters* counters = opCounters(NAME);           \
  static const char* const kName = NAME

at::Tensor add_tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  NEURON_FAST_COUNTERS("aten::add.Tensor");
  at::Tensor r = tryFast(Kind::Add, kName, self, other, alpha, Mode::Functional, nullptr);
  if (r.defined()) {
    recordOp(counters, OpPath::Async);
    return r;
  }
  static const auto& op = handle("aten::add", "Tensor");
  return viaGeneric(op, {self, other, alpha});
}

at::Tensor& add_inplace(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  NEURON_FAST_COUNTERS("aten::add_.Tensor");
  if (tryFast(Kind::Add, kName, self, other, alpha, Mode::InPlace, nullptr).defined()) {
    recordOp(counters, OpPath::Async);
    return self;
  }
  static const auto& op = handle("aten::add_", "Tensor");
  viaGeneric(op, {self, other, alpha});
  return self;
}

at::Tensor& add_out(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha,
                    at::Tensor& out) {
  NEURON_FAST_COUNTERS("aten::add.out");
  if (tryFast(Kind::Add, kName, self, other, alpha, Mode::Out, &out).defined()) {
    recordOp(counters, OpPath::Async);
    return out;
  }
  static const auto& op = handle("aten::add", "out");
  viaGeneric(op, {self, other, alpha, out});
  return out;
}

at::Tensor mul_tensor(const at::Tensor& self, const at::Tensor& other) {
  NEURON_FAST_COUNTERS("aten::mul.Tensor");
  at::Tensor r = tryFast(Kind::Mul, kName, self, other, 1, Mode::Functional, nullptr);
  if (r.defined()) {
    recordOp(counters, OpPath::Async);
    return r;
  }
  static const auto& op = handle("aten::mul", "Tensor");
  return viaGeneric(op, {self, other});
}

at::Tensor& mul_inplace(at::Tensor& self, const at::Tensor& other) {
  NEURON_FAST_COUNTERS("aten::mul_.Tensor");
  if (tryFast(Kind::Mul, kName, self, other, 1, Mode::InPlace, nullptr).defined()) {
    recordOp(counters, OpPath::Async);
    return self;
  }
  static const auto& op = handle("aten::mul_", "Tensor");
  viaGeneric(op, {self, other});
  return self;
}

at::Tensor& mul_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  NEURON_FAST_COUNTERS("aten::mul.out");
  if (tryFast(Kind::Mul, kName, self, other, 1, Mode::Out, &out).defined()) {
    recordOp(counters, OpPath::Async);
    return out;
  }
  static const auto& op = handle("aten::mul", "out");
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
