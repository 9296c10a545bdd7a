#include "distributed/ProcessGroupNeuron.h"

#include "aten/Common.h"
#include "core/Config.h"
#include "distributed/Agreement.h"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <cstring>
#include <initializer_list>
#include <utility>

namespace torchneuron::distributed {
namespace {

using TensorList = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;
using c10d::OpType;
using c10d::ReduceOp;

// The dtypes Gloo reduces and moves (its type switch).
bool transportCarries(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kChar: case at::kByte: case at::kBool: case at::kInt: case at::kLong:
      return true;
    default:
      return false;
  }
}

void checkDeviceTensor(const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.layout() == at::kStrided, op, ": neuron collectives take dense (strided) tensors, got ",
              t.layout());
  TORCH_CHECK(t.is_contiguous(t.suggest_memory_format()), op,
              ": tensors must be contiguous (call .contiguous() first)");
  TORCH_CHECK(transportCarries(t.scalar_type()), op, ": ", t.scalar_type(),
              " tensors are not supported (the transport carries float, double, half, bfloat16, "
              "int8, uint8, bool, int32 and int64)");
}

// Where a call's tensors live: all on the host (std::nullopt: Gloo takes the
// call as it is) or all on one neuron device (checked for the transport).
std::optional<c10::DeviceIndex> placement(const char* op,
                                          std::initializer_list<const TensorList*> lists,
                                          std::initializer_list<const TensorLists*> nested = {}) {
  std::optional<c10::Device> seen;
  auto visit = [&](const at::Tensor& t) {
    TORCH_CHECK(t.defined(), op, ": got an undefined tensor");
    const c10::Device d = t.device();
    TORCH_CHECK(d.is_cpu() || d.type() == kNeuron, op,
                ": the neuron backend takes neuron or CPU tensors, got a tensor on ", d);
    if (!seen) seen = d;
    TORCH_CHECK(*seen == d, op, ": all tensors must be on the same device, got ", *seen, " and ",
                d);
    if (d.type() == kNeuron) checkDeviceTensor(op, t);
  };
  for (const auto* l : lists) for (const auto& t : *l) visit(t);
  for (const auto* n : nested) for (const auto& l : *n) for (const auto& t : l) visit(t);
  if (!seen || seen->is_cpu()) return std::nullopt;
  return seen->index();
}

