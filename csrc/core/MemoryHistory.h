// Memory history of the caching device allocator, as CUDA's allocator keeps
// it for torch.cuda.memory._record_memory_history / _snapshot: the stack
// that allocated each live block, and a bounded trace of what the allocator
// did (alloc, free, segment alloc/free, out-of-memory), per device.
//
// Stacks are torch::CapturedTraceback objects: gathering one stores code
// pointers only (Python frames through the unwinder torch_python registers,
// C++ frames by unwinding); they are turned into file/line/function at
// snapshot time. Nothing here depends on Python.
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace torchneuron {

// When stacks are recorded (CUDA's RecordContext, in increasing order).
enum class RecordContext : uint8_t {
  kNever = 0,  // no stacks
  kState = 1,  // stacks of live allocations (shown on snapshot blocks)
  kAlloc = 2,  // and on trace entries of allocations
  kAll = 3,    // and on trace entries of frees
};

struct HistorySettings {
  bool enabled = false;  // record anything at all
  bool trace = false;    // keep the trace of actions ("all"), not only state
  RecordContext context = RecordContext::kNever;
  bool cppStacks = false;        // C++ frames too (slower: unwinds the native stack)
  size_t maxEntries = SIZE_MAX;  // trace entries kept per device (the newest)
  bool clear = false;            // drop the traces recorded so far
  uint32_t skipActions = 0;      // bit (1 << TraceEntry::Action): not traced
};

namespace detail {
extern std::atomic<bool> g_history_enabled;
}  // namespace detail

// What alloc and free check before gathering a stack: while history is off,
// this relaxed load (and the device trace's plain flag under its lock) is
// all recording costs them.
inline bool memoryHistoryEnabled() {
  return detail::g_history_enabled.load(std::memory_order_relaxed);
}

// Sets the process-wide part of the settings (whether and which stacks are
// gathered); DeviceTrace::configure takes the per-device part.
void setHistoryContext(const HistorySettings& settings);

// The current stack when the settings record stacks at `when`, else null.
// Must be called without allocator locks held: gathering Python frames takes
// the GIL, and a thread holding the GIL may be waiting for such a lock.
std::shared_ptr<c10::GatheredContext> gatherContext(RecordContext when);

// Tells gatherContext whether the calling thread may gather Python frames.
// The Python binding installs "Python knows this thread" (it has a thread
// state; ops called from Python run there with the GIL released, and
// gathering takes it back). A thread Python never saw (an executor running a
// kernel) has no Python frames, and taking the GIL there could deadlock
// against a Python thread that waits for that kernel while holding it.
// Unset: Python frames are never gathered.
void setPythonStackProbe(bool (*mayGatherPython)());

// Microseconds since the epoch (the trace's time_us).
int64_t traceTimeUs();

struct TraceEntry {
  enum Action : uint8_t {
    kAlloc,
    kFreeRequested,  // the tensor died; reuse may wait for other streams
    kFreeCompleted,  // the block is back in the cache
    kSegmentAlloc,   // nrtMalloc of a new segment
    kSegmentFree,    // nrtFree of a cached segment
    kOom,            // addr holds the bytes the device still had free
    kSnapshot,
  };
  Action action;
  uintptr_t addr;
  size_t size;
  uint64_t stream;
  int64_t timeUs;
  std::shared_ptr<c10::GatheredContext> context;
};

// One device's trace: the newest maxEntries entries in a ring. Not
// thread-safe: its allocator's device lock guards it.
class DeviceTrace {
 public:
  void configure(const HistorySettings& settings);
  bool recording() const { return recording_; }
  void record(TraceEntry::Action action, uintptr_t addr, size_t size, uint64_t stream,
              std::shared_ptr<c10::GatheredContext> context);
  // Oldest first.
  std::vector<TraceEntry> entries() const;

 private:
  bool recording_ = false;
  bool entryStacks_ = false;  // entries keep stacks (context "alloc" or "all")
  uint32_t skipActions_ = 0;
  size_t maxEntries_ = 1;
  size_t next_ = 0;  // slot the next entry overwrites once the ring is full
  std::vector<TraceEntry> ring_;
};

// The allocator's state as _memory_viz reads it (CUDA's SegmentInfo and
// BlockInfo): segments in address order, each with its blocks in order.
struct BlockSnapshot {
  enum State : uint8_t { kActiveAllocated, kActivePendingFree, kInactive };
  size_t size;
  size_t requested;  // bytes asked for (size is rounded up); 0 when inactive
  State state;
  std::shared_ptr<c10::GatheredContext> context;  // allocation stack, if recorded
};

struct SegmentSnapshot {
  c10::DeviceIndex device;
  uintptr_t address;
  size_t totalSize;
  size_t allocatedSize;  // blocks held by tensors
  size_t activeSize;     // and blocks freed but waiting for other streams
  size_t requestedSize;  // bytes asked for by the active blocks
  uint64_t stream;       // 0: the device's default stream, as CUDA's null stream
  bool small;            // from the small pool (<= 1 MiB requests)
  std::shared_ptr<c10::GatheredContext> context;  // stack of the nrtMalloc
  std::vector<BlockSnapshot> blocks;
};

struct MemorySnapshot {
  std::vector<SegmentSnapshot> segments;
  std::vector<std::vector<TraceEntry>> deviceTraces;  // indexed by device
};

// Implemented by the caching device allocator (DeviceAllocator.cpp).
// Turns memory history on, off or reconfigures it, on every device.
void recordMemoryHistory(const HistorySettings& settings);
// Every device's segments (in address order per device) and traces.
MemorySnapshot memorySnapshot();

}  // namespace torchneuron
