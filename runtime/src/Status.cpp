// Status.cpp — error names and the thread-local last-error message.
#include "Status.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>

namespace nrt {
namespace {
thread_local std::string tlsLastError;
}

nrtStatus fail(nrtStatus status, const std::string& msg) {
  tlsLastError = std::string(nrtGetErrorName(status)) + ": " + msg;
  return status;
}

nrtStatus failf(nrtStatus status, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return fail(status, buf);
}

nrtStatus KernelError::claim(std::vector<const KernelError*>& failures) {
  const size_t first = failures.size();
  for (KernelError* e = this; e != nullptr; e = e->previous.get()) {
    // Reporting always takes a failure with all those before it, so one
    // already reported ends the walk (another call took the rest).
    if (e->reported.exchange(true)) break;
    failures.push_back(e);
  }
  std::reverse(failures.begin() + static_cast<std::ptrdiff_t>(first), failures.end());
  return failures.size() == first ? NRT_SUCCESS : failures[first]->status;
}

nrtStatus KernelError::reportOnce() {
  std::vector<const KernelError*> failures;
  const nrtStatus st = claim(failures);
  return st == NRT_SUCCESS ? st : reportFailures(st, failures);
}

nrtStatus reportFailures(nrtStatus status, const std::vector<const KernelError*>& failures) {
  if (failures.size() == 1) return fail(status, failures.front()->message);
  // The first few in full (a few hundred bytes each), the rest by name.
  constexpr size_t kInFull = 8;
  const size_t more = failures.size() - 1;
  std::string m = failures.front()->message + " (and " + std::to_string(more) +
                  " more kernel failure" + (more == 1 ? "" : "s") +
                  " queued before this synchronization: ";
  for (size_t i = 1; i < failures.size(); ++i) {
    if (i > 1) m += "; ";
    m += i <= kInFull ? failures[i]->message : "kernel '" + failures[i]->kernel + "'";
  }
  return fail(status, m + ")");
}

}  // namespace nrt

extern "C" {

const char* nrtGetErrorName(nrtStatus status) {
  switch (status) {
    case NRT_SUCCESS: return "NRT_SUCCESS";
    case NRT_ERROR_INVALID_VALUE: return "NRT_ERROR_INVALID_VALUE";
    case NRT_ERROR_INVALID_DEVICE: return "NRT_ERROR_INVALID_DEVICE";
    case NRT_ERROR_OUT_OF_MEMORY: return "NRT_ERROR_OUT_OF_MEMORY";
    case NRT_ERROR_INVALID_POINTER: return "NRT_ERROR_INVALID_POINTER";
    case NRT_ERROR_INVALID_DIRECTION: return "NRT_ERROR_INVALID_DIRECTION";
    case NRT_ERROR_INVALID_HANDLE: return "NRT_ERROR_INVALID_HANDLE";
    case NRT_ERROR_NOT_READY: return "NRT_ERROR_NOT_READY";
    case NRT_ERROR_EVENT_NOT_RECORDED: return "NRT_ERROR_EVENT_NOT_RECORDED";
    case NRT_ERROR_TIMING_DISABLED: return "NRT_ERROR_TIMING_DISABLED";
    case NRT_ERROR_KERNEL_FAILED: return "NRT_ERROR_KERNEL_FAILED";
    case NRT_ERROR_INVALID_CONFIG: return "NRT_ERROR_INVALID_CONFIG";
    case NRT_ERROR_INTERNAL: return "NRT_ERROR_INTERNAL";
    case NRT_ERROR_FORKED: return "NRT_ERROR_FORKED";
  }
  return "NRT_ERROR_UNKNOWN";
}

const char* nrtGetErrorString(nrtStatus status) {
  switch (status) {
    case NRT_SUCCESS: return "no error";
    case NRT_ERROR_INVALID_VALUE: return "an argument has an invalid value";
    case NRT_ERROR_INVALID_DEVICE: return "invalid device index";
    case NRT_ERROR_OUT_OF_MEMORY: return "out of device memory";
    case NRT_ERROR_INVALID_POINTER: return "pointer is not a live allocation of this runtime";
    case NRT_ERROR_INVALID_DIRECTION: return "copy direction does not match the pointers";
    case NRT_ERROR_INVALID_HANDLE: return "invalid or destroyed stream/event handle";
    case NRT_ERROR_NOT_READY: return "work is still pending";
    case NRT_ERROR_EVENT_NOT_RECORDED: return "event was never recorded";
    case NRT_ERROR_TIMING_DISABLED: return "event was created with timing disabled";
    case NRT_ERROR_KERNEL_FAILED: return "a kernel failed";
    case NRT_ERROR_INVALID_CONFIG: return "invalid runtime configuration";
    case NRT_ERROR_INTERNAL: return "internal runtime error";
    case NRT_ERROR_FORKED:
      return "the runtime cannot be used in a child forked after it started (use spawn)";
  }
  return "unknown status";
}

const char* nrtGetLastErrorMessage(void) { return nrt::tlsLastError.c_str(); }

}  // extern "C"
