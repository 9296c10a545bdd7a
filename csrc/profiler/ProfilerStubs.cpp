// Device timing for the legacy profiler, torch.autograd.profiler.profile(
// use_device="neuron") with use_kineto=False (ProfilerState::
// KINETO_PRIVATEUSE1_FALLBACK): PyTorch records one of our events on the
// current stream when an op begins and one when it ends, and reports the
// elapsed time between them as the op's device time, as it does with CUDA
// events. Registered through torch/csrc/profiler/stubs/base.h.
#include "core/Runtime.h"
#include "core/Stream.h"

#include <neuron/runtime.h>

#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <cstdint>
#include <memory>

namespace torchneuron {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

nrtEvent_t eventOf(const ProfilerVoidEventStub* stub) {
  return static_cast<nrtEvent_t>(reinterpret_cast<uintptr_t>(stub->get()));
}

struct NeuronProfilerStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const NeuronStream stream = getCurrentStream();
    if (device != nullptr) *device = stream.device_index();
    nrtEvent_t ev = 0;
    NEURON_CHECK(nrtEventCreate(&ev, NRT_EVENT_DEFAULT));
    // The stub type is a shared_ptr<void>: the handle rides in the pointer.
    *event = std::shared_ptr<void>(reinterpret_cast<void*>(static_cast<uintptr_t>(ev)),
                                   [](void* p) {
                                     NEURON_WARN_IF_ERROR(nrtEventDestroy(
                                         static_cast<nrtEvent_t>(reinterpret_cast<uintptr_t>(p))));
                                   });
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    NEURON_CHECK(nrtEventRecord(ev, stream.handle()));
  }

  // Microseconds between the two events' completions. PyTorch asks only
  // after profiling, so waiting here does not perturb what was measured.
  float elapsed(const ProfilerVoidEventStub* start,
                const ProfilerVoidEventStub* end) const override {
    if (start == nullptr || end == nullptr || !*start || !*end) return 0.f;
    NEURON_CHECK(nrtEventSynchronize(eventOf(start)));
    NEURON_CHECK(nrtEventSynchronize(eventOf(end)));
    float ms = 0.f;
    NEURON_CHECK(nrtEventElapsedTime(&ms, eventOf(start), eventOf(end)));
    return ms * 1000.f;
  }

  // No annotation API on this device: ranges live in the CPU trace only.
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    c10::OptionalDeviceGuard guard;
    for (c10::DeviceIndex i = 0; i < deviceCount(); ++i) {
      guard.reset_device(c10::Device(c10::DeviceType::PrivateUse1, i));
      op(i);
    }
  }

  void synchronize() const override { NEURON_CHECK(nrtDeviceSynchronize(currentDevice())); }
};

struct RegisterStubs {
  RegisterStubs() {
    static NeuronProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
};
const RegisterStubs registerStubs;

}  // namespace
}  // namespace torchneuron
