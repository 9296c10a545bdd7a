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
#include "aten/DirectOp.h"

#include "aten/Launch.h"
#include "core/HostAllocator.h"
#include "core/HostWait.h"

#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <ATen/core/LegacyTypeDispatch.h>
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

// A tensor's memory and layout, captured for a queued kernel (which must not
// own device memory: the caching allocator's stream order keeps it alive).
struct StridedRef {
  void* data;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  at::ScalarType dtype;
  bool conj, neg;

  // A source is read without materializing a copy-on-write storage.
  explicit StridedRef(const at::Tensor& t, bool written)
      : data(written ? t.mutable_data_ptr() : const_cast<void*>(t.const_data_ptr())),
        sizes(t.sizes().begin(), t.sizes().end()),
        strides(t.strides().begin(), t.strides().end()),
        dtype(t.scalar_type()),
        conj(t.is_conj()),
        neg(t.is_neg()) {}

  at::Tensor cpu() const {
    at::Tensor t = at::from_blob(data, sizes, strides, at::TensorOptions().dtype(dtype));
    t._set_conj(conj);
    t._set_neg(neg);
    return t;
  }
};

// Same-device copy with conversion (dtype, layout, conj/neg bits): CPU's
// copy_ over the two tensors' device memory, queued on dst's current stream
// as a copy work item. No host wait.
void copyOnDevice(const at::Tensor& src, const at::Tensor& dst) {
  c10::DeviceGuard guard(dst.device());
  WorkDesc work;
  work.name = "aten::copy_ (Device -> Device, strided/converting)";
  work.kind = nrtWorkCopy;
  work.bytes = static_cast<uint64_t>(src.numel()) * src.element_size() +
               static_cast<uint64_t>(dst.numel()) * dst.element_size();
  work.reads.push_back(spanOf(src));
  work.writes.push_back(spanOf(dst));
  launchWork(getCurrentStream(dst.device().index()), work,
             [s = StridedRef(src, false), d = StridedRef(dst, true)]() {
               at::AutoDispatchBelowADInplaceOrView below;
               d.cpu().copy_(s.cpu());
             });
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
      noteHostWait(WaitCause::CopyFromHost, "aten::copy_ (Host -> Device, blocking)");
      NEURON_CHECK(nrtMemcpy(dst.data_ptr(), host, nbytes, nrtMemcpyDefault));
    }
    return;
  }
  if (dst.is_non_overlapping_and_dense() && !dst.is_conj() && !dst.is_neg()) {
    // Convert on the host into dst's layout, then one flat copy.
    at::Tensor staging = at::empty_strided(dst.sizes(), dst.strides(),
                                           src.options().dtype(dst.scalar_type()));
    staging.copy_(src);
    if (non_blocking) {
      // Converted into pinned memory, then queued (as CUDA does from pageable memory).
      auto stream = getCurrentStream(dst.device().index());
      at::DataPtr pinned = getHostAllocator()->allocate(denseBytes(dst));
      std::memcpy(pinned.get(), staging.data_ptr(), denseBytes(dst));
      NEURON_CHECK(nrtMemcpyAsync(dst.data_ptr(), pinned.get(), denseBytes(dst),
                                  nrtMemcpyHostToDevice, stream.handle()));
      getHostAllocator()->record_event(pinned.get(), pinned.get_context(), stream);
      return;
    }
    noteHostWait(WaitCause::CopyFromHost, "aten::copy_ (Host -> Device, blocking)");
    NEURON_CHECK(nrtMemcpy(dst.data_ptr(), staging.data_ptr(), denseBytes(dst),
                           nrtMemcpyHostToDevice));
    return;
  }
  // dst is strided (or carries conj/neg bits): bring src over densely, then
  // copy on the device.
  at::Tensor staging = src.to(dst.scalar_type()).contiguous();
  if (staging.is_conj()) staging = staging.resolve_conj();
  if (staging.is_neg()) staging = staging.resolve_neg();
  at::Tensor tmp = emptyDeviceLike(staging, dst.device().index(), staging.scalar_type());
  hostToDevice(staging, tmp, non_blocking);
  copyOnDevice(tmp, dst);
}

