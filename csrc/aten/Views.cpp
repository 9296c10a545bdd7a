// Views and metadata ops: as_strided, view, _reshape_alias, resize_, set_.
#include "aten/Common.h"
#include "aten/DeterministicFill.h"

#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  NEURON_RECORD_OP("aten::as_strided", Native);
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  NEURON_RECORD_OP("aten::view", Native);
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  NEURON_RECORD_OP("aten::_reshape_alias", Native);
  return at::native::_reshape_alias(self, size, stride);
}

// Makes the storage of `self` large enough for its sizes/strides/offset.
void ensureStorageFits(const at::Tensor& self) {
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->numel() == 0) return;
  const size_t needed = at::detail::computeStorageNbytes(
      impl->sizes(), impl->strides(), impl->dtype().itemsize(), impl->storage_offset());
  const c10::Storage& storage = impl->unsafe_storage();
  if (needed > storage.nbytes()) {
    // CPU's words (resize_bytes_cpu): a storage that is not resizable — one
    // loaded from a checkpoint, say — never grows to fit a view, so a view
    // longer than its storage (a crafted checkpoint) is refused, not given
    // memory it does not own.
    TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
    resizeStorageBytes(storage, needed);
  }
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  NEURON_RECORD_OP("aten::resize_", Native);
  c10::OptionalDeviceGuard guard(self.device());
  auto* impl = self.unsafeGetTensorImpl();
  const size_t oldBytes = impl->unsafe_storage() ? impl->unsafe_storage().nbytes() : 0;
  at::native::resize_impl_cpu_(impl, size, /*stride=*/std::nullopt, /*resize_storage=*/false);
  if (memory_format.has_value()) {
    const auto fmt = *memory_format;
    TORCH_CHECK(fmt != at::MemoryFormat::Preserve,
                "Unsupported memory format for resize_: ", fmt);
    impl->empty_tensor_restride(fmt);
  }
  ensureStorageFits(self);
  fillResizedIfDeterministic(self, oldBytes);  // as CPU's resize_
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  NEURON_RECORD_OP("aten::set_.source_Storage_storage_offset", Native);
  TORCH_CHECK(source.device_type() == kNeuron || source.nbytes() == 0 || !source.data(),
              "set_: expected a neuron storage, got a storage on ", source.device());
  at::native::checkSetStorage(self, source, storage_offset, size, stride);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_offset(storage_offset);
  at::OptionalIntArrayRef stride_opt =
      stride.data() != nullptr ? at::OptionalIntArrayRef(stride) : std::nullopt;
  at::native::resize_impl_cpu_(impl, size, stride_opt, /*resize_storage=*/false);
  ensureStorageFits(self);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  NEURON_RECORD_OP("aten::set_.source_Storage", Native);
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  NEURON_RECORD_OP("aten::set_.source_Tensor", Native);
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(),
                     source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  NEURON_RECORD_OP("aten::set_", Native);
  c10::OptionalDeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, getDeviceAllocator(),
                       /*resizable=*/true);
  return set_storage(self, std::move(storage), 0, {0}, {});
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("set_", TORCH_FN(set_empty));
}

}  // namespace torchneuron
