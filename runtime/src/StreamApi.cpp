// StreamApi.cpp — stream lifetime, queries and synchronisation.
#include "Runtime.h"

using namespace nrt;

namespace nrt {
// Resolves a stream handle or reports INVALID_HANDLE.
Stream* lookupStream(Runtime* rt, nrtStream_t h, nrtStatus* st) {
  Stream* s = rt->stream(h);
  *st = s ? NRT_SUCCESS
          : failf(NRT_ERROR_INVALID_HANDLE,
                  "stream 0x%llx is not a live stream (destroyed, or never created)",
                  static_cast<unsigned long long>(h));
  return s;
}
nrtStatus checkNotSelfWait(Runtime* rt, nrtStream_t stream, int device, const char* call);
}  // namespace nrt

extern "C" {

nrtStatus nrtStreamGetDefault(nrtStream_t* stream, int device) {
  if (!stream) return fail(NRT_ERROR_INVALID_VALUE, "nrtStreamGetDefault: stream is NULL");
  NRT_RUNTIME(rt);
  nrtStatus st;
  Device* d = rt->device(device, &st);
  if (!d) return st;
  *stream = d->defaultStream;
  return NRT_SUCCESS;
}

nrtStatus nrtStreamCreate(nrtStream_t* stream, int device, int priority) {
  if (!stream) return fail(NRT_ERROR_INVALID_VALUE, "nrtStreamCreate: stream is NULL");
  NRT_RUNTIME(rt);
  nrtStatus st;
  Device* d = rt->device(device, &st);
  if (!d) return st;
  Executor* ex = d->executor.get();
  int clamped = Runtime::clampPriority(priority);
  nrtStream_t h =
      rt->streams().create([&](Stream& s, uint64_t handle) { ex->attach(&s, handle, clamped); });
  if (!h) return fail(NRT_ERROR_INTERNAL, "too many live streams (limit 1M)");
  *stream = h;
  return NRT_SUCCESS;
}

nrtStatus nrtStreamDestroy(nrtStream_t stream) {
  NRT_RUNTIME(rt);
  nrtStatus st;
  Stream* s = lookupStream(rt, stream, &st);
  if (!s) return st;
  Device* d = rt->device(s->device, &st);
  if (d && d->defaultStream == stream)
    return fail(NRT_ERROR_INVALID_HANDLE, "the default stream of a device cannot be destroyed");
  st = checkNotSelfWait(rt, stream, -1, "nrtStreamDestroy");
  if (st != NRT_SUCCESS) return st;
  // Retire the handle first so no new work arrives, then drain; the slot is
  // reused only after that.
  uint32_t index;
  if (!rt->streams().retire(stream, &index))
    return fail(NRT_ERROR_INVALID_HANDLE, "stream was destroyed concurrently");
  s->executor->detach(s);
  rt->streams().release(index);
  return NRT_SUCCESS;
}

nrtStatus nrtStreamGetDevice(nrtStream_t stream, int* device) {
  if (!device) return fail(NRT_ERROR_INVALID_VALUE, "nrtStreamGetDevice: device is NULL");
  NRT_RUNTIME(rt);
  nrtStatus st;
  Stream* s = lookupStream(rt, stream, &st);
  if (!s) return st;
  *device = s->device;
  return NRT_SUCCESS;
}

nrtStatus nrtStreamGetPriority(nrtStream_t stream, int* priority) {
  if (!priority) return fail(NRT_ERROR_INVALID_VALUE, "nrtStreamGetPriority: priority is NULL");
  NRT_RUNTIME(rt);
  nrtStatus st;
  Stream* s = lookupStream(rt, stream, &st);
  if (!s) return st;
  *priority = s->priority;
  return NRT_SUCCESS;
}

nrtStatus nrtStreamQuery(nrtStream_t stream) {
  NRT_RUNTIME(rt);
  nrtStatus st;
  Stream* s = lookupStream(rt, stream, &st);
  if (!s) return st;
  if (!s->executor->idle(s)) return NRT_ERROR_NOT_READY;
  return s->executor->takeError(s);
}

nrtStatus nrtStreamSynchronize(nrtStream_t stream) {
  NRT_RUNTIME(rt);
  nrtStatus st;
  Stream* s = lookupStream(rt, stream, &st);
  if (!s) return st;
  st = checkNotSelfWait(rt, stream, -1, "nrtStreamSynchronize");
  if (st != NRT_SUCCESS) return st;
  s->executor->wait(s);
  return s->executor->takeError(s);
}

}  // extern "C"
