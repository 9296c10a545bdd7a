// Which execution path each operator took on the neuron device:
//   native   a dedicated kernel of this backend (factories, views, copies)
//   async    a fast kernel enqueued on the current stream
//   fallback the generic path (the op's CPU kernel run on device memory),
//            synchronously
//   fallback_async  the generic path queued on the current stream
// Exposed to Python as torchneuron.get_executed_ops()/get_fallback_ops().
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace torchneuron {

enum class OpPath : int { Native = 0, Async = 1, Fallback = 2, GenericAsync = 3 };

const char* opPathName(OpPath path);

// Counts one execution of `op` (e.g. "aten::add.Tensor") on `path`.
void recordOp(const std::string& op, OpPath path);
void recordOp(const char* op, OpPath path);

struct OpRecord {
  int64_t native = 0;
  int64_t async = 0;
  int64_t fallback = 0;
  int64_t fallback_async = 0;
};

// A snapshot of every op recorded since the last clear.
std::map<std::string, OpRecord> executedOps();
void clearOpTracking();
void setOpTrackingEnabled(bool enabled);
bool opTrackingEnabled();

}  // namespace torchneuron
