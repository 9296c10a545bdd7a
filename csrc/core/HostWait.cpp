// HostWait.cpp — see HostWait.h.
#include "core/HostWait.h"

#include "core/KernelWarnings.h"

#include <c10/util/Exception.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <array>
#include <atomic>
#include <deque>
#include <mutex>

namespace torchneuron {
namespace {

constexpr size_t kMaxKept = 4096;  // records with stacks; counts are unbounded

struct Log {
  std::mutex mu;
  std::deque<HostWaitRecord> records;
  std::array<std::atomic<int64_t>, static_cast<size_t>(WaitCause::kCount)> counts{};
};
Log& log() {
  static Log* l = new Log();  // never destroyed: waits may happen at exit
  return *l;
}

std::atomic<int> gSyncDebugMode{0};

}  // namespace

const char* waitCauseName(WaitCause cause) {
  switch (cause) {
    case WaitCause::Synchronize: return "synchronize";
    case WaitCause::ScalarRead: return "scalar_read";
    case WaitCause::CopyToHost: return "copy_to_host";
    case WaitCause::CopyFromHost: return "copy_from_host";
    case WaitCause::DataDependent: return "data_dependent";
    case WaitCause::SyncPath: return "sync_path";
    case WaitCause::Verification: return "verification";
    case WaitCause::Allocator: return "allocator";
    case WaitCause::LaunchQueue: return "launch_queue";
    case WaitCause::Other:
    case WaitCause::kCount: break;
  }
  return "other";
}

void noteHostWait(WaitCause cause, const std::string& op, bool withStack) {
  // Warnings of work that finished before this wait (not under a lock: a
  // warning handler may take the GIL).
  if (withStack) flushKernelWarnings();
  Log& l = log();
  l.counts[static_cast<size_t>(cause)].fetch_add(1, std::memory_order_relaxed);
  const int mode = gSyncDebugMode.load(std::memory_order_relaxed);
  if (mode != 0 && cause != WaitCause::Synchronize && withStack) {
    // CUDA's wording, so users who know set_sync_debug_mode recognise it.
    if (mode == 2) {
      TORCH_CHECK(false, "called a synchronizing neuron operation (", op, ": ",
                  waitCauseName(cause), "); torch.neuron.set_sync_debug_mode('default') ",
                  "turns this error off");
    }
    TORCH_WARN("called a synchronizing neuron operation (", op, ": ", waitCauseName(cause), ")");
  }
  HostWaitRecord r{cause, op,
                   withStack ? torch::CapturedTraceback::gather(/*python=*/true,
                                                                /*script=*/false,
                                                                /*cpp=*/false)
                             : nullptr};
  std::lock_guard<std::mutex> lk(l.mu);
  if (l.records.size() >= kMaxKept) l.records.pop_front();
  l.records.push_back(std::move(r));
}

std::vector<HostWaitRecord> hostWaits() {
  Log& l = log();
  std::lock_guard<std::mutex> lk(l.mu);
  return {l.records.begin(), l.records.end()};
}

std::vector<int64_t> hostWaitCounts() {
  std::vector<int64_t> out;
  for (auto& c : log().counts) out.push_back(c.load());
  return out;
}

void clearHostWaits() {
  Log& l = log();
  std::lock_guard<std::mutex> lk(l.mu);
  l.records.clear();
  for (auto& c : l.counts) c.store(0);
}

void setSyncDebugMode(int mode) {
  TORCH_CHECK(mode >= 0 && mode <= 2, "sync debug mode must be 0 (default), 1 (warn) or 2 (error), got ",
              mode);
  gSyncDebugMode.store(mode);
}
int syncDebugMode() { return gSyncDebugMode.load(); }

}  // namespace torchneuron
