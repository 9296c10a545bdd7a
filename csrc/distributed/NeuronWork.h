// NeuronWork: the c10d::Work of a collective on neuron tensors.
//
// As NCCL's work: the collective is queued device work, and waiting for it
// is a stream operation. wait() and synchronize() make the caller's current
// stream wait for the collective's end event; the host does not block (a
// barrier is the exception: its wait() blocks the host, as NCCL's does).
// getFuture() is completed when the collective is queued, with CUDA's
// future semantics: its value is the output tensors, and waiting for it
// makes the current stream wait.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue_inl.h>
#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <exception>
#include <functional>
#include <utility>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torchneuron::distributed {

// What the queued items of one collective share with its Work: the
// transport's own work (set when the transfer starts) and the failure, if
// any (set on the executor; read by the host).
struct CollectiveState {
  std::mutex mu;
  c10::intrusive_ptr<c10d::Work> transport;
  std::exception_ptr error;

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = std::move(e);
  }
  std::exception_ptr failure() {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
};

class NeuronWork : public c10d::Work {
 public:
  // `end` has been recorded after the collective's last item; `future` is
  // already completed (or null for operations without outputs).
  NeuronWork(int rank, c10d::OpType type, const char* name, c10::Device device,
             std::vector<at::Tensor> outputs, std::vector<std::shared_ptr<CollectiveState>> states,
             c10::Event end, c10::intrusive_ptr<c10::ivalue::Future> future, bool hostBlocking);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void blockCurrentStream() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // Launch-blocking mode only (Collective.cpp): a point-to-point transfer's
  // finish item is queued when the work is first waited for (or dropped),
  // not at launch, where it would block the host before the peer could post
  // its matching transfer. `queue` queues it and hands back the end event
  // and the completed future.
  using QueueFinish =
      std::function<std::pair<c10::Event, c10::intrusive_ptr<c10::ivalue::Future>>()>;
  void deferFinish(QueueFinish queue) { pending_ = std::move(queue); }
  // Queues a deferred finish item now (no-op otherwise).
  void flushPending();
  ~NeuronWork() override;

  const char* name() const { return name_; }
  c10::Device device() const { return device_; }
  bool hostBlocking() const { return hostBlocking_; }
  const std::vector<std::shared_ptr<CollectiveState>>& states() const { return states_; }

 private:
  // Raises the first failure the collective's items reported so far.
  void raiseIfFailed() const;

  const char* name_;
  c10::Device device_;
  std::vector<at::Tensor> outputs_;
  std::vector<std::shared_ptr<CollectiveState>> states_;
  c10::Event end_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool hostBlocking_;
  QueueFinish pending_;
};

}  // namespace torchneuron::distributed
