// Event.h — a marker in a stream's work. Each record gets a generation
// number; the event is complete when its latest record's marker has run.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "Status.h"

namespace nrt {

struct Stream;

struct Event {
  std::mutex mu;
  std::condition_variable cv;
  unsigned flags = 0;
  // Generations only grow, across reuse of this object under new handles,
  // so a stale marker of a destroyed event can never complete a new record.
  uint64_t firstGeneration = 0;  // generations <= this belong to a past life
  uint64_t recorded = 0;         // latest record's generation
  nrtStream_t recordedOn = 0;    // stream of the latest record
  std::atomic<uint64_t> completed{0};  // highest generation whose marker ran
  // Generations recorded whose markers have not run. Records on different
  // streams complete in any order; a wait is for its own record (as CUDA's
  // cudaStreamWaitEvent captures the record it saw), not the latest one.
  std::vector<uint64_t> outstanding;
  int64_t timestampNs = 0;       // when the marker of `completed` ran
  KernelErrorPtr error;          // failure queued before the completed record
  int syncWaiters = 0;
  std::vector<std::pair<Stream*, uint64_t>> parkedStreams;

  // Lifetime: one reference for the live handle and one for every queued
  // record or wait (a parked wait keeps its reference until it resumes).
  // The slot is reused only when the count reaches zero, so destroying an
  // event never strands a stream that waits on it.
  std::atomic<int> refs{0};
  uint32_t slot = 0;  // index in the runtime's event table

  // Resets for a new life under a new handle (called with the table lock).
  void reset(unsigned newFlags, uint32_t slotIndex);

  bool timing() const { return (flags & NRT_EVENT_DISABLE_TIMING) == 0; }

  void ref() { refs.fetch_add(1, std::memory_order_relaxed); }
  // Drops a reference; the last one returns the slot to the event table.
  void unref();

  // Called by the executor when the marker of generation gen runs. Returns
  // the streams to resume (the caller resumes them, outside its locks) and
  // drops the reference of each of their waits.
  std::vector<Stream*> complete(uint64_t gen, KernelErrorPtr errorBefore);

  // Whether the marker of generation gen ran (call with mu held).
  bool doneLocked(uint64_t gen) const;

  // If generation gen is done, returns false; otherwise remembers that s
  // must be resumed when it is, and returns true (the stream parks).
  bool parkUntil(uint64_t gen, Stream* s);
};

}  // namespace nrt
