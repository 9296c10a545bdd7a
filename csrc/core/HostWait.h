// HostWait: every time the host thread blocks on device work, with its cause.
//
// The execution model promises that the host only validates, allocates and
// queues; data reaches the host at synchronizing calls. Each place in the
// backend that makes the host wait for a stream or device calls
// noteHostWait() first, so the claim is measured, not asserted: tools list
// the waits since the last clear with their cause, the op and the Python
// stack that caused them (torchneuron.get_host_waits()), and the sync debug
// mode (torch.neuron.set_sync_debug_mode, like CUDA's) warns or raises at
// the wait itself.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch {
struct CapturedTraceback;
}

namespace torchneuron {

enum class WaitCause : int {
  Synchronize = 0,   // the user asked: synchronize(), Stream/Event.synchronize()
  ScalarRead,        // .item(), a tensor used as a Python number, printing
  CopyToHost,        // device -> host copy (.cpu(), .tolist(), numpy)
  CopyFromHost,      // host -> device copy that is synchronous by contract
  DataDependent,     // an op whose output shape depends on data (nonzero, ...)
  SyncPath,          // an op without an asynchronous kernel (synchronous generic path)
  Verification,      // first call of an argument kind, checked inline
  Allocator,         // the allocator waited to free memory (OOM retry, empty_cache)
  LaunchQueue,       // a launch found its stream's queue full (NEURON_RT_QUEUE_DEPTH)
  Other,
  kCount
};
const char* waitCauseName(WaitCause cause);

struct HostWaitRecord {
  WaitCause cause;
  std::string op;  // what waited ("aten::nonzero", "_local_scalar_dense", ...)
  std::shared_ptr<torch::CapturedTraceback> stack;  // Python frames; may be null
};

// Called right before the host blocks. `op` names what waits. Raises (sync
// debug mode "error") or warns ("warn") for every cause but Synchronize.
// withStack=false where a lock is held: gathering Python frames may take the
// GIL, and a thread holding the GIL may be waiting for that lock.
void noteHostWait(WaitCause cause, const std::string& op, bool withStack = true);

// The waits since the last clear (the newest kMaxKept with stacks), and the
// count per cause (all of them).
std::vector<HostWaitRecord> hostWaits();
std::vector<int64_t> hostWaitCounts();
void clearHostWaits();

// 0: off, 1: warn, 2: error (CUDA's numbering).
void setSyncDebugMode(int mode);
int syncDebugMode();

}  // namespace torchneuron
