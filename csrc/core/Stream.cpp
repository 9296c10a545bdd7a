#include "core/Stream.h"

#include "core/KernelWarnings.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace torchneuron {
namespace {

struct DeviceStreams {
  std::once_flag default_once;
  // Set once default_once ran: every launch looks its stream up here, and a
  // call_once costs thread-local stores on each call (libstdc++).
  std::atomic<bool> ready{false};
  nrtStream_t default_stream = 0;
  int least = 0;     // numerically largest priority
  int greatest = 0;  // numerically smallest priority
  int levels = 1;
  std::array<std::once_flag, kMaxPriorityLevels> pool_once;
  std::array<std::array<nrtStream_t, kStreamsPerPool>, kMaxPriorityLevels> pool{};
  std::array<std::atomic<uint32_t>, kMaxPriorityLevels> next{};
};

// Handle -> c10 stream id of every stream made below. Written once per stream
// at creation, read by tools after the fact; handles are never reused (they
// carry a generation), so entries never go stale in a way that matters.
std::mutex& handleIdsMutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<nrtStream_t, c10::StreamId>& handleIds() {
  static std::unordered_map<nrtStream_t, c10::StreamId> ids;
  return ids;
}
void noteHandleId(nrtStream_t handle, c10::StreamId id) {
  std::lock_guard<std::mutex> lock(handleIdsMutex());
  handleIds()[handle] = id;
}

std::vector<std::unique_ptr<DeviceStreams>>& allDevices() {
  // Never destroyed: threads that outlive main (the autograd engine's device
  // threads, the executor) and late tensor frees may still ask for streams.
  static auto* devices = [] {
    auto* v = new std::vector<std::unique_ptr<DeviceStreams>>();
    for (c10::DeviceIndex i = 0; i < deviceCount(); ++i) {
      v->push_back(std::make_unique<DeviceStreams>());
    }
    return v;
  }();
  return *devices;
}

DeviceStreams& deviceStreams(c10::DeviceIndex device) {
  auto& devices = allDevices();  // one entry per visible device
  if (C10_UNLIKELY(device < 0 || static_cast<size_t>(device) >= devices.size())) {
    checkDeviceIndex(device);  // raises the usual error
  }
  auto& ds = *devices[device];
  if (C10_LIKELY(ds.ready.load(std::memory_order_acquire))) return ds;
  std::call_once(ds.default_once, [&ds, device] {
    lazyInit();
    NEURON_CHECK(nrtStreamGetDefault(&ds.default_stream, device));
    noteHandleId(ds.default_stream, 0);
    const auto& props = deviceProperties(device);
    ds.least = props.streamPriorityLeast;
    ds.greatest = std::min(props.streamPriorityGreatest, props.streamPriorityLeast);
    ds.levels = std::min(kMaxPriorityLevels, ds.least - ds.greatest + 1);
  });
  ds.ready.store(true, std::memory_order_release);
  return ds;
}

int levelForPriority(const DeviceStreams& ds, int priority) {
  const int clamped = std::clamp(priority, ds.greatest, ds.least);
  return std::min(ds.least - clamped, ds.levels - 1);
}

nrtStream_t poolStream(DeviceStreams& ds, c10::DeviceIndex device, int level, int slot) {
  std::call_once(ds.pool_once[level], [&ds, device, level] {
    // Priority of this level: least, least-1, ...; the last level takes the
    // greatest priority so that every level is reachable.
    const int prio = level == ds.levels - 1 ? ds.greatest : ds.least - level;
    for (int slot = 0; slot < kStreamsPerPool; ++slot) {
      NEURON_CHECK(nrtStreamCreate(&ds.pool[level][slot], device, prio));
      noteHandleId(ds.pool[level][slot], 1 + level * kStreamsPerPool + slot);
    }
  });
  return ds.pool[level][slot];
}

c10::Stream makeStream(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

// Per-thread current stream of each device: its id (0 = default stream)
// and, once resolved, its runtime handle. Every launch asks for the current
// stream's handle; caching it here saves the id-to-handle lookup per op.
// Handles of default and pool streams live as long as the process.
struct CurrentStreams {
  std::vector<c10::StreamId> ids;
  std::vector<nrtStream_t> handles;  // 0: not resolved yet
};
CurrentStreams& threadCurrentStreams() {
  thread_local CurrentStreams current{std::vector<c10::StreamId>(deviceCount(), 0),
                                      std::vector<nrtStream_t>(deviceCount(), 0)};
  return current;
}

}  // namespace

NeuronStream::NeuronStream(c10::Stream stream) : stream_(stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "Expected a neuron stream, got a stream of device type ", stream.device_type());
}

