// Runtime.cpp — bringing up the software chip from its configuration.
#include "Runtime.h"

#include <cstdlib>

namespace nrt {

nrtStatus Runtime::get(Runtime** out) {
  // Created once and never destroyed: worker threads and other libraries'
  // static destructors may still use it while the process exits.
  static Runtime* rt = [] {
    auto* r = new Runtime();
    r->init();
    return r;
  }();
  *out = rt;
  if (rt->config_.status != NRT_SUCCESS) return fail(rt->config_.status, rt->config_.error);
  return NRT_SUCCESS;
}

nrtStatus Runtime::init() {
  config_ = readConfig();
  if (config_.status != NRT_SUCCESS) return config_.status;
  devices_.resize(config_.visibleCores.size());
  for (size_t i = 0; i < devices_.size(); ++i) {
    Device& d = devices_[i];
    d.index = static_cast<int>(i);
    d.physicalCore = config_.visibleCores[i];
    d.arena = std::make_unique<Arena>(config_.memoryPerCore);
    d.executor = std::make_unique<Executor>(d.index, config_.executorThreads);
    if (!d.arena->ok() || !d.executor->start()) {
      config_.status = NRT_ERROR_INTERNAL;
      config_.error = "the host refused the memory reservation or threads for device " +
                      std::to_string(i) + " (NEURON_RT_MEMORY_PER_CORE, NEURON_RT_EXECUTOR_THREADS)";
      devices_.clear();
      return config_.status;
    }
    Executor* ex = d.executor.get();
    d.defaultStream = streams_.create([&](Stream& s, uint64_t h) { ex->attach(&s, h, 0); });
  }
  return NRT_SUCCESS;
}

Device* Runtime::device(int index, nrtStatus* st) {
  if (index < 0 || index >= deviceCount()) {
    *st = failf(NRT_ERROR_INVALID_DEVICE, "device %d does not exist: %d device(s) visible", index,
                deviceCount());
    return nullptr;
  }
  *st = NRT_SUCCESS;
  return &devices_[index];
}

Device* Runtime::deviceOf(const void* p) {
  for (auto& d : devices_)
    if (d.arena->contains(p)) return &d;
  return nullptr;
}

int Runtime::clampPriority(int priority) {
  if (priority > 0) return 0;
  if (priority < -(Executor::kLevels - 1)) return -(Executor::kLevels - 1);
  return priority;
}

nrtStatus Runtime::hostAlloc(void** ptr, size_t size) {
  constexpr size_t kPage = 4096;
  size_t rounded = (size + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, rounded);
  if (!p) return failf(NRT_ERROR_OUT_OF_MEMORY, "the host refused %zu bytes of pinned memory", size);
  std::lock_guard<std::mutex> lk(hostMu_);
  host_.emplace(reinterpret_cast<uintptr_t>(p), size);
  *ptr = p;
  return NRT_SUCCESS;
}

nrtStatus Runtime::hostFree(void* ptr) {
  {
    std::lock_guard<std::mutex> lk(hostMu_);
    auto it = host_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == host_.end())
      return failf(NRT_ERROR_INVALID_POINTER,
                   "%p is not a live nrtHostAlloc allocation (foreign, interior or already freed)",
                   ptr);
    host_.erase(it);
  }
  std::free(ptr);
  return NRT_SUCCESS;
}

bool Runtime::findHost(const void* p, void** base, size_t* size) {
  auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(hostMu_);
  auto it = host_.upper_bound(addr);
  if (it == host_.begin()) return false;
  --it;
  if (addr >= it->first + std::max<size_t>(it->second, 1)) return false;
  *base = reinterpret_cast<void*>(it->first);
  *size = it->second;
  return true;
}

}  // namespace nrt
