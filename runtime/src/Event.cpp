// Event.cpp — completion of event records and the streams parked on them.
#include "Event.h"

#include <chrono>

#include "Executor.h"

namespace nrt {

void Event::reset(unsigned newFlags) {
  std::lock_guard<std::mutex> lk(mu);
  flags = newFlags;
  firstGeneration = recorded;
  recordedOn = 0;
  timestampNs = 0;
  error.reset();
  parkedStreams.clear();
}

void Event::complete(uint64_t gen, KernelErrorPtr errorBefore) {
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count();
  std::vector<Stream*> wake;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (gen <= firstGeneration || gen <= completed.load(std::memory_order_relaxed)) return;
    completed.store(gen, std::memory_order_release);
    timestampNs = now;
    error = std::move(errorBefore);
    for (size_t i = 0; i < parkedStreams.size();) {
      if (parkedStreams[i].second <= gen) {
        wake.push_back(parkedStreams[i].first);
        parkedStreams[i] = parkedStreams.back();
        parkedStreams.pop_back();
      } else {
        ++i;
      }
    }
    if (syncWaiters) cv.notify_all();
  }
  // Outside our lock: the executor's lock is never taken while holding it
  // the other way round, so this order cannot deadlock.
  for (Stream* s : wake) s->executor->resume(s);
}

bool Event::parkUntil(uint64_t gen, Stream* s) {
  std::lock_guard<std::mutex> lk(mu);
  if (completed.load(std::memory_order_relaxed) >= gen) return false;
  parkedStreams.emplace_back(s, gen);
  return true;
}

}  // namespace nrt
