// Caching device allocator over nrtMalloc/nrtFree (see DeviceAllocator.cpp).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

namespace torchneuron {

// The process-wide allocator registered for DeviceType::PrivateUse1.
c10::DeviceAllocator* getDeviceAllocator();

}  // namespace torchneuron