TensorList flatten(const TensorLists& lists) {
  TensorList out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

TensorLists hostViews(const TensorLists& lists) {
  TensorLists out;
  out.reserve(lists.size());
  for (const auto& l : lists) out.push_back(distributed::hostViews(l));
  return out;
}

// A reduction as the transport runs it, and what the device adds around it.
struct ReducePlan {
  ReduceOp transportOp;
  int divideBy = 0;          // AVG: the result is divided by the group size
  bool premul = false;       // PREMUL_SUM: inputs are scaled by the factor first
  double factor = 1.0;
  at::Tensor factorView;     // the factor as a host view (or CPU tensor), if a tensor

  double premulFactor() const { return factorView.defined() ? factorView.item<double>() : factor; }
  // PREMUL_SUM where the inputs are the outputs (all-reduce, reduce): scale them in place.
  void scaleInPlace(const TensorList& views) const {
    if (!premul) return;
    const double f = premulFactor();
    for (const auto& v : views) v.mul_(f);
  }
};

ReducePlan planReduce(const char* op, const ReduceOp& reduceOp, at::ScalarType dtype, int size,
                      TensorList& keepAlive) {
  ReducePlan plan{reduceOp};
  switch (reduceOp.op_) {
    case ReduceOp::AVG:
      TORCH_CHECK(at::isFloatingType(dtype), op, ": ReduceOp.AVG needs floating point tensors, got ",
                  dtype);
      plan.transportOp = ReduceOp(ReduceOp::SUM);
      plan.divideBy = size;
      break;
    case ReduceOp::PREMUL_SUM: {
      TORCH_CHECK(at::isFloatingType(dtype), op,
                  ": ReduceOp.PREMUL_SUM needs floating point tensors, got ", dtype);
      auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(reduceOp.supplement_.get());
      TORCH_CHECK(s != nullptr, op, ": PREMUL_SUM without its factor");
      plan.transportOp = ReduceOp(ReduceOp::SUM);
      plan.premul = true;
      if (s->tensor_factor.defined()) {
        const auto& f = s->tensor_factor;
        keepAlive.push_back(f);
        plan.factorView = f.device().type() == kNeuron ? hostView(f) : f;
      } else {
        plan.factor = s->double_factor;
      }
      break;
    }
    case ReduceOp::BAND: case ReduceOp::BOR: case ReduceOp::BXOR:
      TORCH_CHECK(!at::isFloatingType(dtype) && !at::isComplexType(dtype), op,
                  ": bitwise reductions need integer or bool tensors, got ", dtype);
      break;
    case ReduceOp::SUM: case ReduceOp::PRODUCT: case ReduceOp::MIN: case ReduceOp::MAX:
      break;
    default:
      TORCH_CHECK(false, op, ": unsupported ReduceOp ", static_cast<int>(reduceOp.op_));
  }
  return plan;
}

at::ScalarType dtypeOf(const TensorList& ts) { return ts.empty() ? at::kFloat : ts[0].scalar_type(); }

void divideAll(const TensorList& views, int by) {
  if (by == 0) return;
  for (const auto& v : views) v.div_(by);
}

bool isPointToPoint(OpType op) {
  return op == OpType::SEND || op == OpType::RECV || op == OpType::RECVANYSOURCE;
}

// What the ranks must agree on before a collective starts (Agreement.h), or
// nothing for operations whose ranks legitimately differ or pair up.
std::optional<Signature> agreementSignature(const Collective& c) {
  if (c.onHost) return std::nullopt;  // CPU tensors: Gloo's own behaviour
  switch (c.opType) {
    case OpType::SEND: case OpType::RECV: case OpType::RECVANYSOURCE: case OpType::BARRIER:
      return std::nullopt;  // point to point, or no data
    case OpType::SCATTER:
      return signatureOf(static_cast<int>(c.opType), c.root, c.writes);  // only the root has inputs
    case OpType::ALLTOALL_BASE: case OpType::ALLTOALL: {
      // Ranks may send each other different amounts: only the dtype and count must agree.
      Signature s = signatureOf(static_cast<int>(c.opType), -1, {});
      s.values[2] = c.reads.empty() ? -1 : static_cast<int64_t>(c.reads.front().scalar_type());
      s.values[3] = static_cast<int64_t>(c.reads.size());
      return s;
    }
    default: {
      Signature s = signatureOf(static_cast<int>(c.opType), c.root, c.reads);
      s.add("reduce op", c.reduceOp);
      return s;
    }
  }
}

// The transport's work for an operation done in the start item already.
class DoneWork : public c10d::Work {
 public:
  DoneWork() : c10d::Work(-1, c10d::OpType::UNKNOWN) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
};

c10::intrusive_ptr<c10d::Work> done() { return c10::make_intrusive<DoneWork>(); }

// The bytes a dense tensor occupies.
std::pair<const char*, const char*> span(const at::Tensor& t) {
  const char* p = static_cast<const char*>(t.const_data_ptr());
  return {p, p + t.numel() * t.element_size()};
}

// Whether writing `out` chunk by chunk can clobber bytes of `in` not yet
// read: only an exact alias (in place) or disjoint memory is safe.
bool safeToStage(const at::Tensor& in, const at::Tensor& out) {
  const auto a = span(in), b = span(out);
  return a == b || a.second <= b.first || b.second <= a.first;
}

// An all-reduce's start item when shared memory carries it (in place, then
// the finish item's AVG division as on the transport path).
StartFn allreduceThroughShm(std::shared_ptr<SharedMemoryTransport> shm, TensorList views,
                            ReducePlan plan, std::chrono::milliseconds timeout, const char* name) {
  return [shm = std::move(shm), views = std::move(views), plan = std::move(plan), timeout, name] {
    plan.scaleInPlace(views);
    shm->allreduce(name, views, plan.transportOp.op_, timeout);
    return done();
  };
}

}  // namespace

