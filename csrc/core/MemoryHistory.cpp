// Stack gathering and the per-device trace ring (see MemoryHistory.h).
#include "core/MemoryHistory.h"

#include <torch/csrc/profiler/combined_traceback.h>

#include <algorithm>
#include <chrono>

namespace torchneuron {
namespace detail {
std::atomic<bool> g_history_enabled{false};
}  // namespace detail

namespace {
// Read on every gather while history is on; relaxed is enough: a gather that
// races with reconfiguration records under the old or the new settings.
std::atomic<uint8_t> g_context{static_cast<uint8_t>(RecordContext::kNever)};
std::atomic<bool> g_cpp_stacks{false};
std::atomic<bool (*)()> g_python_probe{nullptr};
}  // namespace

void setPythonStackProbe(bool (*mayGatherPython)()) { g_python_probe.store(mayGatherPython); }

void setHistoryContext(const HistorySettings& settings) {
  const RecordContext when = settings.enabled ? settings.context : RecordContext::kNever;
  if (settings.enabled && settings.cppStacks) {
    // The first unwind loads and indexes the unwind tables; do it now rather
    // than inside the first recorded allocation.
    torch::unwind::unwind();
  }
  g_cpp_stacks.store(settings.cppStacks, std::memory_order_relaxed);
  g_context.store(static_cast<uint8_t>(when), std::memory_order_relaxed);
  detail::g_history_enabled.store(settings.enabled, std::memory_order_relaxed);
}

std::shared_ptr<c10::GatheredContext> gatherContext(RecordContext when) {
  if (g_context.load(std::memory_order_relaxed) < static_cast<uint8_t>(when)) return nullptr;
  bool (*probe)() = g_python_probe.load(std::memory_order_relaxed);
  const bool python = probe != nullptr && probe();
  return torch::CapturedTraceback::gather(python, /*script=*/true,
                                          g_cpp_stacks.load(std::memory_order_relaxed));
}

int64_t traceTimeUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void DeviceTrace::configure(const HistorySettings& settings) {
  recording_ = settings.enabled && settings.trace;
  entryStacks_ = settings.context >= RecordContext::kAlloc;
  skipActions_ = settings.skipActions;
  maxEntries_ = std::max<size_t>(1, settings.maxEntries);
  // Like CUDA: turning history off, or asking for a clear, forgets the trace.
  if (!recording_ || settings.clear) {
    ring_.clear();
    next_ = 0;
  } else if (next_ != 0 || ring_.size() > maxEntries_) {
    // Lay the ring out oldest first, keeping the newest maxEntries_ entries.
    std::vector<TraceEntry> kept = entries();
    if (kept.size() > maxEntries_) {
      kept.erase(kept.begin(), kept.end() - static_cast<std::ptrdiff_t>(maxEntries_));
    }
    ring_ = std::move(kept);
    next_ = 0;
  }
}

void DeviceTrace::record(TraceEntry::Action action, uintptr_t addr, size_t size, uint64_t stream,
                         std::shared_ptr<c10::GatheredContext> context) {
  if (!recording_ || (skipActions_ >> action & 1u) != 0) return;
  if (!entryStacks_) context.reset();
  TraceEntry entry{action, addr, size, stream, traceTimeUs(), std::move(context)};
  if (ring_.size() < maxEntries_) {
    ring_.push_back(std::move(entry));
    return;
  }
  ring_[next_] = std::move(entry);
  next_ = (next_ + 1) % maxEntries_;
}

std::vector<TraceEntry> DeviceTrace::entries() const {
  std::vector<TraceEntry> out;
  out.reserve(ring_.size());
  // Once the ring is full, next_ is its oldest entry.
  for (size_t i = 0; i < ring_.size(); ++i) out.push_back(ring_[(next_ + i) % ring_.size()]);
  return out;
}

}  // namespace torchneuron
