// SharedMemoryTransport: the data of a collective through shared memory,
// for a group whose processes all run on this machine.
//
// Gloo between processes on one machine still goes through TCP on loopback:
// every byte is copied into a socket and out of it, by the kernel, and the
// ranks wait on each other through system calls. Here each rank instead
// owns two staging buffers in one segment that every rank maps
// (SharedSegment.h). A collective is a series of steps, one per chunk of at
// most kChunkBytes: a rank copies its part of the chunk into its buffer,
// publishes the step number, waits until its peers have published theirs,
// and computes its result straight from their buffers into its own
// (host-addressable) device memory. Two buffers per rank let a rank fill
// step N+1 while its peers still read step N; a rank overwrites a buffer
// only after every peer has said it finished reading that buffer's previous
// step.
//
// Results equal Gloo's bit for bit: copies (broadcast, all-gather) trivially;
// reductions where the order of operands cannot change a bit: integer
// reductions (wrapping sums and products, min, max, bitwise ops) for any
// group size, and floating-point SUM and PRODUCT for two ranks (one
// commutative operation per element). Floating-point reductions over more
// ranks, floating-point MIN/MAX (Gloo's std::min treats NaN by operand
// order) and bool reductions stay on Gloo, as does everything else.
//
// Every rank must run the same collectives with the same sizes in the same
// order (the agreement check makes sure of it unless TORCHNEURON_DIST_CHECK=0).
// A wait that times out or finds a peer's process gone raises, naming the
// collective; the group's steps are then out of step across ranks, so every
// later collective through this transport raises at once (as NCCL's
// communicator is aborted after an error).
#pragma once

#include "distributed/SharedSegment.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

namespace torchneuron::distributed {

class SharedMemoryTransport {
 public:
  static constexpr size_t kChunkBytes = size_t{1} << 20;

  // Collective over the group's store (SharedSegment::open); null on every
  // rank when the group cannot use shared memory.
  static std::unique_ptr<SharedMemoryTransport> open(c10d::Store& store, int rank, int size);
  ~SharedMemoryTransport();

  // Collectives this rank has carried (for tools and tests: what really ran here).
  uint64_t carried() const { return carried_.load(std::memory_order_relaxed); }

  // Whether reducing with `op` over `dtype` here gives Gloo's bits.
  bool reducesLikeTransport(c10d::ReduceOp::RedOpType op, at::ScalarType dtype) const;

  // The operations, on CPU views of device memory (contiguous). Each returns
  // when this rank's results are in place; they run on the executor.
  // allreduce: in place, tensor by tensor.
  void allreduce(const char* name, const std::vector<at::Tensor>& tensors,
                 c10d::ReduceOp::RedOpType op, std::chrono::milliseconds timeout);
  // broadcast: root's tensors into everyone's.
  void broadcast(const char* name, const std::vector<at::Tensor>& tensors, int root,
                 std::chrono::milliseconds timeout);
  // allgather: rank r's `input` into `outputs[r]` on every rank.
  void allgather(const char* name, const at::Tensor& input, const std::vector<at::Tensor>& outputs,
                 std::chrono::milliseconds timeout);
  // reduce-scatter: the reduction of every rank's `inputs[r]` into rank r's `output`.
  void reduceScatter(const char* name, const std::vector<at::Tensor>& inputs,
                     const at::Tensor& output, c10d::ReduceOp::RedOpType op,
                     std::chrono::milliseconds timeout);

 private:
  struct Control;
  explicit SharedMemoryTransport(std::unique_ptr<SharedSegment> segment);
  Control& control(int rank) const;
  char* buffer(int rank, uint64_t step) const;
  // One step: `fill` writes this rank's buffer (null: nothing to publish),
  // then, once the ranks in `from` (all if empty: -1) have published,
  // `consume` reads theirs. Raises (and breaks the transport) on a failed wait.
  template <class Fill, class Consume>
  void step(const char* name, int from, std::chrono::milliseconds timeout, Fill&& fill,
            Consume&& consume);
  void checkUsable(const char* name) const;

  std::unique_ptr<SharedSegment> segment_;
  std::mutex mu_;       // one collective at a time per rank
  uint64_t steps_ = 0;  // steps this rank has begun
  bool broken_ = false;
  std::atomic<uint64_t> carried_{0};
};

}  // namespace torchneuron::distributed
