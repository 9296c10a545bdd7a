// What a queued kernel of the asynchronous generic path (AsyncPath.cpp)
// needs to rebuild each argument on the executor: device tensors as raw
// pointers and geometry (a closure must own no device memory), rebuilt as
// CPU tensors over the same bytes.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/Storage.h>
#include <c10/util/SmallVector.h>

#include <optional>
#include <utility>
#include <vector>

namespace torchneuron {

// Tensors over one device storage become tensors over one CPU storage in
// the kernel: CPU's kernels find aliasing by comparing storages (the
// internal and partial overlap checks of index_put_, scatter_, ...), so
// separate CPU storages over the same bytes would hide an overlap from them.
struct CpuStorages {
  c10::SmallVector<std::pair<void*, c10::Storage>, 4> byBase;
  c10::Storage get(void* base, size_t nbytes) {
    for (auto& [b, st] : byBase) {
      if (b == base) {
        if (st.nbytes() < nbytes) st.set_nbytes(nbytes);
        return st;
      }
    }
    c10::Storage st(c10::Storage::use_byte_size_t(), nbytes,
                    c10::DataPtr(base, c10::Device(c10::DeviceType::CPU)), nullptr,
                    /*resizable=*/false);
    byBase.emplace_back(base, st);
    return st;
  }
};

struct TensorRef {
  void* data = nullptr;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  at::ScalarType dtype = at::kFloat;
  int64_t offset = 0;       // storage offset, in elements
  size_t storageBytes = 0;  // of the device storage

  // A read tensor's memory is taken without materializing a copy-on-write
  // storage (t + t._lazy_clone() keeps both lazy, as on CPU); a written one
  // materializes it, as CPU's kernels do.
  explicit TensorRef(const at::Tensor& t, bool written = true)
      : data(written ? t.mutable_data_ptr() : const_cast<void*>(t.const_data_ptr())),
        sizes(t.sizes().begin(), t.sizes().end()),
        strides(t.strides().begin(), t.strides().end()),
        dtype(t.scalar_type()),
        offset(t.storage_offset()),
        storageBytes(t.has_storage() ? t.storage().nbytes() : 0) {}

  at::Tensor cpu() const {
    return at::from_blob(data, sizes, strides, at::TensorOptions().dtype(dtype));
  }

  at::Tensor cpu(CpuStorages& storages) const {
    if (data == nullptr) return cpu();
    void* base = static_cast<char*>(data) - offset * static_cast<int64_t>(c10::elementSize(dtype));
    auto t = at::detail::make_tensor<c10::TensorImpl>(storages.get(base, storageBytes),
                                                      c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                      c10::scalarTypeToTypeMeta(dtype));
    t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
    return t;
  }
};

// Per-call lists with room for one element in place: most arguments are one
// tensor, most ops have one result, and every queued op builds these on the
// host (a std::vector is a malloc and a free each).
using TensorRefs = c10::SmallVector<std::optional<TensorRef>, 1>;

// One argument: a plain value, or device tensors (single, list, optional list).
struct ArgSlot {
  enum Kind : uint8_t { kValue, kTensor, kTensorList, kOptTensorList } kind = kValue;
  c10::IValue value;                     // kValue, and CPU members of lists
  TensorRefs tensors;                    // device tensors (nullopt: take value)
  c10::SmallVector<c10::IValue, 1> others;  // per list element when not a device tensor
};

// The argument as the CPU kernel takes it.
c10::IValue rebuild(const ArgSlot& slot, CpuStorages& storages);

}  // namespace torchneuron
