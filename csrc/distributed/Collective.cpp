#include "distributed/Collective.h"

#include "aten/Common.h"
#include "aten/Launch.h"
#include "aten/OpTracking.h"
#include "core/DeviceAllocator.h"

#include <ATen/core/jit_type.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

namespace torchneuron::distributed {
namespace {

// Work item names live as long as the process (Launch.h).
const char* internName(const std::string& name) {
  static std::mutex mu;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mu);
  return names.insert(name).first->c_str();
}

WorkDesc describe(const char* name, const Collective& c) {
  WorkDesc work;
  work.name = name;
  work.kind = nrtWorkCollective;
  auto add = [&](const std::vector<at::Tensor>& ts, c10::SmallVector<nrtBufferRange, 4>& out) {
    for (const auto& t : ts) {
      const size_t bytes = t.numel() * t.element_size();
      work.bytes += bytes;
      if (out.size() < NRT_MAX_RECORDED_BUFFERS) {
        out.push_back(bufferSpan(t.data_ptr(), t.sizes(), t.strides(), t.element_size()));
      }
    }
  };
  add(c.reads, work.reads);
  add(c.writes, work.writes);
  return work;
}

// A collective's failure: names the collective and the rank; the Work
// raises it (NeuronWork::wait).
std::string recordFailure(const Collective& c, const char* stage, const std::string& what,
                          CollectiveState& state) {
  std::string msg = c10::str(c.name, " on neuron:", static_cast<int>(c.device), " (rank ", c.rank,
                             ") failed while ", stage, ": ", what);
  state.fail(std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, __LINE__}, msg)));
  return msg;
}

// The failure as the finish item's kernel failure too: the stream reports it
// (once) at the next synchronizing call, as a device error would be. Every
// failure of a collective surfaces on the finish stream, before its end
// event, so that waiting for that event claims it (NeuronWork::synchronize).
[[noreturn]] void raiseFailure(const Collective& c, const char* stage, const std::string& what,
                               CollectiveState& state) {
  TORCH_CHECK(false, recordFailure(c, stage, what, state));
}

std::string describeException(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& err) {
    return err.what_without_backtrace();
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Whether launches run on the calling thread (NEURON_LAUNCH_BLOCKING=1),
// probed once with an empty work item, so that the runtime's reading of its
// setting stays the only one. Queued work never runs on the launching
// thread: an item that has not run yet, or ran elsewhere, means queued.
bool launchesRunInline() {
  static const bool inlineRuns = [] {
    auto ranHere = std::make_shared<std::atomic<int>>(0);  // 0: not yet, 1: here, 2: elsewhere
    const auto caller = std::this_thread::get_id();
    launchOnStream(getCurrentStream(), "c10d::launch_mode_probe", [ranHere, caller] {
      ranHere->store(std::this_thread::get_id() == caller ? 1 : 2);
    });
    return ranHere->load() == 1;
  }();
  return inlineRuns;
}

// The end event of what is queued on `finish` so far, and a future of
// `outputs` completed now, CUDA-style: its events are on the finish stream,
// so waiting for the future makes the waiter's stream wait, not the host.
std::pair<c10::Event, c10::intrusive_ptr<c10::ivalue::Future>> endOnFinish(
    const NeuronStream& finish, const std::vector<at::Tensor>& outputs) {
  c10::Event end(kNeuron);
  end.record(finish.unwrap());
  auto future = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{finish.device()});
  {
    c10::StreamGuard guard(finish.unwrap());
    future->markCompleted(c10::IValue(outputs));
  }
  return {std::move(end), std::move(future)};
}

}  // namespace

at::Tensor hostView(const at::Tensor& t) { return cpuAlias(t); }

std::vector<at::Tensor> hostViews(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(cpuAlias(t));
  return out;
}

