#include "aten/AllocationRedirect.h"

#include "core/DeviceAllocator.h"
#include "core/Runtime.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_set>

namespace torchneuron {
namespace {

thread_local c10::DeviceIndex t_redirect_device = -1;
thread_local ResultPlacement* t_placement = nullptr;

// Memory a ResultPlacement served that a storage still refers to: its
// deleter (which frees nothing) takes it out. Storages may die on any thread.
// An address is served only while absent, so each entry has one owner and a
// raw_deallocate of served memory always finds its entry (never reaching the
// device allocator's free).
struct Placed {
  std::mutex mu;
  std::unordered_set<void*> live;
  std::atomic<size_t> count{0};  // live.size(), read without the lock
};
Placed& placed() {
  static auto* p = new Placed();  // storages may die during exit
  return *p;
}

// Whether `ptr` was served by a ResultPlacement and is now released.
bool releasePlacement(void* ptr) {
  Placed& p = placed();
  if (p.count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lk(p.mu);
  if (p.live.erase(ptr) == 0) return false;
  p.count.store(p.live.size(), std::memory_order_release);
  return true;
}

void placedDeleter(void* ptr) { releasePlacement(ptr); }

// `memory` as a CPU allocation, unless a storage from an earlier serve still
// refers to it (a kernel kept one, which was reported): nothing is placed
// where a stale tensor reads or writes. Context == data, as raw_allocate
// requires.
std::optional<c10::DataPtr> servePlacement(void* memory) {
  Placed& p = placed();
  {
    std::lock_guard<std::mutex> lk(p.mu);
    if (!p.live.insert(memory).second) return std::nullopt;
    p.count.store(p.live.size(), std::memory_order_release);
  }
  return c10::DataPtr(memory, memory, &placedDeleter, c10::Device(c10::DeviceType::CPU));
}

c10::Allocator* g_base = nullptr;

void redirectRawDelete(void* ptr) {
  if (ptr == nullptr || releasePlacement(ptr)) return;
  nrtPointerAttributes attr{};
  if (nrtPointerGetAttributes(&attr, ptr) == NRT_SUCCESS && attr.type == nrtMemoryTypeDevice) {
    getDeviceAllocator()->raw_deleter()(ptr);
    return;
  }
  g_base->raw_deleter()(ptr);
}

// Memory of the redirect device while a guard is alive, else host memory.
c10::DataPtr allocateElsewhere(size_t n) {
  const c10::DeviceIndex device = t_redirect_device;
  if (device < 0 || n == 0) return g_base->allocate(n);
  // The current device is `device` (the generic path holds a DeviceGuard).
  c10::DataPtr dp = getDeviceAllocator()->allocate(n);
  dp.unsafe_set_device(c10::Device(c10::DeviceType::CPU));
  return dp;
}

class RedirectingCPUAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    ResultPlacement* placement = n != 0 ? t_placement : nullptr;
    if (placement != nullptr) {
      if (auto served = placement->serve(n)) return std::move(*served);
    }
    c10::DataPtr dp = allocateElsewhere(n);
    if (placement != nullptr) placement->noteUnserved(n, dp.get());
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

ResultPlacement::ResultPlacement(c10::ArrayRef<Target> targets)
    : targets_(targets.begin(), targets.end()), state_(targets.size(), kOpen),
      previous_(t_placement) {
  t_placement = this;
}

void ResultPlacement::stop() {
  if (t_placement != this) return;
  t_placement = previous_;
}

std::optional<c10::DataPtr> ResultPlacement::serve(size_t bytes) {
  pending_.reset();
  Count* count = nullptr;
  for (Count& c : counts_)
    if (c.bytes == bytes) count = &c;
  if (count == nullptr) {
    bool sized = false;
    for (const Target& t : targets_) sized = sized || t.bytes == bytes;
    if (!sized) return std::nullopt;
    counts_.push_back({bytes, 0});
    count = &counts_.back();
  }
  const uint32_t ordinal = count->count++;
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (state_[i] != kOpen || targets_[i].bytes != bytes || targets_[i].ordinal != ordinal)
      continue;
    std::optional<c10::DataPtr> served = servePlacement(targets_[i].memory);
    state_[i] = served ? kServed : kRefused;
    if (served) return served;
    break;
  }
  pending_ = Unserved{bytes, ordinal, nullptr};
  return std::nullopt;
}

void ResultPlacement::noteUnserved(size_t bytes, const void* data) {
  if (!pending_ || pending_->bytes != bytes) return;
  if (unserved_.size() < kRemembered) unserved_.push_back({bytes, pending_->ordinal, data});
  pending_.reset();
}

int64_t ResultPlacement::ordinalOf(size_t bytes, const void* data) const {
  for (const Unserved& u : unserved_)
    if (u.bytes == bytes && u.data == data) return u.ordinal;
  return -1;
}

bool ResultPlacement::anyStillReferenced() const {
  Placed& p = placed();
  if (p.count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lk(p.mu);
  for (size_t i = 0; i < targets_.size(); ++i)
    if (state_[i] == kServed && p.live.count(targets_[i].memory) != 0) return true;
  return false;
}

bool allocationRedirectInstalled() { return c10::GetCPUAllocator() == &g_redirecting; }

bool isDeviceDataPtr(const c10::DataPtr& ptr) {
  return ptr.get() != nullptr && ptr.get_deleter() == getDeviceAllocator()->raw_deleter();
}

}  // namespace torchneuron
