// Status.h — how runtime calls fail: a status code plus a thread-local
// message that says what was expected and what was found.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "neuron/runtime.h"

namespace nrt {

// Records msg as this thread's last-error message and returns status.
nrtStatus fail(nrtStatus status, const std::string& msg);

// printf-style convenience over fail().
nrtStatus failf(nrtStatus status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// A kernel failure waiting to be reported. It is shared by the stream it
// happened on and by events recorded after it, and reported exactly once by
// whichever synchronizing call sees it first.
struct KernelError {
  KernelError(nrtStatus s, std::string m) : status(s), message(std::move(m)) {}
  nrtStatus status;
  std::string message;
  std::atomic<bool> reported{false};

  // Returns the failure if nobody has reported it yet, SUCCESS otherwise.
  nrtStatus reportOnce() {
    if (reported.exchange(true)) return NRT_SUCCESS;
    return fail(status, message);
  }
};
using KernelErrorPtr = std::shared_ptr<KernelError>;

}  // namespace nrt
