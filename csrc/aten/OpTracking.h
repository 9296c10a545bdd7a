// Which execution path each operator took on the neuron device:
//   native          a dedicated kernel of this backend (factories, views, copies)
//   async           queued on the current stream: a dedicated fast kernel, or
//                   the asynchronous generic path (AsyncPath.cpp)
//   inline          run on the host thread after the stream drained, for a
//                   reason the backend chose (the first call of an argument
//                   kind verifies the Meta layouts so; see AsyncPath.cpp):
//                   the host waited for the device
//   fallback        the synchronous generic path (the op's CPU kernel run on
//                   device memory after the stream drained)
// Every host wait is also listed with its cause in HostWait.h.
// Exposed to Python as torchneuron.get_executed_ops()/get_fallback_ops().
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace torchneuron {

enum class OpPath : int { Native = 0, Async = 1, Fallback = 2, Inline = 3 };

const char* opPathName(OpPath path);

// Per-op counters; the pointer stays valid for the life of the process, so
// hot kernels look it up once (static local) and count with one atomic add.
struct OpCounters {
  std::atomic<int64_t> count[4] = {0, 0, 0, 0};
  // Results the device copied into their outputs after the kernel computed
  // them in other memory (a pass over the result's bytes the op did not ask for).
  std::atomic<int64_t> resultCopies{0};
};
OpCounters* opCounters(const std::string& op);

bool opTrackingEnabled();
inline void recordOp(OpCounters* counters, OpPath path) {
  if (!opTrackingEnabled()) return;
  counters->count[static_cast<int>(path)].fetch_add(1, std::memory_order_relaxed);
}
// Convenience for cold paths (looks the op up by name).
void recordOp(const std::string& op, OpPath path);

// Counts one execution at a call site of a fixed op: NEURON_RECORD_OP("aten::x", Native).
#define NEURON_RECORD_OP(NAME, PATH)                                             \
  do {                                                                           \
    static ::torchneuron::OpCounters* _neuron_counters = ::torchneuron::opCounters(NAME); \
    ::torchneuron::recordOp(_neuron_counters, ::torchneuron::OpPath::PATH);      \
  } while (0)

struct OpRecord {
  int64_t native = 0;
  int64_t async = 0;
  int64_t fallback = 0;
  int64_t inlined = 0;
};

// A snapshot of every op recorded since the last clear.
std::map<std::string, OpRecord> executedOps();
// Per op, the results copied into their outputs since the last clear (ops
// with none left out).
std::map<std::string, int64_t> resultCopies();
void clearOpTracking();
void setOpTrackingEnabled(bool enabled);

}  // namespace torchneuron
