// Executor.cpp — worker threads running a device's streams.
#include "Executor.h"

#include <pthread.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "Activity.h"
#include "CpuRelax.h"
#include "Event.h"
#include "Fence.h"

namespace nrt {
namespace {

// An idle worker (or a host thread waiting for a result) polls this long
// before sleeping: a wake-up through the OS costs tens of microseconds on a
// busy machine, which would dominate the launch of small kernels. Polling
// yields the core, so a runnable thread (the one we wait for) gets it.
constexpr auto kSpin = std::chrono::microseconds(200);

template <class Pred>
bool spinUntil(Pred pred) {
  auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (pred()) return true;
    if (i < 64) {
      cpuRelax();
      continue;
    }
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
}

// Names the calling worker "neuron<device>-exec<index>" (what ps, top,
// perf and debuggers show): otherwise every thread of the process shows
// the host program's name, and the device's threads cannot be told from the
// host's. Threads a worker starts (its OpenMP team) inherit the name.
void nameWorkerThread(int device, int index) {
#if defined(__linux__)
  char name[16];  // the kernel keeps 15 characters
  std::snprintf(name, sizeof name, "neuron%d-exec%d", device, index);
  (void)pthread_setname_np(pthread_self(), name);
#else
  (void)device;
  (void)index;
#endif
}

}  // namespace

namespace {
std::atomic<nrtLaunchThrottleFn> gThrottleHook{nullptr};
std::atomic<nrtWorkerIdleFn> gIdleHook{nullptr};
std::atomic<int> gIdleHookCalls{0};  // calls in progress
}  // namespace

void setWorkerIdleHook(nrtWorkerIdleFn fn) {
  gIdleHook.store(fn);
  if (fn) return;
  // seq_cst with runWorkerIdleHook: a call that began before the store is
  // counted here; one that begins after it loads null.
  while (gIdleHookCalls.load() != 0) std::this_thread::yield();
}

void setLaunchThrottleHook(nrtLaunchThrottleFn fn) { gThrottleHook.store(fn); }

bool runWorkerIdleHook() {
  gIdleHookCalls.fetch_add(1);
  nrtWorkerIdleFn hook = gIdleHook.load();
  if (hook) hook();
  gIdleHookCalls.fetch_sub(1);
  return hook != nullptr;
}

KernelContext*& currentKernel() {
  static thread_local KernelContext* ctx = nullptr;
  return ctx;
}

namespace {

// This thread runs kernels of `stream` while the scope lives
// (nrtKernelSetError, nrtKernelCurrentStream).
struct KernelScope {
  KernelContext ctx;
  KernelContext* outer;
  explicit KernelScope(nrtStream_t stream) : outer(currentKernel()) {
    ctx.stream = stream;
    currentKernel() = &ctx;
  }
  ~KernelScope() { currentKernel() = outer; }
};

// The failure of the item named `name`, with its own message if it set one.
KernelErrorPtr failureOf(const char* name, nrtStatus st, const KernelContext& ctx,
                         const std::string& where = "") {
  std::string msg = std::string("kernel '") + name + "' failed with " + nrtGetErrorName(st) + where;
  if (ctx.messageSet) msg += ": " + ctx.message;
  return std::make_shared<KernelError>(NRT_ERROR_KERNEL_FAILED, msg, name);
}

}  // namespace

KernelErrorPtr runKernel(Task& t, nrtStream_t stream) {
  const uint64_t start = t.record ? activity::nowNs() : 0;
  KernelScope scope(stream);
  nrtStatus st = t.fn(t.args());
  if (t.record) {
    activity::finish(t.record, start, activity::nowNs(), st);
    t.record = nullptr;
  }
  return st == NRT_SUCCESS ? nullptr : failureOf(t.nameOf(), st, scope.ctx);
}

KernelErrorPtr runFusible(Task* tasks, size_t avail, nrtStream_t stream, size_t* ran) {
  nrtFuser* fuser = tasks[0].fuser;
  size_t count = 1;
  while (count < avail && count < NRT_MAX_FUSED && tasks[count].kind == Task::kKernel &&
         tasks[count].fuser == fuser)
    ++count;
  *ran = 1;
  if (count == 1) return runKernel(tasks[0], stream);
  void* args[NRT_MAX_FUSED];
  bool timed = false;
  for (size_t k = 0; k < count; ++k) {
    args[k] = tasks[k].args();
    timed = timed || tasks[k].record != nullptr;
  }
  const uint64_t start = timed ? activity::nowNs() : 0;
  size_t done = 0, failed = 0;
  nrtStatus st;
  KernelContext ctx;
  {
    KernelScope scope(stream);
    st = fuser->run(fuser, args, count, &done, &failed);
    ctx = scope.ctx;
  }
  if (done == 0 && st == NRT_SUCCESS) return runKernel(tasks[0], stream);  // declined
  if (done == 0 || done > count || (st != NRT_SUCCESS && failed >= done)) {
    // A fuser breaking its contract: what ran is unknown; fail every item offered.
    done = count;
    failed = 0;
    st = NRT_ERROR_INTERNAL;
    ctx.message = "the fuser reported an impossible result";
    ctx.messageSet = true;
  }
  *ran = done;
  const uint64_t end = timed ? activity::nowNs() : 0;
  for (size_t k = 0; k < done; ++k) {
    nrtActivityRecord* rec = tasks[k].record;
    if (!rec) continue;
    rec->fusedWith = tasks[0].workId;
    rec->fusedCount = static_cast<uint32_t>(done);
    activity::finish(rec, start, end, st != NRT_SUCCESS && k == failed ? st : NRT_SUCCESS);
    tasks[k].record = nullptr;
  }
  if (st == NRT_SUCCESS) return nullptr;
  return failureOf(tasks[failed].nameOf(), st, ctx,
                   " (in a fused pass of " + std::to_string(done) + " items)");
}

Executor::Executor(int device, int threads, long queueDepth)
    : device_(device), threads_(threads), queueDepth_(static_cast<uint64_t>(queueDepth)) {
  // The host thread (enqueue) and the workers (pop, complete) take mu_ for
  // a few instructions several times per task: contended, a plain mutex
  // sends the loser to sleep in the kernel (a futex round trip each way). An
  // adaptive one spins briefly first (glibc's PTHREAD_MUTEX_ADAPTIVE_NP):
  // host cost of a queued op 8-16% lower here (add 2.9 -> 2.6 us, relu
  // 3.5 -> 3.2 us, bench_small_ops-style loops). Set before any thread uses it.
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init(mu_.native_handle(), &attr);
  pthread_mutexattr_destroy(&attr);
  // Which fences the stream hand-off uses is settled before any stream exists.
  (void)asymmetricFenceAvailable();
}

bool Executor::start() {
  try {
    for (int i = 0; i < threads_; ++i) {
      workers_.emplace_back([this, i] {
        nameWorkerThread(device_, i);
        workerLoop();
      });
    }
  } catch (const std::system_error&) {
    return false;
  }
  for (auto& w : workers_) w.detach();  // the runtime lives until the process ends
  return true;
}

void Executor::attach(Stream* s, nrtStream_t handle, int priority) {
  std::lock_guard<std::mutex> lk(mu_);
  s->handle = handle;
  s->device = device_;
  s->priority = priority;
  s->level = -priority;  // priority is already clamped to [-(kLevels-1), 0]
  s->executor = this;
  s->queue.clear();
  s->inbox.clear();
  s->state = Stream::kIdle;
  s->scheduled.store(false);
  s->resumeRequested = false;
  s->enqueued.store(0, std::memory_order_relaxed);
  s->completed.store(0, std::memory_order_relaxed);
  s->wakeAt.store(UINT64_MAX, std::memory_order_relaxed);
  s->error.reset();
  streams_.push_back(s);
}

void Executor::detach(Stream* s) {
  wait(s);
  std::unique_lock<std::mutex> lk(mu_);
  // The worker counts a task done before its last look at the stream; the
  // stream object is reused after this, so wait until no worker holds it.
  detachWaiters_.fetch_add(1);
  while (s->state == Stream::kRunning) doneCv_.wait_for(lk, std::chrono::milliseconds(1));
  detachWaiters_.fetch_sub(1);
  for (auto& p : streams_) {
    if (p == s) {
      p = streams_.back();
      streams_.pop_back();
      break;
    }
  }
  s->error.reset();
}

void Executor::makeReadyLocked(Stream* s, bool wake) {
  s->state = Stream::kReady;
  s->scheduled.store(true, std::memory_order_relaxed);  // a launch that misses it takes our lock
  ready_[s->level].push_back(s);
  readyCount_.fetch_add(1, std::memory_order_release);
  // A polling worker sees readyCount_ (and re-checks under our lock before it
  // sleeps). Waking another worker instead would move the stream's kernels
  // to a thread whose compute team is cold, for a futex round trip.
  if (wake && sleepingWorkers_ && !spinning_.load(std::memory_order_acquire)) {
    workCv_.notify_one();
  }
}

Stream* Executor::popReadyLocked() {
  for (auto& level : ready_) {
    if (!level.empty()) {
      Stream* s = level.front();
      level.pop_front();
      readyCount_.fetch_sub(1, std::memory_order_relaxed);
      return s;
    }
  }
  return nullptr;
}

void Executor::completeOneLocked(Stream* s) {
  wakeWaiters(s, s->completed.fetch_add(1) + 1, /*locked=*/true);
}

void Executor::wakeWaiters(Stream* s, uint64_t done, bool locked) {
  // seq_cst, paired with wait(): it publishes wakeAt, then reads completed;
  // we published completed, then read wakeAt: one of us sees the other.
  if (doneWaiters_.load() == 0 || done < s->wakeAt.load()) return;
  s->wakeAt.store(UINT64_MAX);  // waiters for later targets lower it again
  if (locked) {
    doneCv_.notify_all();
  } else {
    notifyDone();
  }
}

void Executor::releaseLocked(Stream* s, bool wake) {
  // Work already in the inbox: the stream stays scheduled, without the
  // hand-off's fence (a process-wide one, microseconds).
  if (s->queue.empty() && s->inbox.empty()) {
    s->state = Stream::kIdle;
    // Paired with enqueue(): it publishes its task, then reads `scheduled`;
    // we publish `scheduled`, then read the inbox. The heavy side of the
    // asymmetric fence (Fence.h) makes one of us see the other, so no task
    // is left in an unscheduled stream.
    s->scheduled.store(false);
    heavyFence();
    if (s->inbox.empty()) return;
  }
  makeReadyLocked(s, wake);
}

void Executor::enqueue(Stream* s, Task&& t) {
  s->enqueued.fetch_add(1, std::memory_order_relaxed);  // published by the push
  s->inbox.push(std::move(t));
  lightFence();  // the launch's side of releaseLocked's hand-off
  // A stream that is ready, running or parked has an owner-to-be who will
  // take the task from the inbox: no lock, no wake-up.
  if (s->scheduled.load()) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (s->state == Stream::kIdle) makeReadyLocked(s);
}

uint64_t Executor::throttleTarget(uint64_t launched, uint64_t completed, uint64_t depth) {
  // `launched` is read before `completed`: other threads' launches may have
  // been queued and run in between, so completed can exceed it. Unsigned
  // differences of the two used to wrap then, and a launcher early in a
  // stream's life (launched < depth / 2) waited for a count near 2^64,
  // forever (4 threads launching on one stream hung about once in 100 runs).
  if (completed >= launched || launched - completed <= depth) return 0;
  return launched - depth / 2;  // > completed + depth / 2: cannot wrap
}

void Executor::throttle(Stream* s) {
  const uint64_t launched = s->enqueued.load(std::memory_order_relaxed);
  if (launched % kThrottleEvery != 0 || currentKernel() != nullptr) return;
  const uint64_t target =
      throttleTarget(launched, s->completed.load(std::memory_order_acquire), queueDepth_);
  if (target == 0) return;
  nrtLaunchThrottleFn hook = gThrottleHook.load();
  if (hook) hook(s->handle);
  waitFor(s, target);
}

void Executor::resume(Stream* s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (s->state == Stream::kRunning) {
    s->resumeRequested = true;  // the worker sees it when the task returns
  } else if (s->state == Stream::kParked) {
    completeOneLocked(s);
    releaseLocked(s);
  }
}

void Executor::workerLoop() {
  std::vector<Task> batch;
  batch.reserve(kBatch);
  bool idleHookRan = true;  // nothing to release before the first work
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    Stream* s = popReadyLocked();
    if (!s) {
      // One idle worker polls for new work; the others sleep at once.
      bool poll = !spinning_.exchange(true, std::memory_order_acq_rel);
      if (poll) {
        lk.unlock();
        spinUntil([this] { return readyCount_.load(std::memory_order_acquire) > 0; });
        spinning_.store(false, std::memory_order_release);
        lk.lock();
      }
      s = popReadyLocked();
      if (!s && !idleHookRan) {
        // Once per idle spell, before sleeping: the layer above releases
        // what its kernels held on this thread (without our lock: it may
        // take a while, and work queued meanwhile is picked up below).
        idleHookRan = true;
        lk.unlock();
        const bool ran = runWorkerIdleHook();
        lk.lock();
        if (ran) s = popReadyLocked();
      }
      if (!s) {
        sleepingWorkers_++;
        workCv_.wait(lk, [this] { return readyCount_.load(std::memory_order_relaxed) > 0; });
        sleepingWorkers_--;
        continue;
      }
    }
    idleHookRan = false;
    // Streams made ready while a worker polled woke nobody (makeReadyLocked):
    // hand any still waiting to a sleeping worker, since this one may be
    // held by its stream's task for long (a kernel waiting on the host).
    if (readyCount_.load(std::memory_order_relaxed) > 0 && sleepingWorkers_ &&
        !spinning_.load(std::memory_order_acquire)) {
      workCv_.notify_one();
    }
    // Tasks put back behind a parked wait run first, then the inbox's.
    batch.clear();
    while (!s->queue.empty() && batch.size() < kBatch) batch.push_back(s->queue.take_front());
    const bool backlog = !s->queue.empty();  // the inbox waits until these are done
    s->state = Stream::kRunning;
    nrtStream_t handle = s->handle;
    lk.unlock();

    // Without the lock while this worker owns the stream: take the inbox's
    // tasks in batches, and when it runs dry, wait a little for the host's
    // next launch (it needs no wake-up then). Other ready streams, and
    // detach(), make us go back through the lock.
    bool park = false;
    size_t ran = 0;
    for (;;) {
      if (!backlog) takeFromInbox(s, batch, kBatch);
      if (batch.empty()) {
        if (!awaitLaunch(s)) break;
        continue;
      }
      ran = runBatch(s, handle, batch, &park, /*fromInbox=*/!backlog);
      if (park || backlog || othersWaiting()) break;
      batch.clear();
      ran = 0;
    }

    lk.lock();
    // Work behind a parked wait goes back to the front of the queue.
    for (size_t j = batch.size(); j > ran; --j) s->queue.push_front(std::move(batch[j - 1]));
    if (park && !s->resumeRequested) {
      s->state = Stream::kParked;
    } else {
      if (park) completeOneLocked(s);  // resumed while we were still running
      s->resumeRequested = false;
      // More work: this worker takes the stream again next (its compute
      // team is warm), unless other streams are ready too, for which a
      // sleeping worker is woken as before.
      releaseLocked(s, /*wake=*/readyCount_.load(std::memory_order_relaxed) > 0);
    }
    if (detachWaiters_.load() > 0) doneCv_.notify_all();
  }
}

