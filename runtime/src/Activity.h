// Activity.h — work identities and activity records: what tools (profiler,
// op tracking, later fusion) see of each queued device action.
//
// A launch takes a work id and, while recording is on, a heap record with its
// identity and queue time; the executor stamps start, end and status and
// hands it to the log. Recording off costs one relaxed load per launch.
#pragma once

#include <atomic>
#include <cstdint>

#include "neuron/runtime.h"

namespace nrt {

// The record of one work item while it is queued (nullptr when recording was
// off at launch).
struct WorkRecord;

namespace activity {

bool recording();
uint64_t nowNs();
uint64_t nextWorkId();
uint64_t currentCorrelation();

// A record for a work item being launched now, or nullptr when recording is off.
nrtActivityRecord* begin(const nrtWorkDesc& desc, uint64_t workId, nrtStream_t stream, int device);
// Fills in the run and keeps the record (takes ownership).
void finish(nrtActivityRecord* rec, uint64_t startNs, uint64_t endNs, nrtStatus status);
// Drops a record whose work never ran.
void discard(nrtActivityRecord* rec);

}  // namespace activity
}  // namespace nrt
