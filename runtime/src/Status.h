// Status.h — how runtime calls fail: a status code plus a thread-local
// message that says what was expected and what was found.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "neuron/runtime.h"

namespace nrt {

// Records msg as this thread's last-error message and returns status.
nrtStatus fail(nrtStatus status, const std::string& msg);

// printf-style convenience over fail().
nrtStatus failf(nrtStatus status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// A kernel failure waiting to be reported. It is shared by the stream it
// happened on and by events recorded after it, and reported exactly once by
// whichever synchronizing call sees it first.
//
// A stream's failures form a chain: each links the one queued before it on
// the same stream while that one was still unreported. Reporting a failure
// reports it and the unreported ones before it (an event recorded after a
// failure sees it and those before, not later ones), so no failure is ever
// dropped: a synchronization names every failure it is the first to see.
struct KernelError;
using KernelErrorPtr = std::shared_ptr<KernelError>;

struct KernelError {
  KernelError(nrtStatus s, std::string m, std::string k = {})
      : status(s), message(std::move(m)), kernel(std::move(k)) {}
  nrtStatus status;
  std::string message;
  std::string kernel;  // the failed kernel's name: how a long report names the rest
  std::atomic<bool> reported{false};
  KernelErrorPtr previous;  // set once, when queued behind an unreported failure

  // Claims this failure and the unreported ones before it: appends them,
  // oldest first, and returns the oldest one's status (SUCCESS when all
  // were reported already).
  nrtStatus claim(std::vector<const KernelError*>& failures);

  // Claims, and reports what it claimed as this thread's error.
  nrtStatus reportOnce();
};

// One message for the failures one call claimed: the first ones in full, the
// rest by kernel name (every failure is named).
nrtStatus reportFailures(nrtStatus status, const std::vector<const KernelError*>& failures);


}  // namespace nrt