bool Executor::othersWaiting() const {
  return readyCount_.load(std::memory_order_relaxed) > 0 || detachWaiters_.load() > 0;
}

bool Executor::awaitLaunch(Stream* s) {
  spinUntil([&] { return !s->inbox.empty() || othersWaiting(); });
  return !s->inbox.empty() && !othersWaiting();
}

void Executor::takeFromInbox(Stream* s, std::vector<Task>& batch, size_t until) {
  Task next;
  while (batch.size() < until && s->inbox.pop(next)) batch.push_back(std::move(next));
}

size_t Executor::runBatch(Stream* s, nrtStream_t handle, std::vector<Task>& batch, bool* park,
                          bool fromInbox) {
  size_t ran = 0;
  for (; ran < batch.size() && !*park; ++ran) {
    // A fusible run is not cut where the batch happens to end (the worker
    // took the batch while the host was still launching the run): the
    // items queued behind it join, up to a full window.
    if (fromInbox && batch[ran].fuser && batch.size() - ran < NRT_MAX_FUSED &&
        batch.back().fuser == batch[ran].fuser) {
      takeFromInbox(s, batch, ran + NRT_MAX_FUSED);
    }
    Task& t = batch[ran];
    switch (t.kind) {
      case Task::kKernel: {
        // A fusible item may take the fusible items behind it along.
        size_t fused = 1;
        KernelErrorPtr failure = t.fuser ? runFusible(&t, batch.size() - ran, handle, &fused)
                                         : runKernel(t, handle);
        if (failure) {
          // Recorded before the task counts as done, so a query that sees
          // the stream finished also sees the failure.
          std::lock_guard<std::mutex> g(mu_);
          if (s->error && !s->error->reported.load()) failure->previous = s->error;
          s->error = failure;
        }
        for (; fused > 1; --fused, ++ran) countDone(s);  // the first counts below
        break;
      }
      case Task::kRecord: {
        // The stream's count and the event move together (under our lock,
        // then the event's): whoever sees one sees the other. The event
        // carries the stream's unreported failure, if any.
        std::vector<Stream*> wake;
        {
          std::lock_guard<std::mutex> g(mu_);
          const uint64_t done = s->completed.fetch_add(1) + 1;
          wake = t.event->complete(t.generation, s->error);
          wakeWaiters(s, done, /*locked=*/true);
        }
        resumeParked(t.event, wake);
        t.event->unref();
        continue;
      }
      case Task::kWait:
        *park = t.event->parkUntil(t.generation, s);
        if (!*park) t.event->unref();  // a parked wait keeps it until resumed
        break;
    }
    // A parked wait counts as completed only once the stream resumes.
    if (!*park) countDone(s);
  }
  return ran;
}

