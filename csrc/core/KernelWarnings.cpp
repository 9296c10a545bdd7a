// KernelWarnings.cpp — see KernelWarnings.h.
#include "core/KernelWarnings.h"

#include <atomic>
#include <mutex>
#include <string>
#include <utility>

namespace torchneuron {
namespace {

struct Stash {
  std::mutex mu;
  std::vector<c10::Warning> warnings;
};
Stash& stash() {
  static auto* s = new Stash();  // never destroyed: kernels may warn at exit
  return *s;
}
std::atomic<bool> gPending{false};
// Bounds what an unsynchronized loop of warning kernels can hold.
constexpr size_t kMaxStashed = 1024;

thread_local bool tInQueuedWork = false;

}  // namespace

bool inQueuedWork() { return tInQueuedWork; }
void setInQueuedWork(bool on) { tInQueuedWork = on; }

void stashKernelWarnings(const char* name, std::vector<c10::Warning>&& warnings) {
  Stash& s = stash();
  std::lock_guard<std::mutex> lk(s.mu);
  for (auto& w : warnings) {
    if (s.warnings.size() >= kMaxStashed) break;
    s.warnings.emplace_back(w.type(), w.source_location(),
                            std::string(w.msg()) + " (raised by the queued kernel '" + name +
                                "'; kernels run asynchronously, so it is reported at a later "
                                "call; NEURON_LAUNCH_BLOCKING=1 reports it at the op)",
                            /*verbatim=*/true);
  }
  gPending.store(true, std::memory_order_release);
}

void flushKernelWarnings() {
  if (!gPending.load(std::memory_order_relaxed) || tInQueuedWork) return;
  std::vector<c10::Warning> out;
  {
    Stash& s = stash();
    std::lock_guard<std::mutex> lk(s.mu);
    out.swap(s.warnings);
    gPending.store(false, std::memory_order_relaxed);
  }
  for (const auto& w : out) c10::warn(w);
}

}  // namespace torchneuron
