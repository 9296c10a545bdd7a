#include "aten/AllocationRedirect.h"

#include "core/DeviceAllocator.h"
#include "core/Runtime.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstring>

namespace torchneuron {
namespace {

thread_local c10::DeviceIndex t_redirect_device = -1;

c10::Allocator* g_base = nullptr;

void redirectRawDelete(void* ptr) {
  if (ptr == nullptr) return;
  nrtPointerAttributes attr{};
  if (nrtPointerGetAttributes(&attr, ptr) == NRT_SUCCESS && attr.type == nrtMemoryTypeDevice) {
    getDeviceAllocator()->raw_deleter()(ptr);
    return;
  }
  g_base->raw_deleter()(ptr);
}

class RedirectingCPUAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const c10::DeviceIndex device = t_redirect_device;
    if (device < 0 || n == 0) {
      return g_base->allocate(n);
    }
    // The current device is `device` (the generic path holds a DeviceGuard).
    c10::DataPtr dp = getDeviceAllocator()->allocate(n);
    dp.unsafe_set_device(c10::Device(c10::DeviceType::CPU));
    return dp;
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return g_base->raw_deleter() != nullptr ? &redirectRawDelete : nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

RedirectingCPUAllocator g_redirecting;

struct Install {
  Install() {
    g_base = c10::GetCPUAllocator();
    c10::SetCPUAllocator(&g_redirecting, /*priority=*/0);
  }
};
Install g_install;

}  // namespace

AllocationRedirectGuard::AllocationRedirectGuard(c10::DeviceIndex device)
    : previous_(t_redirect_device) {
  t_redirect_device = device;
}

AllocationRedirectGuard::~AllocationRedirectGuard() { t_redirect_device = previous_; }

bool allocationRedirectInstalled() { return c10::GetCPUAllocator() == &g_redirecting; }

bool isDeviceDataPtr(const c10::DataPtr& ptr) {
  return ptr.get() != nullptr && ptr.get_deleter() == getDeviceAllocator()->raw_deleter();
}

}  // namespace torchneuron
