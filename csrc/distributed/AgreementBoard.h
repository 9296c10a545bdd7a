// AgreementBoard: the ranks' agreement check (Agreement.h) through shared
// memory, for a group whose processes all run on one machine.
//
// Checking through the transport costs a network round trip per collective,
// which halves the throughput of small collectives. When every rank of the
// group can map one shared segment, each rank instead publishes its
// signature in its own slot of the segment and reads the others': a few
// cache lines, no system call on the fast path.
//
// Slots: each rank has two, used by alternating checks. A rank writes check
// N only after it has read every rank's check N-1, and each of those ranks
// wrote N-1 only after reading everyone's N-2, so no slot is rewritten while
// someone may still read it.
//
// A peer that never arrives makes the wait raise after the group's timeout;
// one whose process has exited makes it raise at once, naming the rank.
#pragma once

#include "distributed/SharedSegment.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torchneuron::distributed {

class AgreementBoard {
 public:
  static constexpr size_t kMaxValues = 8;

  // Collective over the group's store: every rank of the group calls it.
  // Returns a board on every rank, or null on every rank (the ranks are not
  // all on one machine, shared memory is unavailable, or
  // TORCHNEURON_DIST_SHM=0 on some rank): the caller then checks through
  // the transport.
  static std::unique_ptr<AgreementBoard> open(c10d::Store& store, int rank, int size);
  ~AgreementBoard();
  AgreementBoard(const AgreementBoard&) = delete;
  AgreementBoard& operator=(const AgreementBoard&) = delete;

  // Publishes this rank's values for the next check and gathers every
  // rank's: per value, the maximum and minimum across the group. Raises,
  // naming `op`, when a rank does not arrive within `timeout` or has exited.
  void exchange(const char* op, const std::vector<int64_t>& mine, std::vector<int64_t>& hi,
                std::vector<int64_t>& lo, std::chrono::milliseconds timeout);

 private:
  struct Slot;
  struct Area;
  explicit AgreementBoard(std::unique_ptr<SharedSegment> segment);
  Area* area(int rank) const;

  std::unique_ptr<SharedSegment> segment_;
  std::mutex mu_;     // one check at a time per rank
  uint64_t seq_ = 0;  // checks published by this rank
};

}  // namespace torchneuron::distributed
