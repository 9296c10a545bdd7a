// Runtime.cpp — bringing up the software chip from its configuration.
#include "Runtime.h"

#include <pthread.h>

#include <cstdint>
#include <cstdlib>

namespace nrt {

Runtime* Runtime::instance() {
  // Created once and never destroyed: worker threads and other libraries'
  // static destructors may still use it while the process exits.
  static Runtime* rt = [] {
    auto* r = new Runtime();
    r->config_ = readConfig();
    return r;
  }();
  return rt;
}

nrtStatus Runtime::getConfigured(Runtime** out) {
  Runtime* rt = instance();
  *out = rt;
  if (rt->config_.status != NRT_SUCCESS) return fail(rt->config_.status, rt->config_.error);
  return NRT_SUCCESS;
}

nrtStatus Runtime::get(Runtime** out) {
  Runtime* rt = instance();
  *out = rt;
  if (__builtin_expect(rt->started_.load(std::memory_order_acquire), 1)) {
    if (rt->forked_.load(std::memory_order_relaxed))
      return fail(NRT_ERROR_FORKED,
                  "this process is a child forked after its parent started the neuron runtime: "
                  "the devices' memory is a stale copy and their executor threads do not exist "
                  "here, so no device call can work; start the child with 'spawn' (or "
                  "'forkserver') instead of 'fork'");
    if (rt->startStatus_ != NRT_SUCCESS) return fail(rt->startStatus_, rt->startError_);
    return NRT_SUCCESS;
  }
  if (rt->config_.status != NRT_SUCCESS) return fail(rt->config_.status, rt->config_.error);
  std::call_once(rt->startOnce_, [rt] {
    rt->startStatus_ = rt->start();
    rt->started_.store(true, std::memory_order_release);
  });
  return get(out);
}

void Runtime::onForkChild() { instance()->forked_.store(true, std::memory_order_relaxed); }

void Runtime::onExit() {
  // The executor threads are detached and outlive main(): a kernel still
  // queued when the process exits would run while the static objects it
  // uses (the host libraries' allocators, dispatch tables, thread pools) are
  // being destroyed, and abort or crash the exit. Registered when the devices
  // start, this runs before the destructors of everything constructed
  // earlier; the layers above drain earlier still (the Python package does it
  // before the interpreter tears down).
  Runtime* rt = instance();
  if (rt->forked_.load() || rt->startStatus_ != NRT_SUCCESS) return;
  setWorkerIdleHook(nullptr);  // idle workers run nothing of the layers above from now
  for (auto& d : rt->devices_) (void)d.executor->synchronizeAll();
}

size_t Runtime::deviceCapacity() const {
  // Config bounds memoryPerCore far below SIZE_MAX, so this cannot wrap.
  return (config_.memoryPerCore + Arena::kAlignment - 1) / Arena::kAlignment * Arena::kAlignment;
}

nrtStatus Runtime::start() {
  // Registered before any thread exists, so no child can miss it.
  pthread_atfork(nullptr, nullptr, &Runtime::onForkChild);
  std::atexit(&Runtime::onExit);
  devices_.resize(config_.visibleCores.size());
  for (size_t i = 0; i < devices_.size(); ++i) {
    Device& d = devices_[i];
    d.index = static_cast<int>(i);
    d.physicalCore = config_.visibleCores[i];
    d.arena = std::make_unique<Arena>(config_.memoryPerCore);
    d.executor =
        std::make_unique<Executor>(d.index, config_.executorThreads, config_.queueDepth);
    if (!d.arena->ok() || !d.executor->start()) {
      startError_ = "the host refused the memory reservation or threads for device " +
                    std::to_string(i) +
                    " (NEURON_RT_MEMORY_PER_CORE, NEURON_RT_EXECUTOR_THREADS)";
      // Workers already started keep running on their executors (they are
      // never destroyed); only the device table is dropped.
      for (auto& dev : devices_) dev.executor.release();
      devices_.clear();
      return NRT_ERROR_INTERNAL;
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
  // Rounding SIZE_MAX - 4094 and above up to a page wraps to a tiny block;
  // no host can give that much anyway.
  if (size > SIZE_MAX - (kPage - 1))
    return failf(NRT_ERROR_OUT_OF_MEMORY, "the host refused %zu bytes of pinned memory", size);
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
