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
  // Failures queued on the same stream after this one and before it was
  // reported: each is counted (the first is the one reported in full, as
  // it may have caused the rest).
  std::atomic<uint64_t> later{0};

  // Returns the failure if nobody has reported it yet, SUCCESS otherwise.
  nrtStatus reportOnce() {
    if (reported.exchange(true)) return NRT_SUCCESS;
    const uint64_t more = later.load();
    if (more == 0) return fail(status, message);
    return fail(status, message + " (and " + std::to_string(more) + " later kernel failure" +
                            (more == 1 ? "" : "s") +
                            " on this stream before this synchronization; the first is reported)");
  }
};
using KernelErrorPtr = std::shared_ptr<KernelError>;

}  // namespace nrt
