// Helpers shared by the ATen kernels of the backend.
#pragma once

#include "aten/OpTracking.h"
#include "core/DeviceAllocator.h"
#include "core/Runtime.h"
#include "core/Stream.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/jit_type.h>
#include <ATen/core/operator_name.h>
#include <ATen/core/stack.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

#include <functional>
#include <utility>
#include <vector>

namespace c10 {
class OperatorHandle;
}

namespace torchneuron {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

inline bool isNeuron(const at::Tensor& t) {
  return t.defined() && t.device().type() == kNeuron;
}

// Grows or shrinks a neuron storage (runtime copy of the kept bytes).
void resizeStorageBytes(const c10::Storage& storage, size_t new_bytes);

// A CPU storage over the same bytes as `storage` (no ownership). With
// `resizable`, growing it moves it to fresh CPU memory, which callers detect.
inline c10::Storage cpuStorageAlias(const c10::Storage& storage, bool resizable = false) {
  auto* impl = storage.unsafeGetStorageImpl();
  void* data = const_cast<void*>(impl->data());
  return c10::Storage(c10::Storage::use_byte_size_t(), impl->nbytes(),
                      c10::DataPtr(data, c10::Device(c10::DeviceType::CPU)),
                      resizable ? c10::GetCPUAllocator() : nullptr, resizable);
}

// A tensor of dispatch key `key` over `storage` with t's metadata.
inline at::Tensor tensorOverStorage(c10::Storage storage, const at::Tensor& like,
                                    c10::DispatchKey key) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                      c10::DispatchKeySet(key), like.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(),
                                                   like.storage_offset());
  out._set_conj(like.is_conj());
  out._set_neg(like.is_neg());
  return out;
}

// A view of device tensor `base` with `like`'s metadata, made as ATen makes
// views: with the base's dispatch keys, so a view of a normal tensor is not
// an inference tensor even under inference mode (autograd then records it as
// a view: view_as_real of a parameter in inference mode).
inline at::Tensor viewOf(const at::Tensor& base, const at::Tensor& like) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(), like.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(),
                                                   like.storage_offset());
  out._set_conj(like.is_conj());
  out._set_neg(like.is_neg());
  return out;
}

// A CPU tensor aliasing the memory of neuron tensor t (same sizes, strides,
// storage offset). Valid only while t's storage lives and no queued device
// work touches it concurrently.
inline at::Tensor cpuAlias(const at::Tensor& t) {
  return tensorOverStorage(cpuStorageAlias(t.storage()), t, c10::DispatchKey::CPU);
}

// Whether a schema type is `kind` or Optional[kind] (Generator?, Device?).
inline bool isKindOrOptional(const c10::TypePtr& type, c10::TypeKind kind) {
  if (auto opt = type->cast<c10::OptionalType>()) return opt->getElementType()->kind() == kind;
  return type->kind() == kind;
}

// Adds (device tensor, its CPU twin) to a generic path's list of written
// arguments, once: a tensor passed twice (x.op_(x), op(x, out=x)) is synced
// back once.
inline void noteWritten(std::vector<std::pair<at::Tensor, at::Tensor>>& written,
                        const at::Tensor& device, const at::Tensor& cpu) {
  for (const auto& w : written) {
    if (w.second.is_same(cpu)) return;
  }
  written.emplace_back(device, cpu);
}

// Calls f on each tensor of iv (a tensor, a list, an optional list).
template <class F>
void forEachTensor(const c10::IValue& iv, F&& f) {
  if (iv.isTensor()) {
    f(iv.toTensor());
  } else if (iv.isTensorList()) {
    for (const at::Tensor& t : iv.toTensorList()) f(t);
  } else if (iv.isOptionalTensorList()) {
    for (const std::optional<at::Tensor>& t : iv.toOptionalTensorList())
      if (t.has_value()) f(*t);
  }
}

// iv with f applied to its tensors (a tensor, a list, an optional list);
// other values unchanged. The generic paths convert arguments and results
// with it.
template <class F>
c10::IValue mapTensors(const c10::IValue& iv, F&& f) {
  if (iv.isTensor()) return f(iv.toTensor());
  if (iv.isTensorList()) {
    c10::List<at::Tensor> out;
    out.reserve(iv.toTensorList().size());
    for (const at::Tensor& t : iv.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (iv.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : iv.toOptionalTensorList())
      out.push_back(t.has_value() ? std::optional<at::Tensor>(f(*t)) : std::nullopt);
    return out;
  }
  return iv;
}

// The operator's full name, e.g. "aten::add.Tensor".
inline std::string fullName(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// Generic path entry point (Fallback.cpp): runs op's CPU kernel on device
// memory. Kernels with a fast path call it when their preconditions fail.
void genericFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The generic path running `target` (a CPU-capable op with the same
// arguments, after `adjust` edits the converted stack from index `begin`)
// in place of `op`'s CPU kernel. For ops whose CPU entry point differs from
// the one PrivateUse1 reaches (e.g. convolution_overrideable).
using StackAdjust = std::function<void(torch::jit::Stack&, size_t begin)>;
void runGeneric(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                const c10::OperatorHandle* target, const StackAdjust& adjust);

// How many generic-path outputs had to be copied (not adopted zero-copy, or
// on the queued path not computed in place), in all; per op, in op tracking
// (resultCopies) when it is on.
int64_t freshOutputCopies();
void recordFreshOutputCopy(OpCounters* op);
// Routes ops that CPU runs with a kernel of its own (and PyTorch would
// otherwise decompose for neuron) to the generic path; idempotent. Called once
// the backend's static registrations are done (CpuParity.cpp).
void registerCpuParityKernels();

// Copies a CPU tensor into a new tensor on a neuron device (same sizes and,
// for dense tensors, the same strides).
at::Tensor copyToDevice(const at::Tensor& cpu, c10::DeviceIndex device);

}  // namespace torchneuron