void Executor::resumeParked(Event* e, const std::vector<Stream*>& streams) {
  for (Stream* w : streams) {
    w->executor->resume(w);
    e->unref();  // the parked wait's reference
  }
}

void Executor::countDone(Stream* s) {
  // seq_cst on both sides (here and in wait()) so that either we see the
  // waiter or the waiter sees the new count.
  wakeWaiters(s, s->completed.fetch_add(1) + 1, /*locked=*/false);
}

void Executor::notifyDone() {
  // Taking the lock orders this wake-up after a waiter's predicate check.
  { std::lock_guard<std::mutex> lk(mu_); }
  doneCv_.notify_all();
}

bool Executor::idle(Stream* s) {
  const uint64_t launched = s->enqueued.load();
  return s->completed.load() >= launched;
}

void Executor::wait(Stream* s) { waitFor(s, s->enqueued.load()); }

void Executor::waitFor(Stream* s, uint64_t target) {
  if (spinUntil([&] { return s->completed.load(std::memory_order_acquire) >= target; })) return;
  std::unique_lock<std::mutex> lk(mu_);
  doneWaiters_.fetch_add(1);  // seq_cst: pairs with the worker's increment of completed
  // The timeout only bounds the cost of a missed wake-up; it never decides.
  while (s->completed.load() < target) {
    uint64_t at = s->wakeAt.load();
    while (target < at && !s->wakeAt.compare_exchange_weak(at, target)) {
    }
    if (s->completed.load() >= target) break;
    doneCv_.wait_for(lk, std::chrono::milliseconds(2));
  }
  doneWaiters_.fetch_sub(1);
}

nrtStatus Executor::takeError(Stream* s) {
  KernelErrorPtr err;
  {
    std::lock_guard<std::mutex> lk(mu_);
    err = std::move(s->error);
    s->error.reset();
  }
  return err ? err->reportOnce() : NRT_SUCCESS;
}

nrtStatus Executor::synchronizeAll() {
  std::vector<Stream*> streams;
  {
    std::lock_guard<std::mutex> lk(mu_);
    streams = streams_;
  }
  // Every stream's unreported failures, in one message.
  nrtStatus first = NRT_SUCCESS;
  std::vector<const KernelError*> failures;
  std::vector<KernelErrorPtr> keep;  // alive until reported
  for (Stream* s : streams) {
    wait(s);
    KernelErrorPtr err;
    {
      std::lock_guard<std::mutex> lk(mu_);
      err = std::move(s->error);
      s->error.reset();
    }
    if (!err) continue;
    const nrtStatus st = err->claim(failures);
    if (first == NRT_SUCCESS) first = st;
    keep.push_back(std::move(err));
  }
  return first == NRT_SUCCESS ? first : reportFailures(first, failures);
}

}  // namespace nrt
