#include "distributed/NeuronWork.h"

#include "core/HostWait.h"
#include "core/Stream.h"

#include <c10/util/Exception.h>

namespace torchneuron::distributed {

NeuronWork::NeuronWork(int rank, c10d::OpType type, const char* name, c10::Device device,
                       std::vector<at::Tensor> outputs,
                       std::vector<std::shared_ptr<CollectiveState>> states, c10::Event end,
                       c10::intrusive_ptr<c10::ivalue::Future> future, bool hostBlocking)
    : c10d::Work(rank, type, name),
      name_(name),
      device_(device),
      outputs_(std::move(outputs)),
      states_(std::move(states)),
      end_(std::move(end)),
      future_(std::move(future)),
      hostBlocking_(hostBlocking) {}

NeuronWork::~NeuronWork() {
  try {
    flushPending();
  } catch (...) {
    // A destructor cannot raise; the failure is the stream's to report.
  }
}

void NeuronWork::flushPending() {
  if (!pending_) return;
  auto queue = std::move(pending_);
  pending_ = nullptr;
  auto [end, future] = queue();
  end_ = std::move(end);
  future_ = std::move(future);
}

void NeuronWork::raiseIfFailed() const {
  for (const auto& s : states_) {
    if (auto e = s->failure()) std::rethrow_exception(e);
  }
}

bool NeuronWork::isCompleted() {
  flushPending();
  // A failed item still completes its stream position: the event reports it
  // reached (query raises nothing for a failure it did not cause).
  try {
    return end_.query();
  } catch (const c10::Error&) {
    return true;
  }
}

bool NeuronWork::isSuccess() const {
  for (const auto& s : states_) {
    if (s->failure()) return false;
  }
  return true;
}

std::exception_ptr NeuronWork::exception() const {
  for (const auto& s : states_) {
    if (auto e = s->failure()) return e;
  }
  return nullptr;
}

std::vector<at::Tensor> NeuronWork::result() { return outputs_; }

void NeuronWork::blockCurrentStream() {
  flushPending();
  end_.block(getCurrentStream(device_.index()).unwrap());
}

void NeuronWork::synchronize() {
  if (exception()) {
    // The failure is also the finish stream's kernel failure (Collective.cpp):
    // claim it there so that it is reported once, here, and not again at the
    // next synchronizing call. Should the stream have reported it already,
    // the Work still says it failed.
    noteHostWait(WaitCause::Synchronize, name_);
    end_.synchronize();
    raiseIfFailed();
  }
  blockCurrentStream();
}

bool NeuronWork::wait(std::chrono::milliseconds /*timeout*/) {
  flushPending();
  // The transport enforces the group's timeout on the executor: a collective
  // whose peer died fails there (and is raised here, or at the next
  // synchronizing call) instead of hanging.
  if (hostBlocking_) {
    noteHostWait(WaitCause::Synchronize, name_);
    try {
      end_.synchronize();
    } catch (const c10::Error&) {
      raiseIfFailed();
      throw;
    }
  }
  synchronize();
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> NeuronWork::getFuture() {
  flushPending();
  TORCH_CHECK(future_, name_, " has no future on neuron (it has no output tensors)");
  return future_;
}

}  // namespace torchneuron::distributed
