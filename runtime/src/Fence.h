// Fence.h — an asymmetric store-load fence for hand-offs where one side
// runs once per launch and the other rarely.
//
// A launch publishes its task and then reads whether the stream has an
// owner; a worker letting the stream go publishes that it has none and then
// reads the inbox (Executor::enqueue / releaseLocked). Each side must see
// the other's store, which takes a store-load fence on both: on x86 a
// locked instruction that waits until every store before it has reached the
// cache. On the launch side that wait was the task's own cache lines coming
// back from the worker that read them last: 6-7% of the host thread's time
// in a loop of small adds on a 2-core EPYC. With membarrier(2) the rare side
// makes every thread of the process pass a full fence for it, and the
// frequent side needs only to keep the compiler from reordering.
#pragma once

#include <atomic>

namespace nrt {

// Whether the process-wide fence is available (decided once, at the first
// call: the executor makes it before any stream exists, so both sides of
// every hand-off agree on which fences they use).
bool asymmetricFenceAvailable();

// The frequent side: a compiler barrier where the rare side can make the
// process-wide fence, else a full fence.
inline void lightFence() {
  static const bool asymmetric = asymmetricFenceAvailable();
  if (asymmetric) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

// The rare side: every running thread of the process passes a full fence
// (membarrier's private expedited command), or a full fence of our own.
void heavyFence();

}  // namespace nrt
