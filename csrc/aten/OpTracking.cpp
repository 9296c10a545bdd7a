#include "aten/OpTracking.h"

#include <memory>
#include <mutex>
#include <unordered_map>

namespace torchneuron {
namespace {

std::atomic<bool> g_enabled{true};
std::mutex g_mutex;
// Never destroyed: counters are referenced from static locals.
std::unordered_map<std::string, std::unique_ptr<OpCounters>>& table() {
  static auto* t = new std::unordered_map<std::string, std::unique_ptr<OpCounters>>();
  return *t;
}

}  // namespace

const char* opPathName(OpPath path) {
  switch (path) {
    case OpPath::Native: return "native";
    case OpPath::Async: return "async";
    case OpPath::Fallback: return "fallback";
    case OpPath::Inline: return "inline";
  }
  return "unknown";
}

OpCounters* opCounters(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& slot = table()[op];
  if (!slot) slot = std::make_unique<OpCounters>();
  return slot.get();
}

bool opTrackingEnabled() { return g_enabled.load(std::memory_order_relaxed); }

void recordOp(const std::string& op, OpPath path) {
  if (!opTrackingEnabled()) return;
  recordOp(opCounters(op), path);
}

std::map<std::string, OpRecord> executedOps() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::map<std::string, OpRecord> out;
  for (const auto& [name, c] : table()) {
    OpRecord r;
    r.native = c->count[0].load();
    r.async = c->count[1].load();
    r.fallback = c->count[2].load();
    r.inlined = c->count[3].load();
    if (r.native + r.async + r.fallback + r.inlined > 0) out.emplace(name, r);
  }
  return out;
}

std::map<std::string, int64_t> resultCopies() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::map<std::string, int64_t> out;
  for (const auto& [name, c] : table())
    if (const int64_t n = c->resultCopies.load()) out.emplace(name, n);
  return out;
}

void clearOpTracking() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& [name, c] : table()) {
    for (auto& n : c->count) n.store(0);
    c->resultCopies.store(0);
  }
}

void setOpTrackingEnabled(bool enabled) { g_enabled.store(enabled); }

}  // namespace torchneuron
