// MemoryApi.cpp — device and pinned allocations, pointer attributes,
// copies and memsets (the async forms are kernels on a stream).
#include <cstdint>
#include <cstring>

#include "Activity.h"
#include "Runtime.h"

using namespace nrt;

namespace nrt {
Stream* lookupStream(Runtime* rt, nrtStream_t h, nrtStatus* st);
}

namespace {

struct Range {
  bool device = false;
  int deviceIndex = -1;
};

// Classifies [p, p+count): a device range must lie inside one live
// allocation; anything outside every arena is host memory.
nrtStatus classify(Runtime* rt, const void* p, size_t count, const char* what, Range* out) {
  if (count > UINTPTR_MAX - reinterpret_cast<uintptr_t>(p))
    return failf(NRT_ERROR_INVALID_VALUE, "%s range of %zu bytes at %p wraps around the address space",
                 what, count, p);
  Device* d = rt->deviceOf(p);
  if (!d) {
    // A host range must not run into a device arena: the copy would touch
    // device memory outside any allocation check.
    for (int i = 0; i < rt->deviceCount(); ++i) {
      nrtStatus st;
      Device* other = rt->device(i, &st);
      if (other && other->arena->overlaps(p, count))
        return failf(NRT_ERROR_INVALID_POINTER,
                     "%s host range of %zu bytes at %p runs into device %d's memory", what, count,
                     p, i);
    }
    out->device = false;
    return NRT_SUCCESS;
  }
  void* base;
  size_t size;
  if (!d->arena->find(p, &base, &size))
    return failf(NRT_ERROR_INVALID_POINTER,
                 "%s %p lies in device %d's memory but not in a live allocation (freed?)", what, p,
                 d->index);
  size_t offset = static_cast<const char*>(p) - static_cast<const char*>(base);
  if (count > size - offset)
    return failf(NRT_ERROR_INVALID_POINTER,
                 "%s range of %zu bytes at %p runs past its allocation (%zu bytes at %p)", what,
                 count, p, size, base);
  out->device = true;
  out->deviceIndex = d->index;
  return NRT_SUCCESS;
}

// The profiler's names for copies (CUDA's, so tools that group by them work).
const char* copyName(int dstDev, int srcDev) {
  if (dstDev >= 0 && srcDev >= 0) return dstDev == srcDev ? "Memcpy DtoD (Device -> Device)"
                                                          : "Memcpy PtoP (Device -> Device)";
  if (dstDev >= 0) return "Memcpy HtoD (Host -> Device)";
  if (srcDev >= 0) return "Memcpy DtoH (Device -> Host)";
  return "Memcpy HtoH (Host -> Host)";
}

// The work item of a copy from *read to *write (same length), synchronous or queued.
nrtWorkDesc copyWork(int dstDev, int srcDev, const nrtBufferRange* read,
                     const nrtBufferRange* write) {
  nrtWorkDesc desc{};
  desc.name = copyName(dstDev, srcDev);
  desc.nameLasts = 1;
  desc.kind = nrtWorkCopy;
  desc.bytes = read->bytes;
  desc.reads = read;
  desc.numReads = 1;
  desc.writes = write;
  desc.numWrites = 1;
  return desc;
}

const char* kindName(nrtMemcpyKind k) {
  switch (k) {
    case nrtMemcpyHostToDevice: return "HostToDevice";
    case nrtMemcpyDeviceToHost: return "DeviceToHost";
    case nrtMemcpyDeviceToDevice: return "DeviceToDevice";
    case nrtMemcpyDefault: return "Default";
    default: break;
  }
  return "?";
}

// Validates a copy and returns the devices it touches (-1 for none).
nrtStatus checkCopy(Runtime* rt, void* dst, const void* src, size_t count, nrtMemcpyKind kind,
                    int* dstDev, int* srcDev) {
  if (kind < nrtMemcpyHostToDevice || kind > nrtMemcpyDefault)
    return failf(NRT_ERROR_INVALID_VALUE, "unknown copy kind %d", static_cast<int>(kind));
  *dstDev = *srcDev = -1;
  // A zero-byte copy touches no memory: nothing to classify (the pointers
  // may be NULL or past-the-end, as memcpy's callers often pass).
  if (count == 0) return NRT_SUCCESS;
  if (!dst || !src)
    return fail(NRT_ERROR_INVALID_VALUE, "copy of a non-zero size with a NULL pointer");
  Range d, s;
  nrtStatus st = classify(rt, dst, count, "destination", &d);
  if (st == NRT_SUCCESS) st = classify(rt, src, count, "source", &s);
  if (st != NRT_SUCCESS) return st;
  bool wantDstDev = kind == nrtMemcpyHostToDevice || kind == nrtMemcpyDeviceToDevice;
  bool wantSrcDev = kind == nrtMemcpyDeviceToHost || kind == nrtMemcpyDeviceToDevice;
  if (kind != nrtMemcpyDefault && (d.device != wantDstDev || s.device != wantSrcDev))
    return failf(NRT_ERROR_INVALID_DIRECTION,
                 "copy kind %s expects a %s source and a %s destination, got a %s source and a "
                 "%s destination",
                 kindName(kind), wantSrcDev ? "device" : "host", wantDstDev ? "device" : "host",
                 s.device ? "device" : "host", d.device ? "device" : "host");
  *dstDev = d.deviceIndex;
  *srcDev = s.deviceIndex;
  return NRT_SUCCESS;
}

struct CopyArgs {
  void* dst;
  const void* src;
  size_t count;
};
nrtStatus copyKernel(void* a) {
  auto* c = static_cast<CopyArgs*>(a);
  if (c->count) std::memcpy(c->dst, c->src, c->count);
  return NRT_SUCCESS;
}

struct SetArgs {
  void* dst;
  int value;
  size_t count;
};
nrtStatus memsetKernel(void* a) {
  auto* c = static_cast<SetArgs*>(a);
  if (c->count) std::memset(c->dst, c->value, c->count);
  return NRT_SUCCESS;
}

// A synchronous copy is ordered after all work queued on its devices.
nrtStatus drainDevices(int a, int b) {
  nrtStatus st = NRT_SUCCESS;
  if (a >= 0) st = nrtDeviceSynchronize(a);
  if (st == NRT_SUCCESS && b >= 0 && b != a) st = nrtDeviceSynchronize(b);
  return st;
}

}  // namespace

