// Device guard: devices, streams and events for c10 (torch.Stream,
// torch.Event, DeviceGuard, torch.accelerator).
#include "core/DeviceAllocator.h"
#include "core/HostWait.h"
#include "core/KernelWarnings.h"
#include "core/Runtime.h"
#include "core/Stream.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>


namespace torchneuron {
namespace {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

nrtEvent_t toEvent(void* event) {
  return static_cast<nrtEvent_t>(reinterpret_cast<uintptr_t>(event));
}

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  NeuronGuardImpl() = default;
  explicit NeuronGuardImpl(c10::DeviceType t) {
    TORCH_INTERNAL_ASSERT(t == kNeuron);
  }

  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kNeuron);
    const auto old = currentDevice();
    if (old != d.index()) setCurrentDevice(d.index());
    return c10::Device(kNeuron, old);
  }

  c10::Device getDevice() const override { return c10::Device(kNeuron, currentDevice()); }

  void setDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kNeuron);
    setCurrentDevice(d.index());
  }

  void uncheckedSetDevice(c10::Device d) const noexcept override {
    (void)nrtSetDevice(d.index());
  }

  c10::Stream getStream(c10::Device d) const override {
    return getCurrentStream(d.index()).unwrap();
  }

  c10::Stream getDefaultStream(c10::Device d) const override {
    return torchneuron::getDefaultStream(d.index()).unwrap();
  }

  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return getStreamFromPool(priority, d.index()).unwrap();
  }

  c10::Stream getStreamFromGlobalPool(c10::Device d, bool isHighPriority) const override {
    const int prio = isHighPriority ? priorityRange(d.index()).second : 0;
    return getStreamFromPool(prio, d.index()).unwrap();
  }

  c10::Stream exchangeStream(c10::Stream s) const override {
    NeuronStream stream(s);
    auto old = getCurrentStream(s.device_index());
    setCurrentStream(stream);
    return old.unwrap();
  }

  void* getStreamNativeHandle(const c10::Stream s) const override {
    return reinterpret_cast<void*>(static_cast<uintptr_t>(streamHandle(s)));
  }

  c10::DeviceIndex deviceCount() const noexcept override { return torchneuron::deviceCount(); }

  c10::DeviceCapability getDeviceCapability(c10::Device /*d*/) const override {
    return c10::DeviceCapability();  // every dtype the CPU kernels support
  }

  // Events -----------------------------------------------------------------

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    if (event == nullptr) return;
    // Safe with records and waits still queued: the runtime keeps the event
    // alive until they are done.
    NEURON_WARN_IF_ERROR(nrtEventDestroy(toEvent(event)));
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "Event device index ", static_cast<int>(device_index),
                " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    if (*event == nullptr) {
      // BACKEND_DEFAULT keeps timing on (like cudaEventDefault);
      // PYTORCH_DEFAULT disables it (like CUDA).
      const unsigned flags =
          flag == c10::EventFlag::BACKEND_DEFAULT ? NRT_EVENT_DEFAULT : NRT_EVENT_DISABLE_TIMING;
      nrtEvent_t ev = 0;
      NEURON_CHECK(nrtEventCreate(&ev, flags));
      *event = reinterpret_cast<void*>(static_cast<uintptr_t>(ev));
    }
    NEURON_CHECK(nrtEventRecord(toEvent(*event), streamHandle(stream)));
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    NEURON_CHECK(nrtStreamWaitEvent(streamHandle(stream), toEvent(event)));
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    const nrtStatus st = nrtEventQuery(toEvent(event));
    if (st == NRT_ERROR_NOT_READY) return false;
    if (st == NRT_ERROR_EVENT_NOT_RECORDED) return true;
    NEURON_CHECK(st);
    return true;
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    noteHostWait(WaitCause::Synchronize, "Event.synchronize");
    const nrtStatus st = nrtEventSynchronize(toEvent(event));
    flushKernelWarnings();
    if (st == NRT_ERROR_EVENT_NOT_RECORDED) return;
    NEURON_CHECK(st);
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start && end,
                "Both events must be recorded before calculating elapsed time.");
    float ms = 0;
    NEURON_CHECK(nrtEventElapsedTime(&ms, toEvent(start), toEvent(end)));
    return static_cast<double>(ms);
  }

  // Streams and devices ----------------------------------------------------

  bool queryStream(const c10::Stream& stream) const override {
    return NeuronStream(stream).query();
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    noteHostWait(WaitCause::Synchronize, "Stream.synchronize");
    NeuronStream(stream).synchronize();
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    const auto device = resolveDevice(device_index);
    if (!isInitialized()) return;
    noteHostWait(WaitCause::Synchronize, "synchronize");
    const nrtStatus st = nrtDeviceSynchronize(device);
    flushKernelWarnings();
    NEURON_CHECK(st);
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    getDeviceAllocator()->recordStream(data_ptr, stream);
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace torchneuron
