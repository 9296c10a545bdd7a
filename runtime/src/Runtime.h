// Runtime.h — the process-wide software chip: its devices (an arena and an
// executor each), the pinned host allocations, and the handle tables.
#pragma once

#include <map>
#include <memory>
#include <mutex>
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
  // The runtime, created on first use. Returns the configuration's status
  // (INVALID_CONFIG, or INTERNAL if the host refused a reservation/thread).
  static nrtStatus get(Runtime** out);

  const Config& config() const { return config_; }
  int deviceCount() const { return static_cast<int>(devices_.size()); }

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
  nrtStatus init();

  Config config_;
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

}  // namespace nrt
