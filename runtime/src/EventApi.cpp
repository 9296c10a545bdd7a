// EventApi.cpp — events: create, record, query, synchronize, wait, time.
#include "Runtime.h"

using namespace nrt;

namespace nrt {
Stream* lookupStream(Runtime* rt, nrtStream_t h, nrtStatus* st);

namespace {

Event* lookupEvent(Runtime* rt, nrtEvent_t h, nrtStatus* st) {
  Event* e = rt->event(h);
  *st = e ? NRT_SUCCESS
          : failf(NRT_ERROR_INVALID_HANDLE,
                  "event 0x%llx is not a live event (destroyed, or never created)",
                  static_cast<unsigned long long>(h));
  return e;
}

nrtStatus notRecorded(nrtEvent_t h) {
  return failf(NRT_ERROR_EVENT_NOT_RECORDED,
               "event 0x%llx has never been recorded: record it on a stream first",
               static_cast<unsigned long long>(h));
}

// With e->mu held: status of the latest record.
nrtStatus stateLocked(Event* e, nrtEvent_t h) {
  if (e->recorded == e->firstGeneration) return notRecorded(h);
  if (e->completed.load(std::memory_order_relaxed) < e->recorded) return NRT_ERROR_NOT_READY;
  return NRT_SUCCESS;
}

}  // namespace
}  // namespace nrt

extern "C" {

nrtStatus nrtEventCreate(nrtEvent_t* event, unsigned flags) {
  if (!event) return fail(NRT_ERROR_INVALID_VALUE, "nrtEventCreate: event is NULL");
  if (flags & ~unsigned(NRT_EVENT_DISABLE_TIMING))
    return failf(NRT_ERROR_INVALID_VALUE, "nrtEventCreate: unknown flags 0x%x", flags);
  NRT_RUNTIME(rt);
  nrtEvent_t h = rt->events().create([&](Event& e, uint64_t handle) {
    e.reset(flags, static_cast<uint32_t>(handle) - 1);
  });
  if (!h) return fail(NRT_ERROR_INTERNAL, "too many live events (limit 1M)");
  *event = h;
  return NRT_SUCCESS;
}

nrtStatus nrtEventDestroy(nrtEvent_t event) {
  NRT_RUNTIME(rt);
  uint32_t index;
  Event* e = rt->events().retire(event, &index);
  if (!e)
    return failf(NRT_ERROR_INVALID_HANDLE, "event 0x%llx is not a live event",
                 static_cast<unsigned long long>(event));
  e->unref();  // the handle's reference; queued records and waits keep theirs
  return NRT_SUCCESS;
}

nrtStatus nrtEventRecord(nrtEvent_t event, nrtStream_t stream) {
  NRT_RUNTIME(rt);
  nrtStatus st;
  Event* e = lookupEvent(rt, event, &st);
  if (!e) return st;
  Stream* s = lookupStream(rt, stream, &st);
  if (!s) return st;
  Task t;
  t.kind = Task::kRecord;
  t.event = e;
  t.setName("nrtEventRecord");
  {
    std::lock_guard<std::mutex> lk(e->mu);
    t.generation = ++e->recorded;
    e->outstanding.push_back(t.generation);
    e->recordedOn = stream;
  }
  e->ref();  // dropped when the record has run
  s->executor->enqueue(s, std::move(t));
  return NRT_SUCCESS;
}

nrtStatus nrtEventQuery(nrtEvent_t event) {
  NRT_RUNTIME(rt);
  nrtStatus st;
  Event* e = lookupEvent(rt, event, &st);
  if (!e) return st;
  KernelErrorPtr err;
  {
    std::lock_guard<std::mutex> lk(e->mu);
    st = stateLocked(e, event);
    if (st != NRT_SUCCESS) return st;
    err = e->error;
  }
  return err ? err->reportOnce() : NRT_SUCCESS;
}

nrtStatus nrtEventSynchronize(nrtEvent_t event) {
  NRT_RUNTIME(rt);
  nrtStatus st;
  Event* e = lookupEvent(rt, event, &st);
  if (!e) return st;
  KernelErrorPtr err;
  {
    std::unique_lock<std::mutex> lk(e->mu);
    st = stateLocked(e, event);
    if (st == NRT_ERROR_EVENT_NOT_RECORDED) return st;
    uint64_t target = e->recorded;
    // A record queued behind the calling kernel on its own stream cannot
    // complete before the kernel returns.
    if (st == NRT_ERROR_NOT_READY && e->recordedOn == nrtKernelCurrentStream())
      return failf(NRT_ERROR_INVALID_VALUE,
                   "nrtEventSynchronize called from inside a kernel on stream 0x%llx for an "
                   "event recorded after it on the same stream: a kernel cannot wait for its "
                   "own stream (the wait would never return)",
                   static_cast<unsigned long long>(e->recordedOn));
    e->syncWaiters++;
    e->cv.wait(lk, [&] { return e->completed.load(std::memory_order_relaxed) >= target; });
    e->syncWaiters--;
    err = e->error;
  }
  return err ? err->reportOnce() : NRT_SUCCESS;
}

nrtStatus nrtEventElapsedTime(float* ms, nrtEvent_t start, nrtEvent_t end) {
  if (!ms) return fail(NRT_ERROR_INVALID_VALUE, "nrtEventElapsedTime: ms is NULL");
  NRT_RUNTIME(rt);
  nrtStatus st;
  Event* a = lookupEvent(rt, start, &st);
  if (!a) return st;
  Event* b = lookupEvent(rt, end, &st);
  if (!b) return st;
  int64_t ta, tb;
  for (auto [e, h, t] : {std::tuple{a, start, &ta}, std::tuple{b, end, &tb}}) {
    std::lock_guard<std::mutex> lk(e->mu);
    if (!e->timing())
      return failf(NRT_ERROR_TIMING_DISABLED,
                   "event 0x%llx was created with NRT_EVENT_DISABLE_TIMING",
                   static_cast<unsigned long long>(h));
    st = stateLocked(e, h);
    if (st != NRT_SUCCESS) return st;
    *t = e->timestampNs;
  }
  *ms = static_cast<float>(static_cast<double>(tb - ta) / 1e6);
  return NRT_SUCCESS;
}

nrtStatus nrtStreamWaitEvent(nrtStream_t stream, nrtEvent_t event) {
  NRT_RUNTIME(rt);
  nrtStatus st;
  Stream* s = lookupStream(rt, stream, &st);
  if (!s) return st;
  Event* e = lookupEvent(rt, event, &st);
  if (!e) return st;
  Task t;
  t.kind = Task::kWait;
  t.event = e;
  t.setName("nrtStreamWaitEvent");
  {
    std::lock_guard<std::mutex> lk(e->mu);
    if (e->recorded == e->firstGeneration) return notRecorded(event);
    t.generation = e->recorded;
    if (e->doneLocked(t.generation)) return NRT_SUCCESS;
    // Recorded on this very stream: stream order already guarantees it.
    if (e->recordedOn == stream) return NRT_SUCCESS;
  }
  e->ref();  // dropped when the wait is satisfied
  s->executor->enqueue(s, std::move(t));
  return NRT_SUCCESS;
}

}  // extern "C"