void deviceToHost(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  c10::DeviceGuard guard(src.device());
  if (sameDenseLayout(src, dst)) {
    const size_t nbytes = denseBytes(dst);
    void* host = dst.data_ptr();
    if (non_blocking && isPinnedPtr(host)) {
      auto stream = getCurrentStream(src.device().index());
      NEURON_CHECK(nrtMemcpyAsync(host, src.const_data_ptr(), nbytes, nrtMemcpyDeviceToHost,
                                  stream.handle()));
      getHostAllocator()->record_event(host, dst.storage().data_ptr().get_context(), stream);
    } else {
      noteHostWait(WaitCause::CopyToHost, "aten::copy_ (Device -> Host)");
      NEURON_CHECK(nrtMemcpy(host, src.const_data_ptr(), nbytes, nrtMemcpyDeviceToHost));
      flushKernelWarnings();  // of the work this copy waited for
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
  noteHostWait(WaitCause::CopyToHost, "aten::copy_ (Device -> Host)");
  NEURON_CHECK(nrtMemcpy(staging.data_ptr(), dense_src.const_data_ptr(), denseBytes(dense_src),
                         nrtMemcpyDeviceToHost));
  flushKernelWarnings();
  staging._set_conj(dense_src.is_conj());
  staging._set_neg(dense_src.is_neg());
  dst.copy_(staging);
}

// Makes `waiter` wait (on the device) for the work queued on `before` so far.
void streamWaits(const NeuronStream& waiter, const NeuronStream& before) {
  nrtEvent_t ev = 0;
  NEURON_CHECK(nrtEventCreate(&ev, NRT_EVENT_DISABLE_TIMING));
  nrtStatus st = nrtEventRecord(ev, before.handle());
  if (st == NRT_SUCCESS) st = nrtStreamWaitEvent(waiter.handle(), ev);
  // A destroyed event still releases the streams that wait for it.
  NEURON_WARN_IF_ERROR(nrtEventDestroy(ev));
  NEURON_CHECK(st);
}

// Across devices, in stream order as CUDA does it: the copy runs on dst's
// current stream after the work already queued on src's current stream, and
// src's stream waits for the copy, so neither side's memory is reused before
// the copy has read or written it. The host does not wait.
void peerCopy(const at::Tensor& src, const at::Tensor& dst) {
  const auto srcStream = getCurrentStream(src.device().index());
  const auto dstStream = getCurrentStream(dst.device().index());
  streamWaits(dstStream, srcStream);
  NEURON_CHECK(nrtMemcpyAsync(dst.data_ptr(), src.const_data_ptr(), denseBytes(dst),
                              nrtMemcpyDeviceToDevice, dstStream.handle()));
  streamWaits(srcStream, dstStream);
}

void deviceToDevice(const at::Tensor& src, const at::Tensor& dst) {
  const bool same_device = src.device() == dst.device();
  if (same_device) {
    c10::DeviceGuard guard(dst.device());
    if (sameDenseLayout(src, dst)) {
      NEURON_CHECK(nrtMemcpyAsync(dst.data_ptr(), src.const_data_ptr(), denseBytes(dst),
                                  nrtMemcpyDeviceToDevice,
                                  getCurrentStream(dst.device().index()).handle()));
    } else {
      copyOnDevice(src, dst);
    }
    return;
  }
  if (sameDenseLayout(src, dst)) {
    peerCopy(src, dst);
    return;
  }
  // Convert on the source device into dst's dense layout, move the bytes,
  // then lay them out on the destination device. The temporaries are freed
  // in their own streams' order (the peer copy's stream waits are two-way).
  at::Tensor converted = emptyDeviceLike(dst, src.device().index(), dst.scalar_type());
  copyOnDevice(src, converted);
  at::Tensor moved = emptyDeviceLike(converted, dst.device().index(), dst.scalar_type());
  peerCopy(converted, moved);
  if (sameDenseLayout(moved, dst)) {
    c10::DeviceGuard guard(dst.device());
    NEURON_CHECK(nrtMemcpyAsync(dst.data_ptr(), moved.const_data_ptr(), denseBytes(dst),
                                nrtMemcpyDeviceToDevice,
                                getCurrentStream(dst.device().index()).handle()));
  } else {
    copyOnDevice(moved, dst);
  }
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  NEURON_RECORD_OP("aten::_copy_from", Native);
  TORCH_CHECK(self.defined() && dst.defined(), "_copy_from: undefined tensor");
  if (dst.numel() == 0) return dst;
  // CPU's copy_ refuses these in its TensorIterator (copy_impl reaches
  // _copy_from before building one for a neuron tensor): at the op, before
  // anything is queued.
  at::assert_no_internal_overlap(dst);
  at::assert_no_partial_overlap(dst, self);
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
  noteHostWait(WaitCause::ScalarRead, "aten::_local_scalar_dense");
  NEURON_CHECK(nrtMemcpy(host.data_ptr(), self.const_data_ptr(), self.element_size(),
                         nrtMemcpyDeviceToHost));
  flushKernelWarnings();
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
