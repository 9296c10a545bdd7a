#include "distributed/AgreementBoard.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>

namespace torchneuron::distributed {

// The segment: one area per rank, each on its own cache lines so that a
// rank's writes do not disturb the lines its peers poll.
struct alignas(64) AgreementBoard::Slot {
  std::atomic<uint64_t> seq;  // the check these values belong to (0: none yet)
  uint32_t count;
  int64_t values[kMaxValues];
};
struct alignas(64) AgreementBoard::Area {
  Slot slots[2];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the board needs lock-free atomics");

std::unique_ptr<AgreementBoard> AgreementBoard::open(c10d::Store& store, int rank, int size) {
  auto segment = SharedSegment::open(store, "agreement", rank, size,
                                     sizeof(Area) * static_cast<size_t>(size));
  if (!segment) return nullptr;
  return std::unique_ptr<AgreementBoard>(new AgreementBoard(std::move(segment)));
}

AgreementBoard::AgreementBoard(std::unique_ptr<SharedSegment> segment)
    : segment_(std::move(segment)) {}

AgreementBoard::~AgreementBoard() = default;

AgreementBoard::Area* AgreementBoard::area(int rank) const {
  return static_cast<Area*>(segment_->data()) + rank;
}

void AgreementBoard::exchange(const char* op, const std::vector<int64_t>& mine,
                              std::vector<int64_t>& hi, std::vector<int64_t>& lo,
                              std::chrono::milliseconds timeout) {
  const size_t n = mine.size();
  TORCH_CHECK(n <= kMaxValues, "AgreementBoard: a signature of ", n, " values (at most ",
              kMaxValues, ")");
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t seq = ++seq_;
  auto& slot = area(segment_->rank())->slots[seq & 1];
  slot.count = static_cast<uint32_t>(n);
  std::copy(mine.begin(), mine.end(), slot.values);
  slot.seq.store(seq, std::memory_order_release);
  hi = mine;
  lo = mine;
  for (int peer = 0; peer < segment_->size(); ++peer) {
    if (peer == segment_->rank()) continue;
    const auto& theirs = area(peer)->slots[seq & 1];
    segment_->waitFor(theirs.seq, seq, peer, op, timeout);
    // Different operations may carry different counts; the operation (the
    // first value) then differs anyway.
    const size_t common = std::min<size_t>(n, theirs.count);
    for (size_t i = 0; i < common; ++i) {
      hi[i] = std::max(hi[i], theirs.values[i]);
      lo[i] = std::min(lo[i], theirs.values[i]);
    }
  }
}

}  // namespace torchneuron::distributed
