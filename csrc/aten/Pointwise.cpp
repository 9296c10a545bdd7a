// Asynchronous kernels for hot pointwise ops (add, mul): the host thread
// validates the arguments, computes the output metadata, allocates the
// output and enqueues the CPU kernel on the current stream; it does not wait.
// Whenever a precondition is not met the op takes the generic path, which
// produces the same results (and the same errors) synchronously.
#include "aten/Common.h"
#include "aten/Launch.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/result_type.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

// What a kernel needs to rebuild a tensor on the executor.
struct TensorRef {
  void* data = nullptr;  // first element (storage offset applied)
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  at::ScalarType dtype = at::kFloat;
  at::Tensor host;  // a CPU scalar operand, kept as is

  static TensorRef of(const at::Tensor& t) {
    TensorRef r;
    if (t.device().is_cpu()) {
      r.host = t;
      return r;
    }
    r.data = t.data_ptr();
    r.sizes = t.sizes().vec();
    r.strides = t.strides().vec();
    r.dtype = t.scalar_type();
    return r;
  }

  at::Tensor cpu() const {
    if (host.defined()) return host;
    return at::from_blob(data, sizes, strides, at::TensorOptions().dtype(dtype));
  }
};

enum class Kind { Add, Mul };

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

void enqueue(Kind kind, const char* name, const at::Tensor& out, const at::Tensor& a,
             const at::Tensor& b, const at::Scalar& alpha) {
  auto stream = getCurrentStream(out.device().index());
  TensorRef ro = TensorRef::of(out), ra = TensorRef::of(a), rb = TensorRef::of(b);
  launchOnStream(stream, name, [kind, ro = std::move(ro), ra = std::move(ra),
                                rb = std::move(rb), alpha]() {
    at::Tensor o = ro.cpu();
    if (kind == Kind::Add) {
      at::cpu::add_out(o, ra.cpu(), rb.cpu(), alpha);
    } else {
      at::cpu::mul_out(o, ra.cpu(), rb.cpu());
    }
  });
}

// Tries the fast path; returns false when the generic path must run.
// mode: 0 functional, 1 in-place (out = self), 2 out= (out given).
bool tryFast(Kind kind, const char* name, const at::Tensor& self, const at::Tensor& other,
             const at::Scalar& alpha, int mode, const at::Tensor* out_arg, at::Tensor* result) {
  if (!isNeuron(self)) return false;
  const c10::Device device = self.device();
  if (!usableOperand(self, device) || !usableOperand(other, device)) return false;
  if (self.scalar_type() == at::kBool && kind == Kind::Add) return false;
  at::ScalarType rtype;
  std::vector<int64_t> shape;
  try {
    rtype = at::result_type(self, other);
    shape = at::infer_size(self.sizes(), other.sizes());
  } catch (const c10::Error&) {
    return false;
  }
  if (kind == Kind::Add && !alphaIsSimple(alpha, rtype)) return false;
  at::Tensor out;
  if (mode == 0) {
    c10::DeviceGuard guard(device);
    out = allocateOutput(shape, rtype, self, other);
  } else {
    out = mode == 1 ? self : *out_arg;
    if (!isNeuron(out) || out.device() != device || out.sizes() != c10::IntArrayRef(shape)) {
      return false;
    }
    if (out.is_conj() || out.is_neg()) return false;
    if (!at::canCast(rtype, out.scalar_type())) return false;
    if (at::has_internal_overlap(out) != at::MemOverlap::No) return false;
    for (const at::Tensor* in : {&self, &other}) {
      if (isNeuron(*in) && at::get_overlap_status(out, *in) == at::MemOverlapStatus::Partial) {
        return false;
      }
    }
  }
  recordOp(name, OpPath::Async);
  if (out.numel() > 0) {
    c10::DeviceGuard guard(device);
    enqueue(kind, name, out, self, other, alpha);
  }
  *result = out;
  return true;
}

// Boxed kernels: one per schema shape, falling back to the generic path.
template <Kind kind, int mode>
void boxedKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  const at::Tensor& self = (*stack)[begin].toTensor();
  const at::Tensor& other = (*stack)[begin + 1].toTensor();
  at::Scalar alpha = 1;
  if (kind == Kind::Add) alpha = (*stack)[begin + 2].toScalar();
  const at::Tensor* out_arg = mode == 2 ? &(*stack)[stack->size() - 1].toTensor() : nullptr;
  static const std::string name = fullName(schema.operator_name());
  at::Tensor result;
  if (!tryFast(kind, name.c_str(), self, other, alpha, mode, out_arg, &result)) {
    genericFallback(op, stack);
    return;
  }
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(result));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("add.Tensor", torch::CppFunction::makeFromBoxedFunction<&boxedKernel<Kind::Add, 0>>());
  m.impl("add_.Tensor", torch::CppFunction::makeFromBoxedFunction<&boxedKernel<Kind::Add, 1>>());
  m.impl("add.out", torch::CppFunction::makeFromBoxedFunction<&boxedKernel<Kind::Add, 2>>());
  m.impl("mul.Tensor", torch::CppFunction::makeFromBoxedFunction<&boxedKernel<Kind::Mul, 0>>());
  m.impl("mul_.Tensor", torch::CppFunction::makeFromBoxedFunction<&boxedKernel<Kind::Mul, 1>>());
  m.impl("mul.out", torch::CppFunction::makeFromBoxedFunction<&boxedKernel<Kind::Mul, 2>>());
}

}  // namespace torchneuron
