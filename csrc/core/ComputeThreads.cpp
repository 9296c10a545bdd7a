// ComputeThreads.cpp — see ComputeThreads.h.
#include "core/ComputeThreads.h"
#include "core/ClosureReturn.h"

#include "core/Runtime.h"

#include <ATen/Parallel.h>
#include <neuron/runtime.h>
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
// Whether device work has run on this thread (an executor worker, or the
// launching thread under NEURON_LAUNCH_BLOCKING=1).
thread_local bool tRunsWork = false;

// Frees the calling thread's idle OpenMP team (its worker threads exit);
// OpenMP starts a new one at the thread's next parallel region. Does
// nothing inside a parallel region or when the thread has no team (a few
// nanoseconds).
//
// Why: libgomp's workers wait for their next region by spinning, which is
// what makes back-to-back small regions cheap, but only while the threads
// of all live teams fit the cores; past that, every team's workers sleep
// at once and each region pays OS wake-ups. Measured on 2 cores: a
// thread's 2-way regions 10 us apart cost 16 us while it is the only team
// and 81-87 us while another thread holds an idle one; `x * 2` on 128K
// floats on neuron ran 56-75 us per op behind the host thread's idle CPU
// team and 11-14 us without it. The host thread's team (left by CPU ops)
// and an idle device's team (which slowed the user's later CPU ops the
// same way) are the ones released.
void releaseTeam() { omp_pause_resource(omp_pause_soft, omp_get_initial_device()); }

// What a worker gives up before it sleeps: its OpenMP team (above) and the
// closures it ran since its last hand-back (ClosureReturn.h).
void onWorkerIdle() {
  releaseTeam();
  detail::handBackClosures();
}

}  // namespace

void noteLaunchComputeThreads() {
  static const bool hooked = (nrtSetWorkerIdleHook(&onWorkerIdle), true);
  (void)hooked;
  tLaunches = true;
  // The device computes now: the launching thread's idle team would slow
  // it (above). Not where work runs inline: that team is the device's.
  if (!tRunsWork) releaseTeam();
  const int configured = configuredThreads();
  const int n = configured > 0 ? configured : omp_get_max_threads();
  if (gWanted.load(std::memory_order_relaxed) != n) gWanted.store(n, std::memory_order_relaxed);
}

void applyComputeThreads() {
  tRunsWork = true;
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