c10::intrusive_ptr<NeuronWork> launchCollective(const CollectiveStreams& streams, Collective c,
                                                StartFn start, FinishFn finish) {
  auto state = std::make_shared<CollectiveState>();
  const c10::Device device(kNeuron, c.device);
  const char* startName = internName(std::string(c.name) + "/start");

  // The start item follows everything queued so far on the caller's stream
  // (a CPU-tensor call needs no device work, only the start stream's order).
  if (!c.onHost) {
    c10::Event ready(kNeuron);
    ready.record(getCurrentStream(c.device).unwrap());
    ready.block(streams.start.unwrap());
  }

  auto info = std::make_shared<const Collective>(Collective{
      c.name, c.opType, c.rank, c.device, {}, {}, {}, c.hostBlocking, c.root, c.reduceOp,
      c.onHost});
  launchWork(streams.start, describe(startName, c), [state, info, start = std::move(start)] {
    try {
      auto w = start();
      std::lock_guard<std::mutex> lock(state->mu);
      state->transport = std::move(w);
    } catch (...) {
      // Reported by the finish item, on the finish stream (raiseFailure).
      recordFailure(*info, "starting", describeException(std::current_exception()), *state);
    }
  });

  const CollectiveStreams s = streams;
  auto queueFinish = [s, state, info, writes = c.writes, finish = std::move(finish),
                      tensors = std::vector<std::vector<at::Tensor>>{c.reads, c.writes, c.scratch},
                      desc = describe(c.name, c)]() mutable {
    c10::Event started(kNeuron);
    started.record(s.start.unwrap());
    started.block(s.finish.unwrap());
    launchWork(s.finish, desc, [state, info, finish = std::move(finish)] {
      c10::intrusive_ptr<c10d::Work> transport;
      {
        std::lock_guard<std::mutex> lock(state->mu);
        transport = state->transport;
      }
      if (!transport) {  // the start item failed: its failure is this item's
        auto failure = state->failure();
        TORCH_CHECK(failure == nullptr, describeException(failure));
        return;
      }
      try {
        transport->wait();
        if (finish) finish();
      } catch (...) {
        raiseFailure(*info, "transferring", describeException(std::current_exception()), *state);
      }
    });
    // The caching allocator must not hand the tensors' memory to anyone
    // else before the finish item has run (the caller may drop them at once).
    auto* allocator = getDeviceAllocator();
    for (const auto& group : tensors) {
      for (const auto& t : group) {
        if (t.defined() && t.device().type() == kNeuron && t.storage().data_ptr().get()) {
          allocator->recordStream(t.storage().data_ptr(), s.finish.unwrap());
        }
      }
    }
    tensors.clear();
    return endOnFinish(s.finish, writes);
  };
  recordOp(opCounters(c.name), OpPath::Async);

  const bool pointToPoint = c.opType == c10d::OpType::SEND || c.opType == c10d::OpType::RECV ||
                            c.opType == c10d::OpType::RECVANYSOURCE;
  if (pointToPoint && launchesRunInline()) {
    // The start item has run already (posted the transfer); waiting for it
    // now would block this thread before the peer posts its side.
    auto work = c10::make_intrusive<NeuronWork>(
        c.rank, c.opType, c.name, device, std::move(c.writes),
        std::vector<std::shared_ptr<CollectiveState>>{state}, c10::Event(kNeuron), nullptr,
        c.hostBlocking);
    work->deferFinish(std::move(queueFinish));
    return work;
  }
  auto [end, future] = queueFinish();
  return c10::make_intrusive<NeuronWork>(c.rank, c.opType, c.name, device, std::move(c.writes),
                                         std::vector<std::shared_ptr<CollectiveState>>{state},
                                         std::move(end), std::move(future), c.hostBlocking);
}

c10::intrusive_ptr<NeuronWork> joinWorks(const CollectiveStreams& streams, int rank,
                                         const std::vector<c10::intrusive_ptr<NeuronWork>>& works) {
  const c10::Device device = streams.finish.device();
  std::vector<at::Tensor> outputs;
  std::vector<std::shared_ptr<CollectiveState>> states;
  bool hostBlocking = false;
  for (const auto& w : works) {
    hostBlocking = hostBlocking || w->hostBlocking();
    w->flushPending();
    for (auto& t : w->result()) outputs.push_back(t);
    for (const auto& s : w->states()) states.push_back(s);
  }
  // Items on one finish stream complete in order: the end of the last one is
  // the end of all.
  auto [end, future] = endOnFinish(streams.finish, outputs);
  return c10::make_intrusive<NeuronWork>(rank, c10d::OpType::COALESCED, "c10d::coalesced", device,
                                         std::move(outputs), std::move(states), std::move(end),
                                         std::move(future), hostBlocking);
}

}  // namespace torchneuron::distributed
