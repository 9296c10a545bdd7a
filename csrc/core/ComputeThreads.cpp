// ComputeThreads.cpp — see ComputeThreads.h.
#include "core/ComputeThreads.h"
#include "core/ClosureReturn.h"

#include "core/Runtime.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <neuron/runtime.h>
#include <omp.h>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>

// MKL's per-thread thread count, which libtorch_cpu exports when torch is
// built with MKL (weak: a torch without MKL has none, and then no MKL kernels).
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));
extern "C" int MKL_Get_Max_Threads() __attribute__((weak));

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

// TORCHNEURON_COMPUTE_NICE (0 to 19; default 0): how much lower than the
// host's the scheduling priority of the device's threads is; -1 when the
// variable holds something else.
int parseComputeNice() {
  const char* env = std::getenv("TORCHNEURON_COMPUTE_NICE");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  return *end == '\0' && v >= 0 && v <= 19 ? static_cast<int>(v) : -1;
}
const int kComputeNice = parseComputeNice();

// Host side, at launches: a bad value is the launching op's error (the
// executor's threads then stay at the host's priority).
void checkComputeNice() {
  TORCH_CHECK(kComputeNice >= 0, "TORCHNEURON_COMPUTE_NICE=",
              std::getenv("TORCHNEURON_COMPUTE_NICE"),
              ": expected an integer from 0 to 19 (how much lower than the host's the device "
              "threads' scheduling priority is; 0: the same)");
}

// Lowers the calling executor worker's scheduling priority, once, when
// TORCHNEURON_COMPUTE_NICE asks for it. The threads of its OpenMP teams
// are created by it and inherit the value.
//
// Why off by default: a lower priority was meant to keep the device's
// threads (OpenMP team workers even when they only spin between regions)
// from taking half a core from the host's Python on shared cores, but on a
// machine with other work it starves them instead. A parallel region needs
// every team thread scheduled, and at nice 5 each gets about a quarter of
// a core beside one busy process. Tiny Llama, synchronized steps, 2-core
// VM, three alternating runs: quiet, nice 0 / 2 / 5 gave 10.8-12.6 /
// 11.3-14.3 / 9.2-14.3 ms against CPU eager's 9.6-11.3 (noise); beside one
// busy process 20.6-21.4 / 50.8-61.0 / 502-510 ms against CPU's 41-43;
// beside two, 47-214 / 56-70 / 138-147 against 51-63. Thread counts (and
// so results) do not depend on it.
void lowerPriorityOnce() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  const int nice = kComputeNice;
  if (nice <= 0) return;
  const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
  errno = 0;
  const int current = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  if (errno != 0) return;
  // Best effort: a failure leaves the thread at its priority.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), std::min(19, current + nice));
}

// MKL's count on an executor worker: `want`, and none of the worker's own
// where MKL's count follows the thread's OpenMP count without one (it does
// here). torch.set_num_threads gives the user's thread a count of its own
// (mkl_set_num_threads_local) and MKL then forks threads of its own even
// when called inside an OpenMP region, where without one it computes on
// the calling thread. CPU's flash attention calls sgemm inside its
// parallel_for: 16x4x64x32 causal attention took the device 522-546 us
// against CPU eager's 400 (no torch.set_num_threads) with a worker count of
// 2 on 2 cores, and 396-402 without one; after torch.set_num_threads(2)
// CPU eager's own takes 575-800. mm 1024x128 @ 128x512: 668-688 us either
// way, and 1310-1326 with 1 thread, so the worker's products do use `want`
// (also under NEURON_RT_COMPUTE_THREADS=2 after torch.set_num_threads(1):
// 668-754 us; 1320 us, as on 1 thread, where a worker made no MKL call).
void alignMklThreads(int want) {
  if (MKL_Set_Num_Threads_Local == nullptr || MKL_Get_Max_Threads == nullptr) return;
  MKL_Set_Num_Threads_Local(0);  // follow the thread's OpenMP count
  if (MKL_Get_Max_Threads() != want) MKL_Set_Num_Threads_Local(want);
}

}  // namespace

void noteLaunchComputeThreads() {
  static const bool hooked = (nrtSetWorkerIdleHook(&onWorkerIdle), true);
  (void)hooked;
  if (C10_UNLIKELY(kComputeNice < 0)) checkComputeNice();
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
  if (tLaunches) return;  // the user's thread (NEURON_LAUNCH_BLOCKING=1): left as it is
  lowerPriorityOnce();
  if (want <= 0 || want == applied) return;
  // ATen sets a thread's count itself at its first parallel call on it
  // (at::internal::lazy_init_num_threads): made to happen first, so that it
  // cannot undo this one later. That inline function's thread_local flag
  // exists once per library that inlines it: libtorch_cpu's (reached through
  // at::get_num_threads) and this library's own (its at::parallel_for calls:
  // fusion passes, loop steps), which would otherwise reset the count at
  // this thread's first parallel_for here.
  if (applied == 0) {
    (void)at::get_num_threads();
    at::internal::lazy_init_num_threads();
  }
  omp_set_num_threads(want);
  alignMklThreads(want);
  applied = want;
}

int currentComputeThreads() { return at::get_num_threads(); }

std::pair<int, int> currentMklThreads() {
  if (MKL_Set_Num_Threads_Local == nullptr || MKL_Get_Max_Threads == nullptr) return {-1, 0};
  const int own = MKL_Set_Num_Threads_Local(0);  // reading it takes a write
  MKL_Set_Num_Threads_Local(own);
  return {MKL_Get_Max_Threads(), own};
}

}  // namespace torchneuron