ProcessGroupNeuron::ProcessGroupNeuron(c10::intrusive_ptr<c10d::Backend> transport, int rank,
                                       int size, const c10::intrusive_ptr<c10d::Store>& store,
                                       std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), transport_(std::move(transport)), timeout_(timeout.count()) {
  TORCH_CHECK(transport_, "ProcessGroupNeuron needs a transport process group");
  TORCH_CHECK(transport_->getRank() == rank && transport_->getSize() == size,
              "ProcessGroupNeuron: the transport is rank ", transport_->getRank(), " of ",
              transport_->getSize(), ", expected ", rank, " of ", size);
  if (backendConfig().dist_check && store) {
    board_ = AgreementBoard::open(*store, rank, size);
  }
  if (store) shm_ = SharedMemoryTransport::open(*store, rank, size);
}

std::shared_ptr<SharedMemoryTransport> ProcessGroupNeuron::shmFor(
    const std::vector<at::Tensor>& tensors, std::optional<c10d::ReduceOp::RedOpType> op) const {
  if (!shm_) return nullptr;
  for (const auto& t : tensors) {
    if (!t.is_contiguous()) return nullptr;  // channels_last and the like: Gloo's own handling
    if (op && !shm_->reducesLikeTransport(*op, t.scalar_type())) return nullptr;
  }
  return shm_;
}

std::string ProcessGroupNeuron::agreementPath() const {
  if (!backendConfig().dist_check) return "off";
  return board_ ? "shared memory" : "transport";
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupNeuron::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  auto part = transport_->split(store, ranks, opts);
  if (!part) return nullptr;  // this rank is in none of the parts
  const auto timeout = opts ? opts->timeout : std::chrono::milliseconds(timeout_.load());
  return c10::make_intrusive<ProcessGroupNeuron>(part, part->getRank(), part->getSize(), store,
                                                 timeout);
}

