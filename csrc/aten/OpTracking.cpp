#include "aten/OpTracking.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace torchneuron {
namespace {

std::atomic<bool> g_enabled{true};
std::mutex g_mutex;
std::unordered_map<std::string, OpRecord>& table() {
  static auto* t = new std::unordered_map<std::string, OpRecord>();
  return *t;
}

}  // namespace

const char* opPathName(OpPath path) {
  switch (path) {
    case OpPath::Native: return "native";
    case OpPath::Async: return "async";
    case OpPath::Fallback: return "fallback";
    case OpPath::GenericAsync: return "fallback_async";
  }
  return "unknown";
}

void recordOp(const std::string& op, OpPath path) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& rec = table()[op];
  switch (path) {
    case OpPath::Native: ++rec.native; break;
    case OpPath::Async: ++rec.async; break;
    case OpPath::Fallback: ++rec.fallback; break;
    case OpPath::GenericAsync: ++rec.fallback_async; break;
  }
}

void recordOp(const char* op, OpPath path) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  recordOp(std::string(op), path);
}

std::map<std::string, OpRecord> executedOps() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return std::map<std::string, OpRecord>(table().begin(), table().end());
}

void clearOpTracking() {
  std::lock_guard<std::mutex> lock(g_mutex);
  table().clear();
}

void setOpTrackingEnabled(bool enabled) { g_enabled.store(enabled); }
bool opTrackingEnabled() { return g_enabled.load(); }

}  // namespace torchneuron
