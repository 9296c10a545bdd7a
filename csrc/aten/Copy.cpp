// Copies between host and device and between devices: _copy_from,
// _copy_from_and_resize and _local_scalar_dense.
//
// Dense copies with matching dtype and layout are a single runtime copy:
//   H2D / D2H  nrtMemcpy (synchronous), or nrtMemcpyAsync on the current
//              stream when non_blocking and the host side is pinned memory
//              (non_blocking H2D from pageable memory is staged in pinned
//              memory first, like CUDA);
//   D2D        nrtMemcpyAsync on the current stream (same device) or a
//              synchronous nrtMemcpy (across devices).
// Anything else (dtype conversion, non-dense layouts, broadcasting, conj/neg
// bits) is staged: converted on the host side or run as an on-device copy_
// kernel over aliased memory.
#include "aten/Common.h"

#include "core/HostAllocator.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstring>

namespace torchneuron {
namespace {

// True when a and b describe the same bytes layout: one flat memcpy copies.
bool sameDenseLayout(const at::Tensor& a, const at::Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  if (a.is_conj() != b.is_conj() || a.is_neg() != b.is_neg()) return false;
  if (!a.is_non_overlapping_and_dense() || !b.is_non_overlapping_and_dense()) return false;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) != 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

size_t denseBytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// A neuron tensor with dst's dense layout (dst's strides when dense).
at::Tensor emptyDeviceLike(const at::Tensor& like, c10::DeviceIndex device, at::ScalarType dtype) {
  c10::DeviceGuard guard(c10::Device(kNeuron, device));
  if (like.is_non_overlapping_and_dense()) {
    return at::detail::empty_strided_generic(like.sizes(), like.strides(), getDeviceAllocator(),
                                             c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                             dtype);
  }
  return at::detail::empty_generic(like.sizes(), getDeviceAllocator(),
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype,
                                   std::nullopt);
}

// True when p is device memory (a CPU tensor of the generic path may alias it).
bool isDevicePtr(const void* p) {
  nrtPointerAttributes attr{};
  return nrtPointerGetAttributes(&attr, p) == NRT_SUCCESS && attr.type == nrtMemoryTypeDevice;
}

// Same-device copy with conversion: runs CPU copy_ over aliased memory after
// the current stream's queued work (synchronous).
void copyOnDevice(const at::Tensor& src, const at::Tensor& dst) {
  c10::DeviceGuard guard(dst.device());
  getCurrentStream(dst.device().index()).synchronize();
  cpuAlias(dst).copy_(cpuAlias(src));
}

void hostToDevice(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  c10::DeviceGuard guard(dst.device());
  if (sameDenseLayout(src, dst)) {
    const size_t nbytes = denseBytes(dst);
    void* host = const_cast<void*>(src.data_ptr());
    if (non_blocking && isPinnedPtr(host)) {
      auto stream = getCurrentStream(dst.device().index());
      NEURON_CHECK(nrtMemcpyAsync(dst.data_ptr(), host, nbytes, nrtMemcpyHostToDevice,
                                  stream.handle()));
      getHostAllocator()->record_event(host, src.storage().data_ptr().get_context(), stream);
    } else if (non_blocking && !isDevicePtr(host)) {
      // Pageable memory: stage it in pinned memory now, then copy in stream
      // order without waiting for the device (what CUDA does for
      // cudaMemcpyAsync from pageable memory). The caller may reuse src at once.
      auto stream = getCurrentStream(dst.device().index());
      at::DataPtr staging = getHostAllocator()->allocate(nbytes);
      std::memcpy(staging.get(), host, nbytes);
      NEURON_CHECK(nrtMemcpyAsync(dst.data_ptr(), staging.get(), nbytes, nrtMemcpyHostToDevice,
                                  stream.handle()));
      getHostAllocator()->record_event(staging.get(), staging.get_context(), stream);
    } else {
      // Default: a CPU tensor of the generic path may hold device memory.
      NEURON_CHECK(nrtMemcpy(dst.data_ptr(), host, nbytes, nrtMemcpyDefault));
    }
    return;
  }
  if (dst.is_non_overlapping_and_dense() && !dst.is_conj() && !dst.is_neg()) {
    // Convert on the host into dst's layout, then one flat copy.
    at::Tensor staging = at::empty_strided(dst.sizes(), dst.strides(),
                                           src.options().dtype(dst.scalar_type()));
    staging.copy_(src);
    NEURON_CHECK(nrtMemcpy(dst.data_ptr(), staging.data_ptr(), denseBytes(dst),
                           nrtMemcpyHostToDevice));
    return;
  }
  // dst is strided (or carries conj/neg bits): bring src over densely, then
  // copy on the device.
  at::Tensor staging = src.to(dst.scalar_type()).contiguous();
  if (staging.is_conj()) staging = staging.resolve_conj();
  if (staging.is_neg()) staging = staging.resolve_neg();
  at::Tensor tmp = copyToDevice(staging, dst.device().index());
  copyOnDevice(tmp, dst);
}

void deviceToHost(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  c10::DeviceGuard guard(src.device());
  if (sameDenseLayout(src, dst)) {
    const size_t nbytes = denseBytes(dst);
    void* host = dst.data_ptr();
    if (non_blocking && isPinnedPtr(host)) {
      auto stream = getCurrentStream(src.device().index());
      NEURON_CHECK(nrtMemcpyAsync(host, src.data_ptr(), nbytes, nrtMemcpyDeviceToHost,
                                  stream.handle()));
      getHostAllocator()->record_event(host, dst.storage().data_ptr().get_context(), stream);
    } else {
      NEURON_CHECK(nrtMemcpy(host, src.data_ptr(), nbytes, nrtMemcpyDeviceToHost));
    }
    return;
  }
  at::Tensor dense_src = src;
  if (!src.is_non_overlapping_and_dense()) {
    dense_src = emptyDeviceLike(src, src.device().index(), src.scalar_type());
    copyOnDevice(src, dense_src);
  }
  at::Tensor staging = at::empty_strided(dense_src.sizes(), dense_src.strides(),
                                         dst.options().dtype(dense_src.scalar_type()));
  NEURON_CHECK(nrtMemcpy(staging.data_ptr(), dense_src.data_ptr(), denseBytes(dense_src),
                         nrtMemcpyDeviceToHost));
  staging._set_conj(dense_src.is_conj());
  staging._set_neg(dense_src.is_neg());
  dst.copy_(staging);
}

void deviceToDevice(const at::Tensor& src, const at::Tensor& dst) {
  const bool same_device = src.device() == dst.device();
  if (sameDenseLayout(src, dst)) {
    if (same_device) {
      c10::DeviceGuard guard(dst.device());
      auto stream = getCurrentStream(dst.device().index());
      NEURON_CHECK(nrtMemcpyAsync(dst.data_ptr(), src.data_ptr(), denseBytes(dst),
                                  nrtMemcpyDeviceToDevice, stream.handle()));
    } else {
      NEURON_CHECK(nrtMemcpy(dst.data_ptr(), src.data_ptr(), denseBytes(dst),
                             nrtMemcpyDeviceToDevice));
    }
    return;
  }
  if (same_device) {
    copyOnDevice(src, dst);
    return;
  }
  // Across devices: convert on the source device into dst's dense layout,
  // move the bytes, then lay them out on the destination device.
  at::Tensor converted = emptyDeviceLike(dst, src.device().index(), dst.scalar_type());
  copyOnDevice(src, converted);
  at::Tensor moved = emptyDeviceLike(converted, dst.device().index(), dst.scalar_type());
  NEURON_CHECK(nrtMemcpy(moved.data_ptr(), converted.data_ptr(), denseBytes(converted),
                         nrtMemcpyDeviceToDevice));
  if (sameDenseLayout(moved, dst)) {
    // (dst dense but differed only in dtype: already converted)
    NEURON_CHECK(nrtMemcpy(dst.data_ptr(), moved.data_ptr(), denseBytes(dst),
                           nrtMemcpyDeviceToDevice));
  } else {
    copyOnDevice(moved, dst);
  }
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  NEURON_RECORD_OP("aten::_copy_from", Native);
  TORCH_CHECK(self.defined() && dst.defined(), "_copy_from: undefined tensor");
  if (dst.numel() == 0) return dst;
  const at::Tensor src = self.sizes() == dst.sizes() ? self : self.expand(dst.sizes());
  const bool src_dev = isNeuron(src), dst_dev = isNeuron(dst);
  if (src_dev && dst_dev) {
    deviceToDevice(src, dst);
  } else if (dst_dev) {
    TORCH_CHECK(src.device().is_cpu(), "Copy to neuron from ", src.device(),
                " is not supported; copy through the CPU first");
    hostToDevice(src, dst, non_blocking);
  } else {
    TORCH_CHECK(dst.device().is_cpu(), "Copy from neuron to ", dst.device(),
                " is not supported; copy through the CPU first");
    deviceToHost(src, dst, non_blocking);
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  NEURON_RECORD_OP("aten::_copy_from_and_resize", Native);
  if (dst.sizes() != self.sizes()) {
    dst.resize_(self.sizes());
  }
  return copy_from(self, dst, /*non_blocking=*/false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  NEURON_RECORD_OP("aten::_local_scalar_dense", Native);
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  c10::DeviceGuard guard(self.device());
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  NEURON_CHECK(nrtMemcpy(host.data_ptr(), self.data_ptr(), self.element_size(),
                         nrtMemcpyDeviceToHost));
  host._set_conj(self.is_conj());
  host._set_neg(self.is_neg());
  return at::_local_scalar_dense(host.resolve_conj().resolve_neg());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
}

// The conj/neg math fallbacks would materialise a conj/neg source with
// clone(), whose copy_ comes back to _copy_from: infinite recursion. Our
// copies handle the bits themselves (the CPU copy_ over aliases resolves them).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace torchneuron
