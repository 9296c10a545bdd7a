// DeviceApi.cpp — device queries, the thread's current device, device sync.
#include <cstdio>
#include <cstring>

#include "Runtime.h"

using namespace nrt;

namespace {
// -1: the thread has not chosen; it is on the configured initial device.
thread_local int tlsCurrentDevice = -1;

// Device-index check for the calls that need only the configuration.
nrtStatus checkIndex(Runtime* rt, int device) {
  if (device < 0 || device >= rt->deviceCount())
    return failf(NRT_ERROR_INVALID_DEVICE, "device %d does not exist: %d device(s) visible",
                 device, rt->deviceCount());
  return NRT_SUCCESS;
}
}  // namespace

namespace nrt {
// A kernel that waited for work queued behind itself would wait forever:
// returns INVALID_VALUE when the calling thread runs a kernel of stream
// (stream != 0), or a kernel on device (device >= 0).
nrtStatus checkNotSelfWait(Runtime* rt, nrtStream_t stream, int device, const char* call) {
  nrtStream_t own = nrtKernelCurrentStream();
  if (!own) return NRT_SUCCESS;
  if (stream && own == stream)
    return failf(NRT_ERROR_INVALID_VALUE,
                 "%s called from inside a kernel running on stream 0x%llx: a kernel cannot wait "
                 "for its own stream (the wait would never return)",
                 call, static_cast<unsigned long long>(stream));
  if (device >= 0) {
    Stream* s = rt->stream(own);
    if (s && s->device == device)
      return failf(NRT_ERROR_INVALID_VALUE,
                   "%s(%d) called from inside a kernel running on device %d: a kernel cannot "
                   "wait for its own device (the wait would never return)",
                   call, device, device);
  }
  return NRT_SUCCESS;
}
}  // namespace nrt

extern "C" {

nrtStatus nrtGetDeviceCount(int* count) {
  if (!count) return fail(NRT_ERROR_INVALID_VALUE, "nrtGetDeviceCount: count is NULL");
  NRT_RUNTIME_CONFIGURED(rt);
  *count = rt->deviceCount();
  return NRT_SUCCESS;
}

nrtStatus nrtGetDeviceProperties(nrtDeviceProperties* props, int device) {
  if (!props) return fail(NRT_ERROR_INVALID_VALUE, "nrtGetDeviceProperties: props is NULL");
  NRT_RUNTIME_CONFIGURED(rt);
  nrtStatus st = checkIndex(rt, device);
  if (st != NRT_SUCCESS) return st;
  std::memset(props, 0, sizeof *props);
  std::snprintf(props->name, sizeof props->name, "NeuronCore (software, host CPU)");
  props->totalMemory = rt->deviceCapacity();
  props->computeThreads = rt->config().computeThreads;
  props->executorThreads = rt->config().executorThreads;
  props->physicalCore = rt->config().visibleCores[device];
  props->streamPriorityLeast = 0;
  props->streamPriorityGreatest = -(Executor::kLevels - 1);
  return NRT_SUCCESS;
}

nrtStatus nrtSetDevice(int device) {
  NRT_RUNTIME_CONFIGURED(rt);
  nrtStatus st = checkIndex(rt, device);
  if (st != NRT_SUCCESS) return st;
  tlsCurrentDevice = device;
  return NRT_SUCCESS;
}

nrtStatus nrtGetDevice(int* device) {
  if (!device) return fail(NRT_ERROR_INVALID_VALUE, "nrtGetDevice: device is NULL");
  NRT_RUNTIME_CONFIGURED(rt);
  *device = tlsCurrentDevice >= 0 ? tlsCurrentDevice : rt->config().initialDevice;
  return NRT_SUCCESS;
}

nrtStatus nrtDeviceSynchronize(int device) {
  NRT_RUNTIME(rt);
  nrtStatus st;
  Device* d = rt->device(device, &st);
  if (!d) return st;
  st = checkNotSelfWait(rt, 0, device, "nrtDeviceSynchronize");
  if (st != NRT_SUCCESS) return st;
  return d->executor->synchronizeAll();
}

nrtStatus nrtMemGetInfo(int device, size_t* freeBytes, size_t* totalBytes) {
  if (!freeBytes || !totalBytes)
    return fail(NRT_ERROR_INVALID_VALUE, "nrtMemGetInfo: freeBytes or totalBytes is NULL");
  NRT_RUNTIME(rt);
  nrtStatus st;
  Device* d = rt->device(device, &st);
  if (!d) return st;
  *totalBytes = d->arena->capacity();
  *freeBytes = *totalBytes - d->arena->used();
  return NRT_SUCCESS;
}

nrtStatus nrtMemGetLargestFreeRange(int device, size_t* bytes) {
  if (!bytes) return fail(NRT_ERROR_INVALID_VALUE, "nrtMemGetLargestFreeRange: bytes is NULL");
  NRT_RUNTIME(rt);
  nrtStatus st;
  Device* d = rt->device(device, &st);
  if (!d) return st;
  *bytes = d->arena->largestFree();
  return NRT_SUCCESS;
}

}  // extern "C"
