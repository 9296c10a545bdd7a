// DeterministicFill.cpp — see DeterministicFill.h.
#include "aten/DeterministicFill.h"

#include "aten/Common.h"
#include "aten/Launch.h"

#include <ATen/Context.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/DeviceGuard.h>

namespace torchneuron {
namespace {

// Queues ATen's own fill (fill_empty_deterministic_, the helper CPU's
// empty uses) over the strided device memory at `data`.
void queueFill(c10::DeviceIndex device, void* data, c10::IntArrayRef sizes,
               c10::IntArrayRef strides, at::ScalarType dtype) {
  WorkDesc work;
  work.name = "aten::empty (deterministic fill)";
  work.kind = nrtWorkMemset;
  const nrtBufferRange span = bufferSpan(data, sizes, strides, c10::elementSize(dtype));
  work.bytes = span.bytes;
  work.writes.push_back(span);
  launchWork(getCurrentStream(device), work,
             [data, sizes = c10::SmallVector<int64_t, 5>(sizes.begin(), sizes.end()),
              strides = c10::SmallVector<int64_t, 5>(strides.begin(), strides.end()), dtype]() {
               at::AutoDispatchBelowADInplaceOrView below;
               at::Tensor t = at::from_blob(data, sizes, strides, at::TensorOptions().dtype(dtype));
               at::native::fill_empty_deterministic_(t);
             });
}

}  // namespace

bool deterministicFillEnabled() {
  const auto& ctx = at::globalContext();
  return ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory();
}

void fillUninitializedIfDeterministic(const at::Tensor& t) {
  if (C10_LIKELY(!deterministicFillEnabled()) || t.numel() == 0) return;
  c10::DeviceGuard guard(t.device());
  queueFill(t.device().index(), t.mutable_data_ptr(), t.sizes(), t.strides(), t.scalar_type());
}

void fillResizedIfDeterministic(const at::Tensor& t, size_t oldBytes) {
  if (C10_LIKELY(!deterministicFillEnabled())) return;
  const c10::Storage& storage = t.unsafeGetTensorImpl()->unsafe_storage();
  const int64_t item = static_cast<int64_t>(t.itemsize());
  const int64_t oldNumel = static_cast<int64_t>(oldBytes) / item;
  const int64_t newNumel = static_cast<int64_t>(storage.nbytes()) / item;
  if (newNumel <= oldNumel) return;
  c10::DeviceGuard guard(t.device());
  char* base = static_cast<char*>(storage.mutable_data());
  const int64_t count = newNumel - oldNumel;
  queueFill(t.device().index(), base + oldNumel * item, {count}, {1}, t.scalar_type());
}

}  // namespace torchneuron
