// Direct paths: unboxed kernels for the hottest ops (add, sub, mul, div,
// relu, sum, mm, addmm, fill_, zero_, common unary ops), the cheapest way an
// op reaches the device.
//
// The host checks every precondition the CPU kernel would check, computes
// the output's metadata, allocates it and queues the CPU kernel over raw
// device pointers; it does not wait. Where a precondition does not hold
// (an odd dtype, an overlap, a shape that does not match) the op takes the
// generic path instead, which gives the same results and raises the same
// errors at the op. So a direct path never queues a kernel that could fail.
//
// The generic path (AsyncPath.h) reaches the same kernels through the boxed
// fallback: a stack of IValues, a string cache key, a Meta pass or its
// cached result. That costs the host about 1 us per op, which is more than
// CPU eager spends on a whole small op; the direct paths skip it.
#pragma once

#include "aten/Common.h"
#include "aten/HostScalar.h"
#include "aten/Launch.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>

#include <initializer_list>

namespace torchneuron {

// A CPU scalar operand as a kernel gets it: in `type` (hostScalarAs) unless
// that is Undefined, else as given.
inline at::Tensor hostOperandAs(const at::Tensor& host, at::ScalarType type) {
  return type == at::ScalarType::Undefined ? host : hostScalarAs(host, type);
}

// What a queued kernel needs to rebuild an operand on the executor: raw
// pointer plus geometry, since a closure must own no device memory (Launch.h).
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
      r.host = hostSnapshot(t);
      return r;
    }
    r.data = written ? t.mutable_data_ptr() : const_cast<void*>(t.const_data_ptr());
    r.sizes.assign(t.sizes().begin(), t.sizes().end());
    r.strides.assign(t.strides().begin(), t.strides().end());
    r.dtype = t.scalar_type();
    return r;
  }

  // The operand as a CPU tensor over the device memory (on the executor).
  at::Tensor cpu() const {
    if (host.defined()) return host;
    return at::from_blob(data, sizes, strides, at::TensorOptions().dtype(dtype));
  }

  // As cpu(), with a CPU scalar as hostOperandAs(type).
  at::Tensor cpuAs(at::ScalarType type) const {
    return host.defined() ? hostOperandAs(host, type) : cpu();
  }

  // A CPU scalar is read at launch time, like CUDA kernel arguments: a user
  // tensor is snapshotted (wrapped numbers are the binding's own
  // temporaries).
  static at::Tensor hostSnapshot(const at::Tensor& t) {
    return t.unsafeGetTensorImpl()->is_wrapped_number() ? t : t.clone();
  }
};

// An operand of a flat call: the kernel computes over 1-D views of the
// operands' memory. Valid where every device operand is either 0-dim or
// dense with the same sizes and strides as the output (contiguous ones, or a
// unary op's input and its output laid out alike): TensorIterator coalesces
// such operands to one dimension in memory order anyway, as the fusion
// pass's pieces do, so the elements and the loop are the same. The closure
// then holds no sizes or strides: three of these and a Scalar fit in two
// cache lines, which the host writes and the executor reads per small op
// (three Operands take eight).
struct FlatOperand {
  void* data = nullptr;  // the lowest address of the operand's elements
  at::Tensor host;       // a CPU scalar operand, kept as Operand keeps it
  at::ScalarType dtype = at::kFloat;
  bool zeroDim = false;

  static FlatOperand of(const at::Tensor& t, bool written = false) {
    FlatOperand r;
    if (t.device().is_cpu()) {
      r.host = Operand::hostSnapshot(t);
      return r;
    }
    r.data = written ? t.mutable_data_ptr() : const_cast<void*>(t.const_data_ptr());
    r.dtype = t.scalar_type();
    r.zeroDim = t.dim() == 0;
    return r;
  }

  // A CPU view of `numel` elements (a CPU scalar as hostOperandAs(type)).
  at::Tensor cpu(int64_t numel, at::ScalarType type = at::ScalarType::Undefined) const {
    return piece(0, numel, type);
  }

  // Elements [begin, end), for a fusion pass's blocks; a scalar whole.
  at::Tensor piece(int64_t begin, int64_t end,
                   at::ScalarType type = at::ScalarType::Undefined) const {
    if (host.defined()) return hostOperandAs(host, type);
    const auto options = at::TensorOptions().dtype(dtype);
    if (zeroDim) return at::from_blob(data, {}, options);
    return at::from_blob(static_cast<char*>(data) + begin * c10::elementSize(dtype), {end - begin},
                         options);
  }
};

