// ComputeThreads.cpp — see ComputeThreads.h.
#include "core/ComputeThreads.h"

#include "core/Runtime.h"

#include <ATen/Parallel.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>

namespace torchneuron {
namespace {

// NEURON_RT_COMPUTE_THREADS as the runtime parsed it, or 0 when unset.
int configuredThreads() {
  static const int n = [] {
    if (std::getenv("NEURON_RT_COMPUTE_THREADS") == nullptr) return 0;
    return deviceProperties(0).computeThreads;
  }();
  return n;
}

std::atomic<int> gWanted{0};  // 0: nothing launched yet

// A thread that launches work is the user's: its count is torch's to set.
// (Under NEURON_LAUNCH_BLOCKING=1 the runtime runs work on the launching
// thread; the kernel then computes with that thread's own count, and
// applying would change torch.get_num_threads() behind the user's back.)
thread_local bool tLaunches = false;

}  // namespace

void noteLaunchComputeThreads() {
  tLaunches = true;
  const int configured = configuredThreads();
  const int n = configured > 0 ? configured : omp_get_max_threads();
  if (gWanted.load(std::memory_order_relaxed) != n) gWanted.store(n, std::memory_order_relaxed);
}

void applyComputeThreads() {
  thread_local int applied = 0;
  const int want = gWanted.load(std::memory_order_relaxed);
  if (want <= 0 || want == applied || tLaunches) return;
  // ATen sets a thread's count itself at its first parallel call on it
  // (at::internal::lazy_init_num_threads): made to happen first, so that it
  // cannot undo this one later.
  if (applied == 0) (void)at::get_num_threads();
  omp_set_num_threads(want);
  applied = want;
}

int currentComputeThreads() { return at::get_num_threads(); }

}  // namespace torchneuron
