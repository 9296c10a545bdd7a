// The device timeline in torch.profiler: a Kineto activity profiler for
// PrivateUse1, registered through PyTorch's extension point
// (torch/csrc/profiler/standalone/privateuse1_profiler.h).
//
// Every device action is a runtime work item; while a session records, the
// executor times each one (nrtActivityEnable) and we turn the records into
// Kineto activities when the trace is processed:
//   - the work itself on a lane per stream: pid = neuron device index,
//     tid = the c10 stream id (0 = default stream), typed CONCURRENT_KERNEL,
//     GPU_MEMCPY or GPU_MEMSET so that torch counts it as PrivateUse1 device
//     time (kineto_shim's deviceTypeFromActivity);
//   - its launch on the host, a PRIVATEUSE1_RUNTIME point on the thread of
//     the CPU op that queued it, as cudaLaunchKernel is for CUDA.
// Both are linked to that CPU op, and a flow (ac2g) joins launch and work, so
// the exported Chrome trace draws arrows from the op to the work it queued
// and key_averages() credits each op with its device time.
//
// Correlation: PyTorch pushes a correlation id into Kineto around every op
// (and record_function scope) on the thread running it, the autograd engine's
// device threads included, and Kineto forwards it to each live session's
// push(User)CorrelationId. We push it
// onto the runtime's thread correlation stack, which stamps every work item
// the thread queues; processTrace resolves the id to the CPU op.
#include "core/Runtime.h"
#include "core/Stream.h"

#include <neuron/runtime.h>

