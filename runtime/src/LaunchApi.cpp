// LaunchApi.cpp — queueing kernels on streams.
#include <cstring>

#include "Activity.h"
#include "Runtime.h"

using namespace nrt;

namespace nrt {
Stream* lookupStream(Runtime* rt, nrtStream_t h, nrtStatus* st);
}

extern "C" {

nrtStatus nrtLaunchWork(nrtStream_t stream, const nrtWorkDesc* desc, nrtKernelFn fn,
                        const void* args, size_t argsSize, uint64_t* workId) {
  if (!desc) return fail(NRT_ERROR_INVALID_VALUE, "nrtLaunchWork: desc is NULL");
  // A C caller may store any int in the enum: read it as one (loading an
  // out-of-range value as nrtWorkKind is undefined in C++).
  int kind;
  std::memcpy(&kind, &desc->kind, sizeof kind);
  if (kind < nrtWorkKernel || kind > nrtWorkHost)
    return failf(NRT_ERROR_INVALID_VALUE, "nrtLaunchWork: unknown work kind %d", kind);
  if ((!desc->reads && desc->numReads) || (!desc->writes && desc->numWrites))
    return fail(NRT_ERROR_INVALID_VALUE, "nrtLaunchWork: buffer list is NULL but its count > 0");
  if (!fn) return fail(NRT_ERROR_INVALID_VALUE, "nrtLaunchKernel: fn is NULL");
  if (!args && argsSize)
    return fail(NRT_ERROR_INVALID_VALUE, "nrtLaunchKernel: args is NULL but argsSize > 0");
  NRT_RUNTIME(rt);
  nrtStatus st;
  Stream* s = lookupStream(rt, stream, &st);
  if (!s) return st;
  Task t;
  t.kind = Task::kKernel;
  t.fn = fn;
  t.fuser = desc->fuser;
  if (!t.setArgs(args, argsSize))
    return failf(NRT_ERROR_INTERNAL, "no host memory for %zu bytes of kernel arguments", argsSize);
  if (!t.setName(desc->name, desc->nameLasts != 0))  // after the arguments (Task.h)
    return fail(NRT_ERROR_INTERNAL, "no host memory for the work item's name");
  t.workId = activity::nextWorkId();
  t.record = activity::begin(*desc, t.workId, stream, s->device);
  if (workId) *workId = t.workId;
  if (rt->config().launchBlocking) {
    // Debug mode: drain the stream, then run here and report at once.
    s->executor->wait(s);
    st = s->executor->takeError(s);
    if (st != NRT_SUCCESS) return st;
    KernelErrorPtr failure = runKernel(t, stream);
    return failure ? failure->reportOnce() : NRT_SUCCESS;
  }
  s->executor->enqueue(s, std::move(t));
  s->executor->throttle(s);
  return NRT_SUCCESS;
}

nrtStatus nrtSetLaunchThrottleHook(nrtLaunchThrottleFn fn) {
  setLaunchThrottleHook(fn);
  return NRT_SUCCESS;
}

nrtStatus nrtSetWorkerIdleHook(nrtWorkerIdleFn fn) {
  setWorkerIdleHook(fn);
  return NRT_SUCCESS;
}

nrtStatus nrtLaunchKernel(nrtStream_t stream, const char* name, nrtKernelFn fn, const void* args,
                          size_t argsSize) {
  nrtWorkDesc desc{};
  desc.name = name;
  desc.kind = nrtWorkKernel;
  return nrtLaunchWork(stream, &desc, fn, args, argsSize, nullptr);
}

nrtStatus nrtKernelSetError(const char* message) {
  KernelContext* ctx = currentKernel();
  if (!ctx) return fail(NRT_ERROR_INVALID_VALUE, "nrtKernelSetError called outside a kernel");
  ctx->message = message ? message : "";
  ctx->messageSet = true;
  return NRT_SUCCESS;
}

nrtStream_t nrtKernelCurrentStream(void) {
  KernelContext* ctx = currentKernel();
  return ctx ? ctx->stream : 0;
}

}  // extern "C"
