// Factories: empty.memory_format and empty_strided over the caching allocator.
#include "aten/Common.h"
#include "aten/DeterministicFill.h"
#include "core/HostWait.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<at::MemoryFormat> memory_format) {
  NEURON_RECORD_OP("aten::empty.memory_format", Native);
  const auto dev = device.value_or(c10::Device(kNeuron));
  c10::OptionalDeviceGuard guard(dev);
  lazyInit();
  TORCH_CHECK(layout.value_or(at::kStrided) == at::kStrided,
              "neuron tensors support only the strided layout, got ", *layout);
  // CUDA's check and words: pinning is for host memory.
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  at::Tensor t = at::detail::empty_generic(size, getDeviceAllocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype), memory_format);
  fillUninitializedIfDeterministic(t);
  return t;
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool> pin_memory) {
  NEURON_RECORD_OP("aten::empty_strided", Native);
  const auto dev = device.value_or(c10::Device(kNeuron));
  c10::OptionalDeviceGuard guard(dev);
  lazyInit();
  TORCH_CHECK(layout.value_or(at::kStrided) == at::kStrided,
              "neuron tensors support only the strided layout, got ", *layout);
  // CUDA's check and words: pinning is for host memory.
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  at::Tensor t = at::detail::empty_strided_generic(
      size, stride, getDeviceAllocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::dtype_or_default(dtype));
  fillUninitializedIfDeterministic(t);
  return t;
}

}  // namespace

at::Tensor copyToDevice(const at::Tensor& cpu_in, c10::DeviceIndex device) {
  at::Tensor cpu = cpu_in.is_non_overlapping_and_dense() ? cpu_in : cpu_in.contiguous();
  c10::DeviceGuard guard(c10::Device(kNeuron, device));
  at::Tensor out = at::detail::empty_strided_generic(
      cpu.sizes(), cpu.strides(), getDeviceAllocator(),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), cpu.scalar_type());
  const size_t nbytes = static_cast<size_t>(cpu.numel()) * cpu.element_size();
  if (nbytes > 0) {
    // (Default: the source may itself be redirected device memory.)
    noteHostWait(WaitCause::CopyFromHost, "copy to device (blocking)");
    NEURON_CHECK(nrtMemcpy(out.data_ptr(), cpu.data_ptr(), nbytes, nrtMemcpyDefault));
  }
  out._set_conj(cpu.is_conj());
  out._set_neg(cpu.is_neg());
  return out;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
}

}  // namespace torchneuron
