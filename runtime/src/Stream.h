// Stream.h — an in-order queue of work on one device. Its fields are
// guarded by the owning executor's mutex, except the inbox and the atomics.
#pragma once

#include <atomic>
#include <cstdint>

#include "Inbox.h"
#include "Status.h"
#include "TaskQueue.h"

namespace nrt {

class Executor;

struct Stream {
  enum State : uint8_t {
    kIdle,     // nothing queued
    kReady,    // queued, waiting in the executor's ready list
    kRunning,  // a worker runs its head task
    kParked    // waiting for an event; resumed by the event's completion
  };

  nrtStream_t handle = 0;
  int device = -1;
  int priority = 0;
  int level = 0;  // index into the executor's ready lists (0 = highest)
  Executor* executor = nullptr;

  Inbox inbox;      // new tasks, from host threads (Inbox.h)
  TaskQueue queue;  // tasks taken from the inbox and put back (behind a parked wait): run first
  State state = kIdle;
  bool resumeRequested = false;  // an event completed while we were running

  // What launches touch, on a cache line of its own: the worker writes
  // `completed` once per task, and a launch that shared its line would
  // wait for that line on every op.
  alignas(64) std::atomic<uint64_t> enqueued{0};  // tasks launched; counted before they enter the inbox
  // state != kIdle, readable without the lock: a launch on a scheduled
  // stream leaves it to the stream's owner to find the task.
  std::atomic<bool> scheduled{false};

  alignas(64) std::atomic<uint64_t> completed{0};  // tasks done; the running worker or resume() adds
  // The smallest `completed` a host thread in Executor::wait() waits for
  // (UINT64_MAX: none): workers wake waiters when it is reached, not per task.
  std::atomic<uint64_t> wakeAt{UINT64_MAX};
  KernelErrorPtr error;                // first unreported kernel failure
};

}  // namespace nrt