#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <libkineto.h>
#include <output_base.h>

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace torchneuron {
namespace {

using libkineto::ActivityType;

// Trace viewers sort processes by this index: devices after the host process.
constexpr int64_t kDeviceSortBase = 1 << 24;

// The device-side activity type torch maps to PrivateUse1 for a work kind.
ActivityType deviceActivityType(nrtWorkKind kind) {
  switch (kind) {
    case nrtWorkCopy:
      return ActivityType::GPU_MEMCPY;
    case nrtWorkMemset:
      return ActivityType::GPU_MEMSET;
    default:
      return ActivityType::CONCURRENT_KERNEL;
  }
}

const char* kindName(nrtWorkKind kind) {
  switch (kind) {
    case nrtWorkKernel: return "kernel";
    case nrtWorkCopy: return "copy";
    case nrtWorkMemset: return "memset";
    case nrtWorkGraph: return "graph";
    case nrtWorkCollective: return "collective";
    case nrtWorkCustom: return "custom";
    case nrtWorkHost: return "host";
  }
  return "unknown";
}

// Moves every finished record out of the runtime; adds what the capacity
// bound lost to *dropped.
void drainAll(std::vector<nrtActivityRecord>* out, uint64_t* dropped) {
  constexpr size_t kChunk = 4096;
  for (;;) {
    const size_t old = out->size();
    out->resize(old + kChunk);
    size_t count = 0;
    uint64_t lost = 0;
    const nrtStatus st = nrtActivityDrain(out->data() + old, kChunk, &count, &lost);
    out->resize(old + (st == NRT_SUCCESS ? count : 0));
    *dropped += lost;
    if (st != NRT_SUCCESS || count < kChunk) return;
  }
}

class NeuronProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  explicit NeuronProfilerSession(const std::set<ActivityType>& types) : types_(types) {}

  ~NeuronProfilerSession() override {
    // A session torn down while recording (an aborted trace) must not leave
    // every later work item paying for timing.
    if (recording_) nrtActivityEnable(0);
  }

  void start() override {
    // Records left from before (items that finished after an earlier session
    // stopped) belong to no trace of ours.
    std::vector<nrtActivityRecord> stale;
    uint64_t lost = 0;
    drainAll(&stale, &lost);
    startNs_ = nrtActivityTimestampNs();
    setRecording(true);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    setRecording(false);
    stopNs_ = nrtActivityTimestampNs();
    drainAll(&records_, &dropped_);
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  void toggleCollectionDynamic(bool enable) override { setRecording(enable); }

  // Kineto calls these around every op on the thread running it, and the
  // user variants around record_function scopes. Both go on the one runtime
  // stack: scopes nest, so work is stamped with the innermost op, or with the
  // enclosing user scope when no op queued it (torch.neuron._sleep, say).
  void pushCorrelationId(uint64_t id) override { nrtPushCorrelationId(id); }
  void popCorrelationId() override { pop(); }
  void pushUserCorrelationId(uint64_t id) override { nrtPushCorrelationId(id); }
  void popUserCorrelationId() override { pop(); }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; },
                 static_cast<int64_t>(startNs_), static_cast<int64_t>(stopNs_));
  }

  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback getLinkedActivity, int64_t /*startTime*/,
                    int64_t /*endTime*/) override {
    // Items queued while recording may finish after stop(): take them too.
    drainAll(&records_, &dropped_);
    if (dropped_ > 0) {
      errors_.push_back(fmt::format(
          "neuron: {} device activity records were dropped (more than {} pending); the device "
          "timeline is incomplete",
          dropped_, NRT_ACTIVITY_CAPACITY));
    }
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(static_cast<int64_t>(startNs_),
                                         static_cast<int64_t>(stopNs_), "neuron");
    buffer_->gpuOpCount = 0;
    const bool wantRuntime = types_.count(ActivityType::PRIVATEUSE1_RUNTIME) > 0;

    for (const nrtActivityRecord& r : records_) {
      // Only work queued inside this session's window is ours.
      if (r.queuedNs < startNs_ || r.queuedNs > stopNs_) continue;
      const ActivityType type = deviceActivityType(r.kind);
      if (types_.count(type) == 0) continue;
      const c10::StreamId lane = streamIdOfHandle(r.stream);
      // Unknown streams (made through the runtime directly) get lanes of
      // their own past the backend's ids.
      const int64_t resource =
          lane >= 0 ? lane : static_cast<int64_t>(1u << 20) + static_cast<uint32_t>(r.stream);
      lanes_.insert({r.device, resource});

      const auto* cpuOp = r.correlationId != 0
                              ? getLinkedActivity(static_cast<int32_t>(r.correlationId))
                              : nullptr;
      // Flow ids are 32-bit and must not be 0 (0 means "no flow").
      const uint32_t flowId = static_cast<uint32_t>(r.workId) == 0
                                  ? 1u
                                  : static_cast<uint32_t>(r.workId);

      buffer_->emplace_activity(buffer_->span, type, std::string(r.name));
      auto& work = *buffer_->activities.back();
      work.device = r.device;
      work.resource = resource;
      work.startTime = static_cast<int64_t>(r.startNs);
      work.endTime = static_cast<int64_t>(std::max(r.endNs, r.startNs));
      work.id = static_cast<int32_t>(r.workId);
      work.linked = cpuOp;
      work.addMetadata("device", r.device);
      work.addMetadata("stream", resource);
      work.addMetadata("correlation", static_cast<int32_t>(r.workId));
      work.addMetadataQuoted("kind", kindName(r.kind));
      if (r.bytes > 0) {
        work.addMetadata("bytes", r.bytes);
        const uint64_t ns = r.endNs > r.startNs ? r.endNs - r.startNs : 0;
        if (ns > 0) {
          work.addMetadata("memory bandwidth (GB/s)",
                           fmt::format("{:.3f}", static_cast<double>(r.bytes) / ns));
        }
      }
      if (r.status != NRT_SUCCESS) work.addMetadataQuoted("status", nrtGetErrorName(r.status));
      if (r.fusedCount > 0) {
        // Ran in one fused pass with others (Fusion.h): every op of the pass
        // spans the pass and names its first item and size.
        work.addMetadata("fused pass", static_cast<int32_t>(r.fusedWith));
        work.addMetadata("fused ops", r.fusedCount);
      }

      // The launch, on the launching thread: that is the linked op's thread
      // (the correlation came from that thread's stack). Without a linked
      // op there is no thread to draw it on, and no arrow.
      if (cpuOp != nullptr && wantRuntime) {
        work.flow.id = flowId;
        work.flow.type = libkineto::kLinkAsyncCpuGpu;
        work.flow.start = false;
        buffer_->emplace_activity(buffer_->span, ActivityType::PRIVATEUSE1_RUNTIME,
                                  std::string("nrtLaunchWork"));
        auto& launch = *buffer_->activities.back();
        launch.device = static_cast<int32_t>(cpuOp->deviceId());
        launch.resource = cpuOp->resourceId();
        launch.threadId = cpuOp->getThreadId();
        launch.startTime = launch.endTime = static_cast<int64_t>(r.queuedNs);
        launch.id = static_cast<int32_t>(r.workId);
        launch.linked = cpuOp;
        launch.flow.id = flowId;
        launch.flow.type = libkineto::kLinkAsyncCpuGpu;
        launch.flow.start = true;
        launch.addMetadata("correlation", static_cast<int32_t>(r.workId));
        launch.addMetadataQuoted("kind", kindName(r.kind));
      }
      ++buffer_->gpuOpCount;
    }
    records_.clear();

    // Kineto takes one DeviceInfo from getDeviceInfo() (the first device);
    // name the others and every lane here, so multi-device traces are
    // labelled too.
    const auto all = devices();
    for (auto it = all.empty() ? all.end() : std::next(all.begin()); it != all.end(); ++it) {
      logger.handleDeviceInfo(deviceInfo(*it), static_cast<int64_t>(startNs_));
    }
    for (const auto& [device, resource] : lanes_) {
      logger.handleResourceInfo(
          libkineto::ResourceInfo{resource, resource, device, fmt::format("stream {}", resource)},
          static_cast<int64_t>(startNs_));
    }
    for (const auto& act : buffer_->activities) act->log(logger);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    // Returning one keeps Kineto from labelling pids 0..15 "GPU n".
    const auto all = devices();
    return std::make_unique<libkineto::DeviceInfo>(deviceInfo(all.empty() ? 0 : *all.begin()));
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    // The activities point at this buffer's span: hand over the buffer
    // itself, never a moved copy.
    return std::move(buffer_);
  }

 private:
  static void pop() {
    // INVALID_VALUE on an empty stack: a scope that began before this session
    // existed ends inside it. Nothing to undo then.
    (void)nrtPopCorrelationId();
  }

  void setRecording(bool on) {
    NEURON_WARN_IF_ERROR(nrtActivityEnable(on ? 1 : 0));
    recording_ = on;
  }

  std::set<int> devices() const {
    std::set<int> out;
    for (const auto& lane : lanes_) out.insert(lane.first);
    return out;
  }

  static libkineto::DeviceInfo deviceInfo(int device) {
    return libkineto::DeviceInfo{device, kDeviceSortBase + device, fmt::format("neuron:{}", device),
                                 fmt::format("neuron {}", device)};
  }

  const std::set<ActivityType> types_;
  bool recording_ = false;
  uint64_t startNs_ = 0;
  uint64_t stopNs_ = 0;
  uint64_t dropped_ = 0;
  std::vector<nrtActivityRecord> records_;
  std::set<std::pair<int, int64_t>> lanes_;
  std::vector<std::string> errors_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<ActivityType>& availableActivities() const override { return available_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& activityTypes, const libkineto::Config& /*config*/) override {
    // Kineto asks every registered profiler; a CPU-only trace asks for none
    // of the device types and gets no session, so nothing is recorded.
    std::set<ActivityType> wanted;
    for (ActivityType t : activityTypes) {
      if (available_.count(t)) wanted.insert(t);
    }
    const bool anyDevice = wanted.count(ActivityType::CONCURRENT_KERNEL) ||
                           wanted.count(ActivityType::GPU_MEMCPY) ||
                           wanted.count(ActivityType::GPU_MEMSET);
    if (!anyDevice || deviceCount() == 0) return nullptr;
    return std::make_unique<NeuronProfilerSession>(wanted);
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/, int64_t /*duration_ms*/, const std::set<ActivityType>& activityTypes,
      const libkineto::Config& config) override {
    // Kineto starts the session itself when the window opens.
    return configure(activityTypes, config);
  }

 private:
  const std::string name_{"neuron"};
  const std::set<ActivityType> available_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                          ActivityType::GPU_MEMSET,
                                          ActivityType::PRIVATEUSE1_RUNTIME};
};

// PyTorch hands the factory to Kineto when Kineto initialises.
REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

}  // namespace
}  // namespace torchneuron
