// Pinned (page-locked) host memory allocator over nrtHostAlloc.
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace torchneuron {

// The caching pinned-memory allocator (also registered as the host allocator
// of DeviceType::PrivateUse1 and returned by the hooks).
at::HostAllocator* getHostAllocator();

// True when ptr lies inside memory from nrtHostAlloc.
bool isPinnedPtr(const void* ptr);

}  // namespace torchneuron
