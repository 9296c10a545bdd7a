// SerialCompute.cpp — see SerialCompute.h.
#include "core/SerialCompute.h"

#include "core/Config.h"

#include <omp.h>

#include <atomic>
#include <chrono>

// MKL's per-thread count (ComputeThreads.cpp says why weak).
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));

namespace torchneuron {
namespace {

std::atomic<bool>& enabledFlag() {
  static std::atomic<bool> on{backendConfig().serial_kernels};
  return on;
}

std::atomic<uint64_t> gRun{0};

// The reference count of this thread's active outermost scope (0: none).
thread_local int tReference = 0;
// Scopes made active on this thread, scopes declined because its team was
// hot, and until when its team may be hot.
thread_local uint64_t tScopes = 0;
thread_local uint64_t tHotDeclines = 0;
thread_local int64_t tHotUntil = 0;

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool serialKernelsEnabled() { return enabledFlag().load(std::memory_order_relaxed); }
void setSerialKernelsEnabled(bool on) { enabledFlag().store(on); }
uint64_t serialKernelsRun() { return gRun.load(std::memory_order_relaxed); }

int serialReference() { return tReference; }

SerialScope::SerialScope(bool want, Kind kind) {
  if (tReference != 0) {  // inside an active scope: already on one thread
    active_ = true;
    return;
  }
  // Inside a parallel region the kernel runs on its thread alone anyway.
  if (!want || omp_in_parallel()) return;
  if (kind == Kind::kKernel && tHotUntil != 0 && nowNs() < tHotUntil) {
    ++tHotDeclines;
    return;
  }
  const int threads = omp_get_max_threads();
  if (threads <= 1) return;
  if (MKL_Set_Num_Threads_Local != nullptr) {
    savedMkl_ = MKL_Set_Num_Threads_Local(1);  // returns the thread's previous own count
    if (savedMkl_ != 0) {  // a count of its own: nested products would fork (header)
      MKL_Set_Num_Threads_Local(savedMkl_);
      return;
    }
  }
  omp_set_num_threads(1);
  tReference = threads;
  active_ = outermost_ = true;
  ++tScopes;
  if (kind == Kind::kKernel) gRun.fetch_add(1, std::memory_order_relaxed);
}

SerialScope::~SerialScope() {
  if (!outermost_) return;
  omp_set_num_threads(tReference);
  tReference = 0;
  if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(savedMkl_);
}

TeamWatch::TeamWatch() : start_(nowNs()), scopes_(tScopes), declines_(tHotDeclines) {}

TeamWatch::~TeamWatch() {
  if (tScopes != scopes_ || tReference != 0) return;  // it ran on one thread
  // It ran on every thread only because the team was hot: it does not
  // extend that (else one long item would keep every later kernel parallel).
  if (tHotDeclines != declines_) return;
  const int64_t end = nowNs();
  if (end - start_ >= kLongItemNs) tHotUntil = end + kHotTeamNs;
}

}  // namespace torchneuron
