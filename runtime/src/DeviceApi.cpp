// DeviceApi.cpp — device queries, the thread's current device, device sync.
#include <cstdio>
#include <cstring>

#include "Runtime.h"

using namespace nrt;

namespace {
thread_local int tlsCurrentDevice = 0;
}

extern "C" {

nrtStatus nrtGetDeviceCount(int* count) {
  if (!count) return fail(NRT_ERROR_INVALID_VALUE, "nrtGetDeviceCount: count is NULL");
  NRT_RUNTIME(rt);
  *count = rt->deviceCount();
  return NRT_SUCCESS;
}

nrtStatus nrtGetDeviceProperties(nrtDeviceProperties* props, int device) {
  if (!props) return fail(NRT_ERROR_INVALID_VALUE, "nrtGetDeviceProperties: props is NULL");
  NRT_RUNTIME(rt);
  nrtStatus st;
  Device* d = rt->device(device, &st);
  if (!d) return st;
  std::memset(props, 0, sizeof *props);
  std::snprintf(props->name, sizeof props->name, "NeuronCore (software, host CPU)");
  props->totalMemory = d->arena->capacity();
  props->computeThreads = rt->config().computeThreads;
  props->executorThreads = d->executor->threads();
  props->physicalCore = d->physicalCore;
  props->streamPriorityLeast = 0;
  props->streamPriorityGreatest = -(Executor::kLevels - 1);
  return NRT_SUCCESS;
}

nrtStatus nrtSetDevice(int device) {
  NRT_RUNTIME(rt);
  nrtStatus st;
  if (!rt->device(device, &st)) return st;
  tlsCurrentDevice = device;
  return NRT_SUCCESS;
}

nrtStatus nrtGetDevice(int* device) {
  if (!device) return fail(NRT_ERROR_INVALID_VALUE, "nrtGetDevice: device is NULL");
  NRT_RUNTIME(rt);
  (void)rt;
  *device = tlsCurrentDevice;
  return NRT_SUCCESS;
}

nrtStatus nrtDeviceSynchronize(int device) {
  NRT_RUNTIME(rt);
  nrtStatus st;
  Device* d = rt->device(device, &st);
  if (!d) return st;
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