// The floating dtypes the direct paths of relu, sum, mm and addmm take; the
// others go the generic way (integer promotion, missing kernels).
inline bool floatingDtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// A device tensor the direct paths can hand to a CPU kernel as is: no lazy
// conjugate or negative bit (those need the generic path's resolution).
inline bool plainOn(const at::Tensor& t, c10::Device device) {
  return t.defined() && t.device() == device && !t.is_conj() && !t.is_neg();
}

// Makes `device` current for a direct op's allocation and launch, and
// restores the previous one after. Calls are nearly always on the current
// device already: then it costs one read instead of a DeviceGuard's
// exchange and restore.
class OnDevice {
 public:
  explicit OnDevice(c10::Device device) {
    if (currentDevice() != device.index()) guard_.reset_device(device);
  }

 private:
  c10::OptionalDeviceGuard guard_;
};

// A fresh device tensor (at::empty_strided / at::empty on the device).
inline at::Tensor emptyDevice(c10::IntArrayRef shape, at::ScalarType dtype) {
  return at::detail::empty_generic(shape, getDeviceAllocator(),
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype,
                                   std::nullopt);
}
inline at::Tensor emptyDeviceStrided(c10::IntArrayRef shape, c10::IntArrayRef strides,
                                     at::ScalarType dtype) {
  return at::detail::empty_strided_generic(
      shape, strides, getDeviceAllocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      dtype);
}

// The device bytes a tensor spans (QueuedKernel.h's spanOf for a TensorRef).
inline nrtBufferRange spanOf(const at::Tensor& t) {
  return bufferSpan(t.const_data_ptr(), t.sizes(), t.strides(), t.element_size());
}

// The work record of a direct kernel: it writes `out` and reads the device
// tensors among `inputs` (for the profiler and fusion's overlap checks).
inline WorkDesc describeDirect(const char* name, const at::Tensor& out,
                               std::initializer_list<const at::Tensor*> inputs) {
  WorkDesc work;
  work.name = name;
  work.writes.push_back(spanOf(out));
  for (const at::Tensor* in : inputs)
    if (in->defined() && !in->device().is_cpu()) work.reads.push_back(spanOf(*in));
  return work;
}

// Queues a direct kernel on the current stream of `out`'s device.
template <class F>
void launchDirect(const char* name, const at::Tensor& out,
                  std::initializer_list<const at::Tensor*> inputs, F&& fn) {
  launchWork(getCurrentStream(out.device().index()), describeDirect(name, out, inputs),
             std::forward<F>(fn));
}

// Queues `kernel(t)`, an elementwise kernel computing in place, over
// `self`'s elements: over a 1-D view of its memory when it is dense (a flat
// call: TensorIterator coalesces such an operand to that one dimension in
// memory order anyway), else over its own geometry.
template <class Kernel>
void launchInPlace(const char* name, const at::Tensor& self, Kernel kernel) {
  if (self.is_non_overlapping_and_dense()) {
    launchDirect(name, self, {},
                 [s = FlatOperand::of(self, /*written=*/true), numel = self.numel(), kernel] {
                   at::Tensor t = s.cpu(numel);
                   kernel(t);
                 });
  } else {
    launchDirect(name, self, {}, [s = Operand::of(self, /*written=*/true), kernel] {
      at::Tensor t = s.cpu();
      kernel(t);
    });
  }
}

// The generic path for an unboxed call whose direct path declined: the
// arguments are boxed and run there (it raises what CPU raises).
inline const c10::OperatorHandle& genericOp(const char* name, const char* overload) {
  return *new c10::OperatorHandle(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload));
}
inline at::Tensor viaGeneric(const c10::OperatorHandle& op, torch::jit::Stack stack) {
  genericFallback(op, &stack);
  return stack.back().toTensor();
}

// A direct kernel's op counters and work-item name, looked up once.
#define NEURON_DIRECT_OP(NAME)                              \
  static OpCounters* counters = opCounters(NAME);           \
  static const char* const kName = NAME

}  // namespace torchneuron