const CollectiveStreams& ProcessGroupNeuron::streamsFor(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(mu_);
  lastDevice_ = device;
  auto it = streams_.find(device);
  if (it == streams_.end()) {
    // High-priority pool streams, as NCCL takes: communication is latency bound.
    const int greatest = priorityRange(device).second;
    it = streams_
             .emplace(device, CollectiveStreams{getStreamFromPool(greatest, device),
                                                getStreamFromPool(greatest, device)})
             .first;
  }
  return it->second;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::launch(Collective c, StartFn start,
                                                          FinishFn finish) {
  c.rank = getRank();
  if (!c.onHost && !isPointToPoint(c.opType)) ++calls_;  // (onHost counted its own)
  if (backendConfig().dist_check) {
    if (auto sig = agreementSignature(c)) {
      start = [t = transport_, board = board_, timeout = std::chrono::milliseconds(timeout_.load()),
               name = c.name, sig = std::move(*sig), start = std::move(start)] {
        agree(*t, board.get(), timeout, name, sig);
        return start();
      };
    }
  }
  auto work = launchCollective(streamsFor(c.device), std::move(c), std::move(start),
                               std::move(finish));
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

namespace {
// The works of CPU-tensor calls made while coalescing: done when all are.
class HostWorks : public c10d::Work {
 public:
  explicit HostWorks(std::vector<c10::intrusive_ptr<c10d::Work>> works)
      : c10d::Work(-1, c10d::OpType::COALESCED), works_(std::move(works)) {}
  bool isCompleted() override {
    for (auto& w : works_) if (!w->isCompleted()) return false;
    return true;
  }
  bool isSuccess() const override {
    for (auto& w : works_) if (!w->isSuccess()) return false;
    return true;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    for (auto& w : works_) w->wait(timeout);
    return true;
  }
  void synchronize() override {
    for (auto& w : works_) w->synchronize();
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::onHost(const char* name, StartFn call) {
  // CPU calls are named "c10d::<op>/cpu"; send, recv and recvAnysource are pairs.
  if (std::strstr(name, "send") == nullptr && std::strstr(name, "recv") == nullptr) ++calls_;
  c10::DeviceIndex device = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!streams_.empty()) device = lastDevice_;
  }
  if (device < 0) {
    // No device collective was ever queued on this group: straight to Gloo.
    auto work = call();
    if (coalescing_ && work) coalescedOnHost_.push_back(work);
    return work;
  }
  // Device collectives of this group may still be queued: the CPU call must
  // reach the transport after them, as it does on every rank, so it is
  // queued behind them on the group's start stream; waiting for it blocks
  // the host (CPU tensors are ready when wait() returns).
  Collective c{name, OpType::UNKNOWN, 0, device, {}, {}};
  c.hostBlocking = true;
  c.onHost = true;
  return launch(std::move(c), std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  const auto device = placement("broadcast", {&tensors});
  if (!device) return onHost("c10d::broadcast/cpu", [=, t = transport_]() mutable { return t->broadcast(tensors, opts); });
  auto views = hostViews(tensors);
  Collective c{"c10d::broadcast", OpType::BROADCAST, 0, *device, tensors, tensors};
  c.root = opts.rootRank;
  if (auto shm = shmFor(tensors)) {
    return launch(std::move(c), [shm, views, root = static_cast<int>(opts.rootRank),
                                 timeout = timeout(), name = c.name] {
      shm->broadcast(name, views, root, timeout);
      return done();
    });
  }
  return launch(std::move(c),
                [t = transport_, views, opts]() mutable { return t->broadcast(views, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  const auto device = placement("allreduce", {&tensors});
  if (!device) return onHost("c10d::allreduce/cpu", [=, t = transport_]() mutable { return t->allreduce(tensors, opts); });
  Collective c{"c10d::allreduce", OpType::ALLREDUCE, 0, *device, tensors, tensors};
  const auto plan = planReduce("allreduce", opts.reduceOp, dtypeOf(tensors), getSize(), c.scratch);
  c.reduceOp = static_cast<int64_t>(opts.reduceOp.op_);
  auto views = hostViews(tensors);
  auto o = opts;
  o.reduceOp = plan.transportOp;
  StartFn start = [t = transport_, views, o, plan]() mutable {
    plan.scaleInPlace(views);
    return t->allreduce(views, o);
  };
  if (auto shm = shmFor(tensors, plan.transportOp.op_)) {
    start = allreduceThroughShm(std::move(shm), views, plan, timeout(), c.name);
  }
  return launch(std::move(c), std::move(start),
                [views, by = plan.divideBy] { divideAll(views, by); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const auto device = placement("allreduce_coalesced", {&tensors});
  if (!device) return onHost("c10d::allreduce_coalesced/cpu", [=, t = transport_]() mutable { return t->allreduce_coalesced(tensors, opts); });
  Collective c{"c10d::allreduce_coalesced", OpType::ALLREDUCE_COALESCED, 0, *device, tensors,
               tensors};
  const auto plan =
      planReduce("allreduce_coalesced", opts.reduceOp, dtypeOf(tensors), getSize(), c.scratch);
  c.reduceOp = static_cast<int64_t>(opts.reduceOp.op_);
  auto views = hostViews(tensors);
  auto o = opts;
  o.reduceOp = plan.transportOp;
  StartFn start = [t = transport_, views, o, plan]() mutable {
    plan.scaleInPlace(views);
    return t->allreduce_coalesced(views, o);
  };
  if (auto shm = shmFor(tensors, plan.transportOp.op_)) {
    start = allreduceThroughShm(std::move(shm), views, plan, timeout(), c.name);
  }
  return launch(std::move(c), std::move(start),
                [views, by = plan.divideBy] { divideAll(views, by); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  const auto device = placement("reduce", {&tensors});
  if (!device) return onHost("c10d::reduce/cpu", [=, t = transport_]() mutable { return t->reduce(tensors, opts); });
  Collective c{"c10d::reduce", OpType::REDUCE, 0, *device, tensors, tensors};
  c.root = opts.rootRank;
  const auto plan = planReduce("reduce", opts.reduceOp, dtypeOf(tensors), getSize(), c.scratch);
  c.reduceOp = static_cast<int64_t>(opts.reduceOp.op_);
  auto views = hostViews(tensors);
  auto o = opts;
  o.reduceOp = plan.transportOp;
  const bool root = opts.rootRank == getRank();
  return launch(
      std::move(c),
      [t = transport_, views, o, plan]() mutable {
        plan.scaleInPlace(views);
        return t->reduce(views, o);
      },
      [views, by = root ? plan.divideBy : 0] { divideAll(views, by); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const auto device = placement("allgather", {&inputs}, {&outputs});
  if (!device) return onHost("c10d::allgather/cpu", [=, t = transport_]() mutable { return t->allgather(outputs, inputs, opts); });
  auto in = hostViews(inputs);
  auto out = hostViews(outputs);
  Collective c{"c10d::allgather", OpType::ALLGATHER, 0, *device, inputs, flatten(outputs)};
  if (inputs.size() == 1 && outputs.size() == 1 &&
      static_cast<int>(outputs[0].size()) == getSize()) {
    bool shapesMatch = true;
    for (const auto& o : outputs[0]) {
      shapesMatch = shapesMatch && o.numel() == inputs[0].numel() &&
                    o.scalar_type() == inputs[0].scalar_type() && safeToStage(inputs[0], o);
    }
    auto shm = shapesMatch ? shmFor(flatten({inputs, outputs[0]})) : nullptr;
    if (shm) {
      return launch(std::move(c), [shm, in = in[0], out = out[0], timeout = timeout(),
                                   name = c.name] {
        shm->allgather(name, in, out, timeout);
        return done();
      });
    }
  }
  return launch(std::move(c),
                [t = transport_, in, out, opts]() mutable { return t->allgather(out, in, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  TensorList ins{input}, outs{output};
  const auto device = placement("all_gather_into_tensor", {&ins, &outs});
  if (!device) return onHost("c10d::_allgather_base/cpu", [=, t = transport_]() mutable { return t->_allgather_base(output, input, opts); });
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "all_gather_into_tensor: the output has ",
              output.numel(), " elements, expected the input's ", input.numel(), " times the group size ",
              getSize());
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "all_gather_into_tensor: output and input dtypes differ (", output.scalar_type(),
              " and ", input.scalar_type(), ")");
  auto in = hostView(input);
  auto out = hostView(output);
  if (auto shm = shmFor({input, output})) {
    // Rank r's part of the output; the input may be this rank's part (FSDP2 gathers in place).
    const auto parts = out.reshape({-1}).chunk(getSize());
    bool safe = static_cast<int>(parts.size()) == getSize();
    for (const auto& p : parts) safe = safe && safeToStage(in, p);
    if (safe) {
      return launch({"c10d::all_gather_into_tensor", OpType::_ALLGATHER_BASE, 0, *device, ins, outs},
                    [shm, in, parts, timeout = timeout()] {
                      shm->allgather("c10d::all_gather_into_tensor", in.reshape({-1}), parts,
                                     timeout);
                      return done();
                    });
    }
  }
  return launch({"c10d::all_gather_into_tensor", OpType::_ALLGATHER_BASE, 0, *device, ins, outs},
                [t = transport_, in, out, opts]() mutable {
                  return t->_allgather_base(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const auto device = placement("allgather_coalesced", {&inputs}, {&outputs});
  if (!device) return onHost("c10d::allgather_coalesced/cpu", [=, t = transport_]() mutable { return t->allgather_coalesced(outputs, inputs, opts); });
  auto in = hostViews(inputs);
  auto out = hostViews(outputs);
  return launch({"c10d::allgather_coalesced", OpType::ALLGATHER_COALESCED, 0, *device, inputs,
                 flatten(outputs)},
                [t = transport_, in, out, opts]() mutable {
                  return t->allgather_coalesced(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const auto device = placement("allgather_into_tensor_coalesced", {&inputs, &outputs});
  if (!device) return onHost("c10d::allgather_into_tensor_coalesced/cpu", [=, t = transport_]() mutable { return t->allgather_into_tensor_coalesced(outputs, inputs, opts); });
  auto in = hostViews(inputs);
  auto out = hostViews(outputs);
  return launch({"c10d::allgather_into_tensor_coalesced", OpType::COALESCED, 0, *device, inputs,
                 outputs},
                [t = transport_, in, out, opts]() mutable {
                  return t->allgather_into_tensor_coalesced(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const auto device = placement("gather", {&inputs}, {&outputs});
  if (!device) return onHost("c10d::gather/cpu", [=, t = transport_]() mutable { return t->gather(outputs, inputs, opts); });
  auto in = hostViews(inputs);
  auto out = hostViews(outputs);
  Collective c{"c10d::gather", OpType::GATHER, 0, *device, inputs, flatten(outputs)};
  c.root = opts.rootRank;
  return launch(std::move(c),
                [t = transport_, in, out, opts]() mutable { return t->gather(out, in, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const auto device = placement("scatter", {&outputs}, {&inputs});
  if (!device) return onHost("c10d::scatter/cpu", [=, t = transport_]() mutable { return t->scatter(outputs, inputs, opts); });
  auto in = hostViews(inputs);
  auto out = hostViews(outputs);
  Collective c{"c10d::scatter", OpType::SCATTER, 0, *device, flatten(inputs), outputs};
  c.root = opts.rootRank;
  return launch(std::move(c),
                [t = transport_, in, out, opts]() mutable { return t->scatter(out, in, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const auto device = placement("reduce_scatter", {&outputs}, {&inputs});
  if (!device) return onHost("c10d::reduce_scatter/cpu", [=, t = transport_]() mutable { return t->reduce_scatter(outputs, inputs, opts); });
  Collective c{"c10d::reduce_scatter", OpType::REDUCE_SCATTER, 0, *device, flatten(inputs), outputs};
  const auto plan = planReduce("reduce_scatter", opts.reduceOp, dtypeOf(outputs), getSize(), c.scratch);
  c.reduceOp = static_cast<int64_t>(opts.reduceOp.op_);
  // PREMUL_SUM scales copies: the inputs are not the caller's to change.
  TensorLists sources = inputs;
  if (plan.premul) {
    for (auto& l : sources) for (auto& t : l) { t = at::empty_like(t); c.scratch.push_back(t); }
  }
  auto in = hostViews(inputs);
  auto src = hostViews(sources);
  auto out = hostViews(outputs);
  auto o = opts;
  o.reduceOp = plan.transportOp;
  return launch(
      std::move(c),
      [t = transport_, in, src, out, o, plan]() mutable {
        if (plan.premul) {
          const double f = plan.premulFactor();
          for (const auto i : c10::irange(in.size()))
            for (const auto j : c10::irange(in[i].size())) at::mul_out(src[i][j], in[i][j], f);
        }
        return t->reduce_scatter(out, src, o);
      },
      [out, by = plan.divideBy] { divideAll(out, by); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  TensorList ins{input}, outs{output};
  const auto device = placement("reduce_scatter_tensor", {&ins, &outs});
  if (!device) return onHost("c10d::_reduce_scatter_base/cpu", [=, t = transport_]() mutable { return t->_reduce_scatter_base(output, input, opts); });
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "reduce_scatter_tensor: the input has ",
              input.numel(), " elements, expected the output's ", output.numel(),
              " times the group size ", getSize());
  Collective c{"c10d::reduce_scatter_tensor", OpType::_REDUCE_SCATTER_BASE, 0, *device, ins, outs};
  const auto plan =
      planReduce("reduce_scatter_tensor", opts.reduceOp, output.scalar_type(), getSize(), c.scratch);
  c.reduceOp = static_cast<int64_t>(opts.reduceOp.op_);
  at::Tensor source = input;
  if (plan.premul) {
    source = at::empty_like(input);
    c.scratch.push_back(source);
  }
  auto in = hostView(input);
  auto src = hostView(source);
  auto out = hostView(output);
  auto o = opts;
  o.reduceOp = plan.transportOp;
  StartFn start = [t = transport_, in, src, out, o, plan]() mutable {
    if (plan.premul) at::mul_out(src, in, plan.premulFactor());
    return t->_reduce_scatter_base(out, src, o);
  };
  if (auto shm = shmFor({input, output}, plan.transportOp.op_)) {
    // Rank r's part of the input; the output may be this rank's part (in place).
    const auto parts = src.reshape({-1}).chunk(getSize());
    bool safe = static_cast<int>(parts.size()) == getSize();
    for (const auto& p : parts) safe = safe && safeToStage(p, out);
    if (safe) {
      start = [shm, in, src, parts, out, op = plan.transportOp.op_, plan, timeout = timeout()]() mutable {
        if (plan.premul) at::mul_out(src, in, plan.premulFactor());
        shm->reduceScatter("c10d::reduce_scatter_tensor", parts, out.reshape({-1}), op, timeout);
        return done();
      };
    }
  }
  return launch(std::move(c), std::move(start),
                [out, by = plan.divideBy] { divideAll({out}, by); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const auto device = placement("reduce_scatter_tensor_coalesced", {&inputs, &outputs});
  if (!device) return onHost("c10d::reduce_scatter_tensor_coalesced/cpu", [=, t = transport_]() mutable { return t->reduce_scatter_tensor_coalesced(outputs, inputs, opts); });
  Collective c{"c10d::reduce_scatter_tensor_coalesced", OpType::COALESCED, 0, *device, inputs,
               outputs};
  const auto plan = planReduce("reduce_scatter_tensor_coalesced", opts.reduceOp, dtypeOf(outputs),
                               getSize(), c.scratch);
  c.reduceOp = static_cast<int64_t>(opts.reduceOp.op_);
  TensorList sources = inputs;
  if (plan.premul) {
    for (auto& t : sources) { t = at::empty_like(t); c.scratch.push_back(t); }
  }
  auto in = hostViews(inputs);
  auto src = hostViews(sources);
  auto out = hostViews(outputs);
  auto o = opts;
  o.reduceOp = plan.transportOp;
  return launch(
      std::move(c),
      [t = transport_, in, src, out, o, plan]() mutable {
        if (plan.premul) {
          const double f = plan.premulFactor();
          for (const auto i : c10::irange(in.size())) at::mul_out(src[i], in[i], f);
        }
        return t->reduce_scatter_tensor_coalesced(out, src, o);
      },
      [out, by = plan.divideBy] { divideAll(out, by); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
    std::vector<int64_t>& inputSplits, const c10d::AllToAllOptions& opts) {
  TensorList ins{input}, outs{output};
  const auto device = placement("all_to_all_single", {&ins, &outs});
  if (!device) return onHost("c10d::alltoall_base/cpu", [=, t = transport_]() mutable { return t->alltoall_base(output, input, outputSplits, inputSplits, opts); });
  auto in = hostView(input);
  auto out = hostView(output);
  return launch({"c10d::all_to_all_single", OpType::ALLTOALL_BASE, 0, *device, ins, outs},
                [t = transport_, in, out, outputSplits, inputSplits, opts]() mutable {
                  return t->alltoall_base(out, in, outputSplits, inputSplits, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  const auto device = placement("all_to_all", {&inputs, &outputs});
  if (!device) return onHost("c10d::alltoall/cpu", [=, t = transport_]() mutable { return t->alltoall(outputs, inputs, opts); });
  auto in = hostViews(inputs);
  auto out = hostViews(outputs);
  return launch({"c10d::all_to_all", OpType::ALLTOALL, 0, *device, inputs, outputs},
                [t = transport_, in, out, opts]() mutable { return t->alltoall(out, in, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::send(std::vector<at::Tensor>& tensors,
                                                        int dstRank, int tag) {
  const auto device = placement("send", {&tensors});
  if (!device) return onHost("c10d::send/cpu", [=, t = transport_]() mutable { return t->send(tensors, dstRank, tag); });
  auto views = hostViews(tensors);
  return launch({"c10d::send", OpType::SEND, 0, *device, tensors, {}},
                [t = transport_, views, dstRank, tag]() mutable {
                  return t->send(views, dstRank, tag);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::recv(std::vector<at::Tensor>& tensors,
                                                        int srcRank, int tag) {
  const auto device = placement("recv", {&tensors});
  if (!device) return onHost("c10d::recv/cpu", [=, t = transport_]() mutable { return t->recv(tensors, srcRank, tag); });
  auto views = hostViews(tensors);
  return launch({"c10d::recv", OpType::RECV, 0, *device, {}, tensors},
                [t = transport_, views, srcRank, tag]() mutable {
                  return t->recv(views, srcRank, tag);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                 int tag) {
  const auto device = placement("recv", {&tensors});
  if (!device) return onHost("c10d::recvAnysource/cpu", [=, t = transport_]() mutable { return t->recvAnysource(tensors, tag); });
  auto views = hostViews(tensors);
  return launch({"c10d::recv_anysource", OpType::RECVANYSOURCE, 0, *device, {}, tensors},
                [t = transport_, views, tag]() mutable { return t->recvAnysource(views, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::barrier(const c10d::BarrierOptions& opts) {
  // As NCCL's: the barrier is ordered after the work queued on the device
  // (the one named by device_ids, else the latest used, else the current
  // one), and waiting for it blocks the host.
  c10::DeviceIndex device = -1;
  if (!opts.device_ids.empty()) {
    device = static_cast<c10::DeviceIndex>(opts.device_ids.front());
  } else if (opts.device && opts.device->type() == kNeuron) {
    device = opts.device->index();
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    device = lastDevice_;
  }
  if (device < 0) device = currentDevice();
  Collective c{"c10d::barrier", OpType::BARRIER, 0, device, {}, {}};
  c.hostBlocking = true;
  return launch(std::move(c), [t = transport_, opts]() mutable {
    c10d::BarrierOptions o = opts;
    o.device_ids.clear();
    o.device.reset();
    return t->barrier(o);
  });
}

void ProcessGroupNeuron::startCoalescing() {
  TORCH_CHECK(!coalescing_, "startCoalescing: the neuron process group is already coalescing");
  coalescing_ = true;
  coalesced_.clear();
  coalescedOnHost_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::endCoalescing() {
  TORCH_CHECK(coalescing_, "endCoalescing without startCoalescing");
  coalescing_ = false;
  auto works = std::move(coalesced_);
  coalesced_.clear();
  auto onHostWorks = std::move(coalescedOnHost_);
  coalescedOnHost_.clear();
  if (works.empty() && !onHostWorks.empty()) {
    return c10::make_intrusive<HostWorks>(std::move(onHostWorks));
  }
  TORCH_CHECK(onHostWorks.empty(), "endCoalescing: a coalesced group mixes CPU and neuron tensors");
  const c10::DeviceIndex device = works.empty() ? currentDevice() : works.front()->device().index();
  return joinWorks(streamsFor(device), getRank(), works);
}

}  // namespace torchneuron::distributed
