// Event.cpp — completion of event records and the streams parked on them.
#include "Event.h"

#include <chrono>

#include "Executor.h"
#include "Runtime.h"

namespace nrt {

void Event::reset(unsigned newFlags, uint32_t slotIndex) {
  std::lock_guard<std::mutex> lk(mu);
  flags = newFlags;
  firstGeneration = recorded;
  outstanding.clear();  // markers of the past life are ignored (gen <= firstGeneration)
  recordedOn = 0;
  timestampNs = 0;
  error.reset();
  parkedStreams.clear();  // empty: the previous life ended with no references
  slot = slotIndex;
  refs.store(1, std::memory_order_relaxed);  // the handle's
}

void Event::unref() {
  if (refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  Runtime* rt = nullptr;
  if (Runtime::get(&rt) == NRT_SUCCESS) rt->events().release(slot);
}

std::vector<Stream*> Event::complete(uint64_t gen, KernelErrorPtr errorBefore) {
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count();
  std::vector<Stream*> wake;
  std::lock_guard<std::mutex> lk(mu);
  if (gen <= firstGeneration) return wake;  // a marker of a past life
  for (size_t i = 0; i < outstanding.size(); ++i)
    if (outstanding[i] == gen) {
      outstanding[i] = outstanding.back();
      outstanding.pop_back();
      break;
    }
  // The event's state (query, synchronize, timing) is its latest record's:
  // an older record that completes late changes only its own waits.
  if (gen > completed.load(std::memory_order_relaxed)) {
    completed.store(gen, std::memory_order_release);
    timestampNs = now;
    error = std::move(errorBefore);
  }
  for (size_t i = 0; i < parkedStreams.size();) {
    if (doneLocked(parkedStreams[i].second)) {
      wake.push_back(parkedStreams[i].first);
      parkedStreams[i] = parkedStreams.back();
      parkedStreams.pop_back();
    } else {
      ++i;
    }
  }
  if (syncWaiters) cv.notify_all();
  return wake;
}

bool Event::doneLocked(uint64_t gen) const {
  if (gen <= firstGeneration) return true;
  for (uint64_t g : outstanding)
    if (g == gen) return false;
  return true;
}

bool Event::parkUntil(uint64_t gen, Stream* s) {
  std::lock_guard<std::mutex> lk(mu);
  if (doneLocked(gen)) return false;
  parkedStreams.emplace_back(s, gen);
  return true;
}

}  // namespace nrt
