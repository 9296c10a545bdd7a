// Enqueueing host closures as kernels on a neuron stream.
#pragma once

#include "core/ClosureReturn.h"
#include "core/ComputeThreads.h"
#include "core/KernelWarnings.h"
#include "core/Runtime.h"
#include "core/SerialCompute.h"
#include "core/Stream.h"

#include <c10/util/Exception.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <exception>
#include <type_traits>
#include <memory>
#include <utility>
#include <vector>

namespace torchneuron {

namespace detail {

// Collects the warnings a work item raises on the executor (KernelWarnings.h).
struct CollectWarnings : c10::WarningHandler {
  std::vector<c10::Warning> warnings;
  void process(const c10::Warning& w) override { warnings.push_back(w); }
};

template <class F>
struct Closure : DeadClosure {
  // Built straight from the caller's lambda: one move of its captures (a
  // temporary in between cost a second move of every captured operand).
  template <class G>
  explicit Closure(G&& f) : fn(std::forward<G>(f)) {
    destroy = [](DeadClosure* self) { delete static_cast<Closure*>(self); };
  }
  static void* operator new(size_t bytes) { return ClosureMemory::allocate(bytes); }
  static void operator delete(void* p, size_t bytes) { ClosureMemory::release(p, bytes); }
  F fn;
};
// ClosureMemory's blocks have operator new's default alignment.

template <class F>
nrtStatus runClosure(void* args) {
  static_assert(alignof(Closure<F>) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__,
                "an over-aligned closure needs its own allocation");
  auto* closure = *static_cast<Closure<F>**>(args);
  applyComputeThreads();
  nrtStatus status = NRT_SUCCESS;
  CollectWarnings collected;
  c10::WarningUtils::WarningHandlerGuard warningGuard(&collected);
  const bool outer = inQueuedWork();
  setInQueuedWork(true);
  try {
    TeamWatch watch;  // (SerialCompute.h)
    closure->fn();
  } catch (const c10::Error& e) {
    nrtKernelSetError(e.what_without_backtrace());
    status = NRT_ERROR_KERNEL_FAILED;
  } catch (const std::exception& e) {
    nrtKernelSetError(e.what());
    status = NRT_ERROR_KERNEL_FAILED;
  } catch (...) {
    nrtKernelSetError("unknown exception");
    status = NRT_ERROR_KERNEL_FAILED;
  }
  setInQueuedWork(outer);
  if (!collected.warnings.empty()) stashKernelWarnings(closure->name, std::move(collected.warnings));
  buryClosure(closure);
  return status;
}
}  // namespace detail

// What a queued work item is, for tools (profiler, tracking) and, later,
// fusion: its name, kind, the bytes it moves and the device buffers it
// reads and writes. Buffers are optional; a copy names its two.
struct WorkDesc {
  const char* name = "<unnamed kernel>";
  nrtWorkKind kind = nrtWorkKernel;
  uint64_t bytes = 0;
  c10::SmallVector<nrtBufferRange, 4> reads;
  c10::SmallVector<nrtBufferRange, 4> writes;
  nrtFuser* fuser = nullptr;  // set by launchFusible (Fusion.h)
};

// The device bytes a strided tensor spans (negative strides included).
inline nrtBufferRange bufferSpan(const void* data, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                                 size_t elementSize) {
  int64_t lo = 0, hi = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return {data, 0};
    const int64_t extent = (sizes[d] - 1) * strides[d];
    (extent < 0 ? lo : hi) += extent;
  }
  const char* base = static_cast<const char*>(data) + lo * static_cast<int64_t>(elementSize);
  return {base, static_cast<size_t>(hi - lo + 1) * elementSize};
}

// Whether two byte ranges share a byte (an empty range shares none).
inline bool rangesOverlap(const nrtBufferRange& a, const nrtBufferRange& b) {
  const char* pa = static_cast<const char*>(a.ptr);
  const char* pb = static_cast<const char*>(b.ptr);
  return a.bytes != 0 && b.bytes != 0 && pa < pb + b.bytes && pb < pa + a.bytes;
}

// Queues `fn` on `stream` as one work item; it runs on the device executor
// in stream order. The closure must not own device memory (tensors): the
// caching allocator's stream-ordered reuse keeps the memory valid; it must
// capture raw pointers and metadata only. `work.name` must live as long as
// the process (a literal, an op's interned name): warnings the work raises
// are reported under it later. The closure is moved to the heap once (no std::function wrapper): launches are on every op's path.
template <class F>
void launchWork(const NeuronStream& stream, const WorkDesc& work, F&& fn) {
  using Fn = std::decay_t<F>;
  detail::freeDeadClosures();
  noteLaunchComputeThreads();
  flushKernelWarnings();  // what earlier work raised, at the latest host call
  auto* heap = new detail::Closure<Fn>(std::forward<F>(fn));
  heap->name = work.name;
  nrtWorkDesc desc{};
  desc.name = work.name;
  desc.kind = work.kind;
  desc.bytes = work.bytes;
  desc.reads = work.reads.data();
  desc.numReads = work.reads.size();
  desc.writes = work.writes.data();
  desc.numWrites = work.writes.size();
  desc.fuser = work.fuser;
  desc.nameLasts = 1;  // work.name lives as long as the process (above)
  const nrtStatus st = nrtLaunchWork(stream.handle(), &desc, &detail::runClosure<Fn>, &heap,
                                     sizeof(heap), nullptr);
  if (st != NRT_SUCCESS && st != NRT_ERROR_KERNEL_FAILED) {
    // Not queued: we still own the closure.
    delete heap;
  }
  // With NEURON_LAUNCH_BLOCKING=1 the work ran already: its warnings come at the op.
  flushKernelWarnings();
  if (st != NRT_SUCCESS) {
    throwRuntimeError(st, "nrtLaunchWork", __FILE__, __LINE__);
  }
}

// An op's kernel, named after the op.
template <class F>
void launchOnStream(const NeuronStream& stream, const char* name, F&& fn) {
  WorkDesc work;
  work.name = name;
  launchWork(stream, work, std::forward<F>(fn));
}

}  // namespace torchneuron