extern "C" {

nrtStatus nrtMalloc(void** ptr, size_t size, int device) {
  if (!ptr) return fail(NRT_ERROR_INVALID_VALUE, "nrtMalloc: ptr is NULL");
  NRT_RUNTIME(rt);
  nrtStatus st;
  Device* d = rt->device(device, &st);
  if (!d) return st;
  if (size == 0) {
    *ptr = nullptr;
    return NRT_SUCCESS;
  }
  void* p = d->arena->allocate(size);
  if (!p) {
    return failf(NRT_ERROR_OUT_OF_MEMORY,
                 "cannot allocate %zu bytes on device %d: capacity %zu, in use %zu, largest free "
                 "range %zu (set NEURON_RT_MEMORY_PER_CORE for a larger arena)",
                 size, device, d->arena->capacity(), d->arena->used(), d->arena->largestFree());
  }
  *ptr = p;
  return NRT_SUCCESS;
}

nrtStatus nrtFree(void* ptr) {
  if (!ptr) return NRT_SUCCESS;
  NRT_RUNTIME(rt);
  Device* d = rt->deviceOf(ptr);
  if (!d || !d->arena->release(ptr))
    return failf(NRT_ERROR_INVALID_POINTER,
                 "nrtFree(%p): not the start of a live device allocation (foreign, interior or "
                 "already freed)",
                 ptr);
  return NRT_SUCCESS;
}

nrtStatus nrtHostAlloc(void** ptr, size_t size) {
  if (!ptr) return fail(NRT_ERROR_INVALID_VALUE, "nrtHostAlloc: ptr is NULL");
  NRT_RUNTIME(rt);
  if (size == 0) {
    *ptr = nullptr;
    return NRT_SUCCESS;
  }
  return rt->hostAlloc(ptr, size);
}

nrtStatus nrtHostFree(void* ptr) {
  if (!ptr) return NRT_SUCCESS;
  NRT_RUNTIME(rt);
  return rt->hostFree(ptr);
}

nrtStatus nrtPointerGetAttributes(nrtPointerAttributes* attr, const void* ptr) {
  if (!attr) return fail(NRT_ERROR_INVALID_VALUE, "nrtPointerGetAttributes: attr is NULL");
  NRT_RUNTIME(rt);
  *attr = nrtPointerAttributes{nrtMemoryTypeUnregistered, -1, nullptr, 0};
  if (Device* d = rt->deviceOf(ptr)) {
    if (d->arena->find(ptr, &attr->base, &attr->size)) {
      attr->type = nrtMemoryTypeDevice;
      attr->device = d->index;
    }
  } else if (rt->findHost(ptr, &attr->base, &attr->size)) {
    attr->type = nrtMemoryTypeHost;
  }
  return NRT_SUCCESS;
}

nrtStatus nrtMemcpy(void* dst, const void* src, size_t count, nrtMemcpyKind kind) {
  NRT_RUNTIME(rt);
  int dstDev, srcDev;
  nrtStatus st = checkCopy(rt, dst, src, count, kind, &dstDev, &srcDev);
  if (st != NRT_SUCCESS || count == 0) return st;
  st = drainDevices(dstDev, srcDev);
  if (st != NRT_SUCCESS) return st;
  // A synchronous copy runs here, on the calling thread, as the legacy
  // stream's work item of the device it touches (timed like queued work).
  const int device = dstDev >= 0 ? dstDev : srcDev;
  nrtActivityRecord* rec = nullptr;
  if (activity::recording() && device >= 0) {
    const nrtBufferRange read{src, count}, write{dst, count};
    const nrtWorkDesc desc = copyWork(dstDev, srcDev, &read, &write);
    Device* d = rt->device(device, &st);
    rec = activity::begin(desc, activity::nextWorkId(), d ? d->defaultStream : 0, device);
  }
  const uint64_t start = rec ? activity::nowNs() : 0;
  std::memcpy(dst, src, count);
  if (rec) activity::finish(rec, start, activity::nowNs(), NRT_SUCCESS);
  return NRT_SUCCESS;
}

nrtStatus nrtMemcpyAsync(void* dst, const void* src, size_t count, nrtMemcpyKind kind,
                         nrtStream_t stream) {
  NRT_RUNTIME(rt);
  int dstDev, srcDev;
  nrtStatus st = checkCopy(rt, dst, src, count, kind, &dstDev, &srcDev);
  if (st != NRT_SUCCESS) return st;
  if (count == 0) return lookupStream(rt, stream, &st) ? NRT_SUCCESS : st;  // nothing to queue
  CopyArgs args{dst, src, count};
  const nrtBufferRange read{src, count}, write{dst, count};
  const nrtWorkDesc desc = copyWork(dstDev, srcDev, &read, &write);
  return nrtLaunchWork(stream, &desc, copyKernel, &args, sizeof args, nullptr);
}

nrtStatus nrtMemset(void* ptr, int value, size_t count) {
  NRT_RUNTIME(rt);
  Range r;
  if (count == 0) return NRT_SUCCESS;  // touches no memory
  if (!ptr) return fail(NRT_ERROR_INVALID_VALUE, "nrtMemset: ptr is NULL");
  nrtStatus st = classify(rt, ptr, count, "memset target", &r);
  if (st != NRT_SUCCESS) return st;
  if (!r.device)
    return failf(NRT_ERROR_INVALID_POINTER, "nrtMemset: %p is not device memory", ptr);
  st = drainDevices(r.deviceIndex, -1);
  if (st != NRT_SUCCESS) return st;
  std::memset(ptr, value, count);
  return NRT_SUCCESS;
}

nrtStatus nrtMemsetAsync(void* ptr, int value, size_t count, nrtStream_t stream) {
  NRT_RUNTIME(rt);
  Range r;
  nrtStatus st;
  if (count == 0) return lookupStream(rt, stream, &st) ? NRT_SUCCESS : st;  // nothing to queue
  if (!ptr) return fail(NRT_ERROR_INVALID_VALUE, "nrtMemsetAsync: ptr is NULL");
  st = classify(rt, ptr, count, "memset target", &r);
  if (st != NRT_SUCCESS) return st;
  if (!r.device)
    return failf(NRT_ERROR_INVALID_POINTER, "nrtMemsetAsync: %p is not device memory", ptr);
  SetArgs args{ptr, value, count};
  const nrtBufferRange write{ptr, count};
  nrtWorkDesc desc{};
  desc.name = "Memset (Device)";
  desc.nameLasts = 1;
  desc.kind = nrtWorkMemset;
  desc.bytes = count;
  desc.writes = &write;
  desc.numWrites = 1;
  return nrtLaunchWork(stream, &desc, memsetKernel, &args, sizeof args, nullptr);
}

}  // extern "C"
