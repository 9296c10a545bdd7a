// Kernels run on one thread where that computes what the reference thread
// count computes ("serial-equivalent kernels").
//
// Why: a device kernel splits its work over the compute threads (OpenMP),
// and every parallel region wakes the executor's OpenMP team. On a machine
// with few cores the woken team takes the core the host thread needs to
// issue the next ops, so a step of small kernels overlaps almost nothing:
// the tiny Llama ran 1.42-1.49x CPU eager with NEURON_RT_COMPUTE_THREADS=1
// and about 1.0x with the default 2 threads on a 2-core VM. But one thread
// is not the default because a kernel's bits may depend on its thread count
// (MKL splits long inner dimensions, two-pass reductions keep per-thread
// partial sums, a vectorized loop's tail moves with a chunk boundary).
//
// So a kernel runs on one thread only where its result provably equals its
// result on the reference count R (the count applyComputeThreads gave the
// executing thread), and only while small (kSerialWork):
// - the device's own passes (fusion passes, loop steps): they split work
//   with referenceParallelFor, which inside a SerialScope runs R's chunks
//   one after another with the thread ids and the nesting at::parallel_for
//   gives them; the same calls on the same ranges, so the same bits;
// - ATen kernels whose result does not depend on the split (independent
//   rows or heads, each computed whole by one thread): SerialKernels.h lists
//   them with the conditions that make that true;
// - BLAS products: MKL's split depends on the geometry and the count, not on
//   the values, so each geometry is tried once on R threads and on one with
//   random operands, and only those with equal bits run serially (Gemm.cpp).
//
// Inside a scope OpenMP's count and MKL's own count on the executing thread
// are 1: a kernel opens no parallel region and the team sleeps. Only while
// the team is asleep, though: after a kernel that computed on every thread
// (the demo GPT's large products) the team's threads spin, waiting for the
// next region, and a small kernel then runs faster on them than beside
// them (GPT: 0.89x CPU eager with every small kernel serial, 1.01x without,
// same runs). So a scope also declines within kHotTeamNs of the end of a
// work item of at least kLongItemNs that ran outside one (TeamWatch): a
// choice by timing, which is safe because either choice gives the same bits. A scope does
// nothing where the thread computes on one thread anyway, and it declines
// where MKL has a count of its own on the thread (set by
// torch.set_num_threads on a launching thread): the reference's nested
// products would then fork MKL threads of their own, which one thread
// cannot reproduce.
//
// TORCHNEURON_SERIAL_KERNELS=0 (or _C._set_serial_kernels_enabled(False))
// turns it off; _C._serial_kernels_run() counts the kernels that ran in a
// scope (tests: that a path is really taken).
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/ParallelGuard.h>

#include <algorithm>
#include <cstdint>

namespace torchneuron {

// Work (element operations, or multiply-adds for products) up to which a
// kernel may run on one thread. The tiny Llama's largest product is 2^23
// multiply-adds (256x256x128, about 0.2 ms on one thread); its optimizer
// pass about 2^22 element operations. The demo GPT's products (2^27 and
// more) stay on every thread.
constexpr int64_t kSerialWork = int64_t(1) << 24;
// Work under which no kernel here splits anyway (ATen splits from GRAIN_SIZE
// = 32768 elements; MKL does not thread a product of a few thousand
// multiply-adds): a scope there would only add its cost (four thread-count
// writes, about a third of an 8x8 product's device time).
constexpr int64_t kSerialMinWork = int64_t(1) << 15;

bool serialKernelsEnabled();
void setSerialKernelsEnabled(bool on);
uint64_t serialKernelsRun();

// Runs the executing thread's kernels on one thread for its lifetime, when
// `want` and the policy above allow (active()). Nests: an inner scope keeps
// the outer one's reference count.
class SerialScope {
 public:
  enum class Kind {
    kKernel,  // a kernel: counted, and declined while the team is hot
    kTrial,   // a calibration's trial run (SerialGemm.h): neither
  };
  explicit SerialScope(bool want, Kind kind = Kind::kKernel);
  ~SerialScope();
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;
  bool active() const { return active_; }

 private:
  bool active_ = false;
  bool outermost_ = false;
  int savedMkl_ = 0;
};

// Around a work item on an executor thread: notes, when it ran outside any
// scope and lasted kLongItemNs or more, that the thread's OpenMP team may be
// spinning now (see above); not when a scope in it declined only because
// the team was hot already.
class TeamWatch {
 public:
  TeamWatch();
  ~TeamWatch();
  TeamWatch(const TeamWatch&) = delete;
  TeamWatch& operator=(const TeamWatch&) = delete;

 private:
  int64_t start_;
  uint64_t scopes_;
  uint64_t declines_;
};
constexpr int64_t kLongItemNs = 200'000;
constexpr int64_t kHotTeamNs = 1'000'000;

// Whether a kernel of `work` units is small enough for a scope, large
// enough to split at all, and the switch is on (the scope itself checks the
// thread's counts).
inline bool serialWorthy(int64_t work) {
  return work >= kSerialMinWork && work <= kSerialWork && serialKernelsEnabled();
}

// The reference count inside an active scope on this thread; 0 outside one.
int serialReference();

// The elements each thread of a team of `threads` gets from
// at::parallel_for over `n` elements with `grain` (the split of
// at::internal::invoke_parallel); `n` when it does not split.
inline int64_t parallelForChunk(int64_t n, int64_t grain, int64_t threads) {
  if (n <= grain || n <= 1 || threads <= 1) return n;
  const int64_t used = grain > 0 ? std::min(threads, (n + grain - 1) / grain) : threads;
  return (n + used - 1) / used;
}

// at::parallel_for, except inside an active SerialScope, where R's chunks
// (R the scope's reference count) run one after another on this thread,
// each with the thread id and the ParallelGuard that at::parallel_for gives
// it: what each chunk computes is what it computes on R threads.
template <class F>
void referenceParallelFor(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const int64_t threads = serialReference();
  if (threads == 0) return at::parallel_for(begin, end, grain, f);
  if (begin >= end) return;
  const int64_t n = end - begin;
  if (!(n > grain && n > 1 && !at::in_parallel_region() && threads > 1)) {
    at::internal::ThreadIdGuard tid(0);
    c10::ParallelGuard guard(true);
    f(begin, end);
    return;
  }
  const int64_t chunk = parallelForChunk(n, grain, threads);
  for (int64_t t = 0, lo = begin; lo < end; ++t, lo += chunk) {
    at::internal::ThreadIdGuard tid(static_cast<int>(t));
    c10::ParallelGuard guard(true);
    f(lo, std::min(end, lo + chunk));
  }
}

}  // namespace torchneuron
