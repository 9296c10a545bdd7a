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

// Fresh results in place: while alive, the CPU allocation on this thread of
// exactly a target's byte size is served from that target's memory (each
// target once, the first such allocation), without owning it. A queued
// functional kernel (no out= overload) then computes its results where the
// device already holds its outputs, and no copy follows (QueuedKernel.cpp).
// A temporary of that size may take a target first; the result then lands
// elsewhere and is copied, as without the guard.
class ResultPlacement {
 public:
  struct Target {
    void* memory;
    size_t bytes;
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

  // The allocator's side: the first open target of `bytes`, as a CPU
  // allocation; none when there is none, or when a storage from an earlier
  // kernel still refers to it (that kernel kept one: the target is skipped).
  std::optional<c10::DataPtr> serve(size_t bytes);

 private:
  c10::SmallVector<Target, 4> targets_;
  enum State : uint8_t { kOpen, kServed, kRefused };
  c10::SmallVector<State, 4> state_;
  ResultPlacement* previous_;
};

// True when the redirecting CPU allocator is installed (it is unless another
// library installed a CPU allocator with a higher priority).
bool allocationRedirectInstalled();

// True when `ptr` is a neuron caching-allocator block (e.g. a redirected
// allocation inside a CPU storage).
bool isDeviceDataPtr(const c10::DataPtr& ptr);

}  // namespace torchneuron
