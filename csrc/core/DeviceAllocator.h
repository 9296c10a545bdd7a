// Caching device allocator over nrtMalloc/nrtFree (see DeviceAllocator.cpp).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

namespace torchneuron {

// The process-wide allocator registered for DeviceType::PrivateUse1.
c10::DeviceAllocator* getDeviceAllocator();

// Whether frees of small blocks go to the allocator's reuse bins (on by
// default; off: every free merges into the pool at once). Blocks already
// binned stay there until the next flush. For A/B benchmarks.
void setAllocatorReuseBins(bool on);

}  // namespace torchneuron
