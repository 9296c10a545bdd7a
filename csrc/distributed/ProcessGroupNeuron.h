// ProcessGroupNeuron: the c10d backend of the neuron device ("neuron").
//
// Transport: PyTorch's own Gloo process group, created by the Python layer
// on the same store and handed in. Collectives on neuron tensors give Gloo
// zero-copy CPU views of device memory (the software chip's memory is
// host-addressable; a chip whose memory is not would stage through pinned
// host buffers here) and run as device work in stream order (Collective.h).
// CPU tensors go to Gloo directly, so "neuron" alone serves both devices.
//
// Between processes on one machine the data of the common collectives
// (all-reduce, broadcast, all-gather, reduce-scatter) goes through shared
// memory instead (SharedMemoryTransport.h), wherever the result is Gloo's bit
// for bit; the rest, and groups spanning machines, go through Gloo.
//
// What Gloo cannot reduce is done on the device around it: ReduceOp.AVG is
// SUM then a division by the group size, PREMUL_SUM scales each input by its
// factor before a SUM (as NCCL defines it).
#pragma once

#include "distributed/AgreementBoard.h"
#include "distributed/Collective.h"
#include "distributed/SharedMemoryTransport.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace torchneuron::distributed {

class ProcessGroupNeuron : public c10d::Backend {
 public:
  // `store` is the group's (the transport's own); through it the ranks set up
  // their shared-memory agreement board when all run on this machine.
  ProcessGroupNeuron(c10::intrusive_ptr<c10d::Backend> transport, int rank, int size,
                     const c10::intrusive_ptr<c10d::Store>& store,
                     std::chrono::milliseconds timeout);

  const std::string getBackendName() const override { return "neuron"; }
  bool supportsCoalescing() const override { return true; }
  void setTimeout(std::chrono::milliseconds timeout) override {
    transport_->setTimeout(timeout);
    timeout_.store(timeout.count());
  }
  const c10::intrusive_ptr<c10d::Backend>& transport() const { return transport_; }
  // How the ranks check their arguments agree: "shared memory", "transport" or "off".
  std::string agreementPath() const;
  // How collectives' data moves between the ranks: "shared memory" (where it
  // can, else Gloo) or "transport" (always Gloo).
  std::string dataPath() const { return shm_ ? "shared memory" : "transport"; }
  // Collectives whose data went through shared memory so far.
  uint64_t sharedMemoryCollectives() const { return shm_ ? shm_->carried() : 0; }

  // split_group (and DeviceMesh, which splits when it can): the transport
  // splits, and the part this rank is in gets a neuron backend of its own.
  bool supportsSplitting() const override { return transport_->supportsSplitting(); }
  c10::intrusive_ptr<Options> getBackendOptions() override {
    return transport_->getBackendOptions();
  }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override {
    transport_->monitoredBarrier(opts, waitAllRanks);  // a host-side debugging barrier
  }

  // TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper fingerprints each collective
  // with this number, which must be the same on every rank: the collectives
  // called on this group so far (point-to-point excluded: only the pair
  // takes part), counted when called, not when the device runs them.
  uint64_t getSequenceNumberForGroup() override { return calls_.load(); }
  void setSequenceNumberForGroup() override {}  // numbers start at 0 on every rank

  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

 private:
  // The two streams collectives of this group use on `device` (made once).
  const CollectiveStreams& streamsFor(c10::DeviceIndex device);
  c10::intrusive_ptr<c10d::Work> launch(Collective c, StartFn start, FinishFn finish = {});
  // A CPU-tensor call: handed to the transport, in order with this group's
  // queued device collectives.
  c10::intrusive_ptr<c10d::Work> onHost(const char* name, StartFn call);
  // The shared-memory transport, if it may carry a collective with these
  // tensors (dense, row-major) reduced with `op` (nullopt: a copy).
  std::shared_ptr<SharedMemoryTransport> shmFor(
      const std::vector<at::Tensor>& tensors,
      std::optional<c10d::ReduceOp::RedOpType> op = std::nullopt) const;
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_.load()); }

  c10::intrusive_ptr<c10d::Backend> transport_;
  std::shared_ptr<AgreementBoard> board_;  // null: agree through the transport
  std::shared_ptr<SharedMemoryTransport> shm_;  // null: all data through the transport
  std::atomic<int64_t> timeout_;           // ms: the agreement's wait on a board
  std::atomic<uint64_t> calls_{0};         // getSequenceNumberForGroup
  std::mutex mu_;
  std::map<c10::DeviceIndex, CollectiveStreams> streams_;
  c10::DeviceIndex lastDevice_ = -1;  // of the latest collective: the barrier's device
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<NeuronWork>> coalesced_;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalescedOnHost_;  // CPU tensors' works
};

}  // namespace torchneuron::distributed
