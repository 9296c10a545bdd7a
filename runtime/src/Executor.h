// Executor.h — the software NeuronCore's compute engine for one device: a
// few worker threads that run the device's streams.
//
// A stream with queued work sits in a ready list (one per priority level);
// a worker takes the highest-priority ready stream, runs its head task, and
// puts the stream back if more work is queued. A stream runs on at most one
// worker at a time, which keeps its order; different streams overlap. A
// stream that must wait for an event parks instead of blocking a worker, so
// cross-stream waits can never deadlock the pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "Stream.h"

namespace nrt {

struct Event;

class Executor {
 public:
  static constexpr int kLevels = 3;  // priorities 0, -1, -2
  static constexpr size_t kBatch = 32;  // tasks a worker takes before it looks at other streams

  Executor(int device, int threads, long queueDepth);
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Starts the workers; false if the host refused a thread.
  bool start();

  // Attaches a fresh stream (from the handle table) to this executor.
  void attach(Stream* s, nrtStream_t handle, int priority);
  // Waits for s to drain and detaches it; reports nothing.
  void detach(Stream* s);

  void enqueue(Stream* s, Task&& t);

  // A launching host thread waits here while s holds more than queueDepth
  // items, until half of them have run (as a CUDA launch blocks while the
  // launch queue is full): a host that never synchronizes would otherwise
  // queue without bound, each item holding host memory until it runs.
  // Looks at the stream every kThrottleEvery launches only (reading the
  // workers' count moves a cache line between the cores). Never waits on a
  // worker thread (a kernel that launches) or with NEURON_LAUNCH_BLOCKING.
  static constexpr uint64_t kThrottleEvery = 64;
  void throttle(Stream* s);
  // The completed count a launcher that saw `launched` and `completed` waits
  // for under queue depth `depth`; 0: it need not wait.
  static uint64_t throttleTarget(uint64_t launched, uint64_t completed, uint64_t depth);

  // Resumes a parked stream (called when the event it waits for completes).
  void resume(Stream* s);

  // True when everything queued on s so far has run.
  bool idle(Stream* s);

  // Blocks until everything queued on s so far has run.
  void wait(Stream* s);
  // Blocks until s has run `target` items in all.
  void waitFor(Stream* s, uint64_t target);

  // Takes s's unreported kernel failure, if any, and reports it once.
  nrtStatus takeError(Stream* s);

  // Waits for all streams; returns the first unreported failure.
  nrtStatus synchronizeAll();

  int device() const { return device_; }
  int threads() const { return threads_; }

 private:
  void workerLoop();
  Stream* popReadyLocked();
  // Puts s on its ready list; wakes a sleeping worker unless one is polling
  // (it will see s) or `wake` is false (the caller takes s itself next).
  void makeReadyLocked(Stream* s, bool wake = true);
  // The owner gives s up: idle if nothing is queued, else ready again.
  void releaseLocked(Stream* s, bool wake = true);
  // Runs batch[0..] in order until a wait parks s; how many ran. With
  // `fromInbox` (nothing of s's waits in its queue), a fusible run that
  // reaches the batch's end takes the items behind it from the inbox along.
  size_t runBatch(Stream* s, nrtStream_t handle, std::vector<Task>& batch, bool* park,
                  bool fromInbox);
  // Appends s's queued items to batch until it holds `until` items.
  static void takeFromInbox(Stream* s, std::vector<Task>& batch, size_t until);
  // Whether another stream or a detach() needs the workers' attention.
  bool othersWaiting() const;
  // The owner of s, with nothing to run, polls its inbox for a while;
  // whether a task arrived (and nothing else needs the worker).
  bool awaitLaunch(Stream* s);
  void completeOneLocked(Stream* s);
  void notifyDone();
  void countDone(Stream* s);
  // After s's count reached `done`: wakes the host threads in wait() once
  // the target they wait for is reached (not on every task: a waiter woken
  // per task takes a core from the kernels each time).
  void wakeWaiters(Stream* s, uint64_t done, bool locked);
  void resumeParked(Event* e, const std::vector<Stream*>& streams);

  const int device_;
  const int threads_;
  const uint64_t queueDepth_;
  std::mutex mu_;
  std::condition_variable workCv_;  // workers sleep here
  std::condition_variable doneCv_;  // host threads waiting for completion
  std::deque<Stream*> ready_[kLevels];
  std::atomic<size_t> readyCount_{0};  // lets idle workers spin without the lock
  std::atomic<bool> spinning_{false};  // one idle worker polls, the rest sleep
  int sleepingWorkers_ = 0;
  std::atomic<int> doneWaiters_{0};  // host threads in wait(); read by workers without the lock
  std::atomic<int> detachWaiters_{0};  // threads in detach(), woken at the end of each batch
  std::vector<Stream*> streams_;
  std::vector<std::thread> workers_;
};

// The stream whose kernel is running on this thread (0 outside kernels),
// and the message the kernel set with nrtKernelSetError.
struct KernelContext {
  nrtStream_t stream = 0;
  std::string message;
  bool messageSet = false;
};
KernelContext*& currentKernel();

// The hook a host thread runs before a full queue makes it wait
// (nrtSetLaunchThrottleHook).
void setLaunchThrottleHook(nrtLaunchThrottleFn fn);

// The hook a worker runs before it sleeps (nrtSetWorkerIdleHook). Setting
// null returns once no call of the old hook is running.
void setWorkerIdleHook(nrtWorkerIdleFn fn);
// Runs the hook, if one is set, on this thread; whether one was.
bool runWorkerIdleHook();

// Runs a kernel task on this thread; returns the failure to record, if any.
KernelErrorPtr runKernel(Task& t, nrtStream_t stream);
// Runs tasks[0] and, through its fuser, the run of items behind it (of
// `avail` in all) that name the same fuser; *ran: how many it took.
KernelErrorPtr runFusible(Task* tasks, size_t avail, nrtStream_t stream, size_t* ran);

}  // namespace nrt
