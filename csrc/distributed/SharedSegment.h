// SharedSegment: one POSIX shared-memory segment that every rank of a group
// maps, when all of them run on this machine.
//
// Set-up is collective over the group's store: rank 0 creates the segment
// (named after its process and a random number, with its pages reserved up
// front so that a full /dev/shm fails here, not as a SIGBUS later), the
// others open it and check the number; every rank records its process ID and
// says whether it mapped the segment and can see every peer's process. The
// segment is used only if all say yes; otherwise every rank gets null and the
// caller goes through the transport. The name is unlinked once all have
// tried, so nothing outlives the processes.
//
// Waiting on a peer (waitFor) spins briefly, then yields, then sleeps in
// short steps; it raises when the peer does not arrive within the timeout,
// and at once (within 50 ms) when the peer's process has exited.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace torchneuron::distributed {

class SharedSegment {
 public:
  // Collective: every rank of the group calls it with the same `purpose`
  // (which also names the store keys) and `bytes`. Returns a segment on every
  // rank or null on every rank (also when TORCHNEURON_DIST_SHM=0 on some rank).
  static std::unique_ptr<SharedSegment> open(c10d::Store& store, const std::string& purpose,
                                             int rank, int size, size_t bytes);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  // The `bytes` the caller asked for, zeroed, page-aligned.
  void* data() const { return data_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Waits until `value` (in the segment, written by rank `peer`) reaches
  // `target`. Raises, naming `op` and the rank, on timeout or peer exit.
  void waitFor(const std::atomic<uint64_t>& value, uint64_t target, int peer, const char* op,
               std::chrono::milliseconds timeout) const;

 private:
  SharedSegment(void* base, size_t mapped, int rank, int size);
  int64_t pidOf(int rank) const;

  void* base_;
  size_t mapped_;
  void* data_;
  int rank_;
  int size_;
};

// False once process `pid` has exited (gone, or a zombie not yet reaped).
bool processAlive(int64_t pid);

}  // namespace torchneuron::distributed
