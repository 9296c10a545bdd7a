// Runtime.h — the process-wide software chip: its devices (an arena and an
// executor each), the pinned host allocations, and the handle tables.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "Arena.h"
#include "Config.h"
#include "Event.h"
#include "Executor.h"
#include "HandleTable.h"
#include "Stream.h"

namespace nrt {

struct Device {
  int index = 0;
  int physicalCore = 0;
  std::unique_ptr<Arena> arena;
  std::unique_ptr<Executor> executor;
  nrtStream_t defaultStream = 0;
};

class Runtime {
 public:
  // The runtime with its devices started (arenas reserved, executor threads
  // running), started on first use. Returns the configuration's status
  // (INVALID_CONFIG, or INTERNAL if the host refused a reservation/thread),
  // or FORKED in a child forked after the parent started the devices: the
  // child has a copy of the parent's memory but none of its worker threads,
  // so queued work would never run and waits would never return.
  static nrtStatus get(Runtime** out);

  // The runtime with only its configuration read: enough for the device
  // count, properties and the current device. Starts no thread, so a process
  // that only asked these questions can still fork children that use the
  // devices (as CUDA's device count does not initialise the driver).
  static nrtStatus getConfigured(Runtime** out);

  const Config& config() const { return config_; }
  int deviceCount() const { return static_cast<int>(config_.visibleCores.size()); }

  // Arena capacity every device gets (the configured size, aligned).
  size_t deviceCapacity() const;

  // The device, or nullptr after reporting INVALID_DEVICE via *st.
  Device* device(int index, nrtStatus* st);

  // The device whose arena contains p, or nullptr.
  Device* deviceOf(const void* p);

  Stream* stream(nrtStream_t h) const { return streams_.lookup(h); }
  Event* event(nrtEvent_t h) const { return events_.lookup(h); }
  HandleTable<Stream>& streams() { return streams_; }
  HandleTable<Event>& events() { return events_; }

  // Pinned host allocations.
  nrtStatus hostAlloc(void** ptr, size_t size);
  nrtStatus hostFree(void* ptr);
  bool findHost(const void* p, void** base, size_t* size);

  // Clamps any priority into the supported range.
  static int clampPriority(int priority);

 private:
  Runtime() = default;
  nrtStatus start();
  static Runtime* instance();
  static void onForkChild();
  static void onExit();

  Config config_;
  std::once_flag startOnce_;
  std::atomic<bool> started_{false};
  std::atomic<bool> forked_{false};
  nrtStatus startStatus_ = NRT_SUCCESS;
  std::string startError_;
  std::vector<Device> devices_;
  HandleTable<Stream> streams_;
  HandleTable<Event> events_;
  std::mutex hostMu_;
  std::map<uintptr_t, size_t> host_;
};

// Looks up the runtime; returns early from the calling API function on error.
#define NRT_RUNTIME(rt)                      \
  ::nrt::Runtime* rt = nullptr;              \
  do {                                       \
    nrtStatus st_ = ::nrt::Runtime::get(&rt); \
    if (st_ != NRT_SUCCESS) return st_;      \
  } while (0)

// As NRT_RUNTIME for calls that need only the configuration.
#define NRT_RUNTIME_CONFIGURED(rt)                      \
  ::nrt::Runtime* rt = nullptr;                         \
  do {                                                  \
    nrtStatus st_ = ::nrt::Runtime::getConfigured(&rt); \
    if (st_ != NRT_SUCCESS) return st_;                 \
  } while (0)

}  // namespace nrt
