// Collective: how one c10d operation on neuron tensors becomes device work.
//
// Each collective is two work items (kind nrtWorkCollective) on two streams
// the process group owns on the device:
//   start   on `start`, after everything queued so far on the caller's
//           current stream: hands the transport (Gloo) zero-copy CPU views
//           of the device tensors; the transport moves the data on its own
//           threads, so the item returns at once.
//   finish  on `finish`, after start: waits until the transport is done,
//           then runs the local step the transport cannot do (e.g. AVG's
//           division). The collective's end event follows it.
// The caller's stream goes on at once; NeuronWork::wait() makes the current
// stream wait for the end event. Starting and waiting on separate streams
// lets both ranks of a point-to-point pair (isend then irecv on each) start
// both transfers before either waits.
#pragma once

#include "core/Stream.h"
#include "distributed/NeuronWork.h"

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torchneuron::distributed {

struct CollectiveStreams {
  NeuronStream start;
  NeuronStream finish;
};

// One collective, as its Work and the tools see it.
struct Collective {
  const char* name;  // "c10d::allreduce": lives as long as the process
  c10d::OpType opType;
  int rank;
  c10::DeviceIndex device;
  std::vector<at::Tensor> reads;    // device tensors the collective reads
  std::vector<at::Tensor> writes;   // ... and writes (its outputs)
  std::vector<at::Tensor> scratch;  // device buffers the items use internally
  bool hostBlocking = false;        // barrier: wait() blocks the host
  int64_t root = -1;                // broadcast, reduce, gather, scatter: the root rank
  int64_t reduceOp = -1;            // reductions: the c10d ReduceOp
  bool onHost = false;              // CPU tensors, ordered after the group's queued work
};

// Runs on the executor: starts the transport's operation on CPU views.
using StartFn = std::function<c10::intrusive_ptr<c10d::Work>()>;
// Runs on the executor once the transport is done.
using FinishFn = std::function<void()>;

// Queues the collective and returns its work. Raises (nothing queued) if a
// stream operation fails on the host.
c10::intrusive_ptr<NeuronWork> launchCollective(const CollectiveStreams& streams, Collective c,
                                                StartFn start, FinishFn finish = {});

// A work that completes when all of `works` (queued in that order on
// `streams.finish`) have: the end of a coalesced group (none: done at once).
c10::intrusive_ptr<NeuronWork> joinWorks(const CollectiveStreams& streams, int rank,
                                         const std::vector<c10::intrusive_ptr<NeuronWork>>& works);

// A CPU tensor over a device tensor's memory (no ownership).
at::Tensor hostView(const at::Tensor& t);
std::vector<at::Tensor> hostViews(const std::vector<at::Tensor>& ts);

}  // namespace torchneuron::distributed
