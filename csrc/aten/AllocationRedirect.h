// Allocation redirect for the generic path: while a CPU kernel runs on device
// memory for a neuron op, host allocations made by that kernel on the calling
// thread (its fresh outputs and temporaries) come from the neuron caching
// allocator instead of host memory. Fresh outputs are then handed over as
// device storage without a copy.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

namespace torchneuron {

// While alive, CPU allocations on this thread are served from `device`'s
// memory (DataPtrs report device CPU until adopted).
class AllocationRedirectGuard {
 public:
  explicit AllocationRedirectGuard(c10::DeviceIndex device);
  ~AllocationRedirectGuard();
  AllocationRedirectGuard(const AllocationRedirectGuard&) = delete;
  AllocationRedirectGuard& operator=(const AllocationRedirectGuard&) = delete;

 private:
  c10::DeviceIndex previous_;
};

// True when the redirecting CPU allocator is installed (it is unless another
// library installed a CPU allocator with a higher priority).
bool allocationRedirectInstalled();

// True when `ptr` is a neuron caching-allocator block (e.g. a redirected
// allocation inside a CPU storage).
bool isDeviceDataPtr(const c10::DataPtr& ptr);

}  // namespace torchneuron
