// Allocation redirect for the generic path: while a CPU kernel runs on device
// memory for a neuron op, host allocations made by that kernel on the calling
// thread (its fresh outputs and temporaries) come from the neuron caching
// allocator instead of host memory. Fresh outputs are then handed over as
// device storage without a copy.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

namespace torchneuron {

// While alive, CPU allocations on this thread are served from `device`'s
// memory (DataPtrs report device CPU until adopted).
class AllocationRedirectGuard {
 public:
  explicit AllocationRedirectGuard(c10::DeviceIndex device);
  ~AllocationRedirectGuard();
  AllocationRedirectGuard(const AllocationRedirectGuard&) = delete;
  AllocationRedirectGuard& operator=(const AllocationRedirectGuard&) = delete;

 private:
  c10::DeviceIndex previous_;
};

// Fresh results in place: while alive, one CPU allocation on this thread of
// exactly a target's byte size is served from that target's memory (each
// target once), without owning it. A queued functional kernel (no out=
// overload) then computes its results where the device already holds its
// outputs, and no copy follows (QueuedKernel.cpp).
// Which allocation: the target's `ordinal`-th allocation of its size (0:
// the first). A temporary of that size may come first (oneDNN's convolution
// computes in a buffer of its own and then reorders into the result); the
// result then lands elsewhere and is copied, as without the guard, and
// ordinalOf tells which allocation it was, so that the next call with the
// same arguments can serve that one instead (MetaResult::placementOrdinal).
class ResultPlacement {
 public:
  struct Target {
    void* memory;
    size_t bytes;
    uint32_t ordinal;  // serve the kernel's allocation of `bytes` with this index
  };
  explicit ResultPlacement(c10::ArrayRef<Target> targets);
  ~ResultPlacement() { stop(); }
  // Stops serving (what was served stays valid): copies of the results that
  // follow must not take an open output's memory.
  void stop();
  ResultPlacement(const ResultPlacement&) = delete;
  ResultPlacement& operator=(const ResultPlacement&) = delete;

  // Whether a storage still refers to memory served by this guard: to be
  // asked once the kernel's results are dropped (a kernel that kept a
  // reference, in a cache say, would later touch device outputs).
  bool anyStillReferenced() const;

  // The allocator's side: the open target of `bytes` whose ordinal is this
  // allocation's index among the kernel's allocations of `bytes`, as a CPU
  // allocation; none when there is none, or when a storage from an earlier
  // kernel still refers to it (that kernel kept one: the target is skipped).
  std::optional<c10::DataPtr> serve(size_t bytes);
  // The allocator's side, after an allocation serve() passed over: its memory.
  void noteUnserved(size_t bytes, const void* data);

  // The index, among this kernel's allocations of `bytes`, of the one at
  // `data` that was not served (a result that landed elsewhere); -1 when
  // none was (or more allocations came than are remembered).
  int64_t ordinalOf(size_t bytes, const void* data) const;

 private:
  c10::SmallVector<Target, 4> targets_;
  enum State : uint8_t { kOpen, kServed, kRefused };
  c10::SmallVector<State, 4> state_;
  // Allocations of each target size so far, and where the unserved ones went.
  struct Count {
    size_t bytes;
    uint32_t count;
  };
  c10::SmallVector<Count, 4> counts_;
  struct Unserved {
    size_t bytes;
    uint32_t ordinal;
    const void* data;
  };
  static constexpr size_t kRemembered = 16;
  c10::SmallVector<Unserved, 4> unserved_;
  std::optional<Unserved> pending_;  // serve() passed it over; its memory comes next
  ResultPlacement* previous_;
};

// True when the redirecting CPU allocator is installed (it is unless another
// library installed a CPU allocator with a higher priority).
bool allocationRedirectInstalled();

// True when `ptr` is a neuron caching-allocator block (e.g. a redirected
// allocation inside a CPU storage).
bool isDeviceDataPtr(const c10::DataPtr& ptr);

}  // namespace torchneuron
