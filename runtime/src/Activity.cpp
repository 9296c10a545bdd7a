// Activity.cpp — see Activity.h; the C API for work identities and records.
#include "Activity.h"

#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "Runtime.h"

namespace nrt {
namespace activity {
namespace {

// Apart: launches write the id counter, workers read the flag per item; on
// one cache line, each launch would take the line back from the worker.
alignas(64) std::atomic<bool> gRecording{false};
alignas(64) std::atomic<uint64_t> gNextWorkId{1};

// Finished records, oldest first. Never destroyed: workers may finish an item
// while the process exits.
struct Log {
  std::mutex mu;
  std::deque<nrtActivityRecord> records;
  uint64_t dropped = 0;
};
Log& log() {
  static Log* l = new Log();
  return *l;
}

std::vector<uint64_t>& correlationStack() {
  thread_local std::vector<uint64_t> stack;
  return stack;
}

void copyBuffers(nrtBufferRange* to, uint32_t* count, const nrtBufferRange* from, size_t n) {
  *count = static_cast<uint32_t>(n);
  for (size_t i = 0; i < n && i < NRT_MAX_RECORDED_BUFFERS; ++i) to[i] = from[i];
}

}  // namespace

bool recording() { return gRecording.load(std::memory_order_relaxed); }

uint64_t nowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

uint64_t nextWorkId() { return gNextWorkId.fetch_add(1, std::memory_order_relaxed); }

uint64_t currentCorrelation() {
  auto& s = correlationStack();
  return s.empty() ? 0 : s.back();
}

nrtActivityRecord* begin(const nrtWorkDesc& desc, uint64_t workId, nrtStream_t stream,
                         int device) {
  if (!recording()) return nullptr;
  auto* r = new nrtActivityRecord();
  r->workId = workId;
  r->correlationId = desc.correlationId ? desc.correlationId : currentCorrelation();
  r->stream = stream;
  r->device = device;
  r->kind = desc.kind;
  r->bytes = desc.bytes;
  r->queuedNs = nowNs();
  const char* name = desc.name ? desc.name : "<unnamed kernel>";
  std::strncpy(r->name, name, sizeof(r->name) - 1);
  copyBuffers(r->reads, &r->numReads, desc.reads, desc.numReads);
  copyBuffers(r->writes, &r->numWrites, desc.writes, desc.numWrites);
  return r;
}

void finish(nrtActivityRecord* rec, uint64_t startNs, uint64_t endNs, nrtStatus status) {
  rec->startNs = startNs;
  rec->endNs = endNs;
  rec->status = status;
  Log& l = log();
  {
    std::lock_guard<std::mutex> lk(l.mu);
    if (l.records.size() < NRT_ACTIVITY_CAPACITY) l.records.push_back(*rec);
    else ++l.dropped;
  }
  delete rec;
}

void discard(nrtActivityRecord* rec) { delete rec; }

}  // namespace activity
}  // namespace nrt

using namespace nrt;

extern "C" {

nrtStatus nrtPushCorrelationId(uint64_t id) {
  activity::correlationStack().push_back(id);
  return NRT_SUCCESS;
}

nrtStatus nrtPopCorrelationId(void) {
  auto& s = activity::correlationStack();
  if (s.empty()) return fail(NRT_ERROR_INVALID_VALUE, "nrtPopCorrelationId: the stack is empty");
  s.pop_back();
  return NRT_SUCCESS;
}

uint64_t nrtCurrentCorrelationId(void) { return activity::currentCorrelation(); }

nrtStatus nrtActivityEnable(int enable) {
  NRT_RUNTIME(rt);
  (void)rt;
  activity::gRecording.store(enable != 0);
  return NRT_SUCCESS;
}

nrtStatus nrtActivityDrain(nrtActivityRecord* out, size_t capacity, size_t* count,
                           uint64_t* dropped) {
  if (!count) return fail(NRT_ERROR_INVALID_VALUE, "nrtActivityDrain: count is NULL");
  if (!out && capacity) return fail(NRT_ERROR_INVALID_VALUE, "nrtActivityDrain: out is NULL");
  auto& l = activity::log();
  std::lock_guard<std::mutex> lk(l.mu);
  size_t n = 0;
  while (n < capacity && !l.records.empty()) {
    out[n++] = l.records.front();
    l.records.pop_front();
  }
  *count = n;
  if (dropped) *dropped = l.dropped;
  l.dropped = 0;
  return NRT_SUCCESS;
}

uint64_t nrtActivityTimestampNs(void) { return activity::nowNs(); }

}  // extern "C"