NeuronStream::NeuronStream(c10::Stream stream, nrtStream_t handle) : NeuronStream(stream) {
  handle_ = handle;
}

nrtStream_t streamHandle(const c10::Stream& stream) {
  auto device = stream.device_index();
  auto& ds = deviceStreams(device);
  const c10::StreamId id = stream.id();
  if (id == 0) {
    return ds.default_stream;
  }
  const int64_t packed = static_cast<int64_t>(id) - 1;
  TORCH_CHECK(packed >= 0 && packed < static_cast<int64_t>(ds.levels) * kStreamsPerPool,
              "Invalid neuron stream id ", id, " for device ", static_cast<int>(device));
  return poolStream(ds, device, static_cast<int>(packed / kStreamsPerPool),
                    static_cast<int>(packed % kStreamsPerPool));
}

nrtStream_t NeuronStream::handle() const { return handle_ ? handle_ : streamHandle(stream_); }

int NeuronStream::priority() const {
  int prio = 0;
  NEURON_CHECK(nrtStreamGetPriority(handle(), &prio));
  return prio;
}

bool NeuronStream::query() const {
  const nrtStatus st = nrtStreamQuery(handle());
  if (st == NRT_ERROR_NOT_READY) {
    return false;
  }
  NEURON_CHECK(st);
  return true;
}

void NeuronStream::synchronize() const {
  const nrtStatus st = nrtStreamSynchronize(handle());
  flushKernelWarnings();  // the warnings of the work waited for, with its errors
  NEURON_CHECK(st);
}

NeuronStream getDefaultStream(c10::DeviceIndex device) {
  device = resolveDevice(device);
  deviceStreams(device);
  return NeuronStream(makeStream(device, 0));
}

NeuronStream getCurrentStream(c10::DeviceIndex device) {
  device = resolveDevice(device);
  auto& current = threadCurrentStreams();
  const c10::Stream stream = makeStream(device, current.ids[device]);
  nrtStream_t& handle = current.handles[device];
  if (C10_UNLIKELY(handle == 0)) handle = streamHandle(stream);
  return NeuronStream(stream, handle);
}

void setCurrentStream(const NeuronStream& stream) {
  auto device = stream.device_index();
  // Validates the id (and creates the pool) before making it current.
  const nrtStream_t handle = streamHandle(stream.unwrap());
  auto& current = threadCurrentStreams();
  current.ids[device] = stream.id();
  current.handles[device] = handle;
}

NeuronStream getStreamFromPool(int priority, c10::DeviceIndex device) {
  device = resolveDevice(device);
  auto& ds = deviceStreams(device);
  const int level = levelForPriority(ds, priority);
  const int slot = static_cast<int>(ds.next[level].fetch_add(1) % kStreamsPerPool);
  poolStream(ds, device, level, slot);
  return NeuronStream(makeStream(device, 1 + level * kStreamsPerPool + slot));
}

std::pair<int, int> priorityRange(c10::DeviceIndex device) {
  auto& ds = deviceStreams(resolveDevice(device));
  return {ds.least, ds.greatest};
}

c10::StreamId streamIdOfHandle(nrtStream_t handle) {
  std::lock_guard<std::mutex> lock(handleIdsMutex());
  const auto it = handleIds().find(handle);
  return it == handleIds().end() ? -1 : it->second;
}

}  // namespace torchneuron
