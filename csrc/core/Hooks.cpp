// at::PrivateUse1HooksInterface: how core ATen reaches this backend for
// availability, generators, pinned memory, pointer lookup and storage resize.
#include "core/DeviceAllocator.h"
#include "core/Generator.h"
#include "core/HostAllocator.h"
#include "core/Runtime.h"
#include "core/Stream.h"

#include <c10/core/DeviceGuard.h>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace torchneuron {
namespace {

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }

  bool isAvailable() const override { return deviceCount() > 0; }

  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    return isInitialized() && device_index >= 0 && device_index < deviceCount();
  }

  void init() const override { lazyInit(); }

  c10::DeviceIndex deviceCount() const override { return torchneuron::deviceCount(); }

  void setCurrentDevice(c10::DeviceIndex device) const override { setCurrentDevice_(device); }

  c10::DeviceIndex getCurrentDevice() const override { return currentDevice(); }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto old = currentDevice();
    if (device >= 0 && device != old) setCurrentDevice_(device);
    return old;
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return torchneuron::getDefaultGenerator(device_index);
  }

  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return createGenerator(device_index);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    nrtPointerAttributes attr{};
    NEURON_CHECK(nrtPointerGetAttributes(&attr, data));
    TORCH_CHECK(attr.type == nrtMemoryTypeDevice, "Pointer ", data,
                " is not neuron device memory (expected a pointer from the neuron allocator)");
    return at::Device(at::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(attr.device));
  }

  bool isPinnedPtr(const void* data) const override { return torchneuron::isPinnedPtr(data); }

  at::Allocator* getPinnedMemoryAllocator() const override { return getHostAllocator(); }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    // storage.resize_(-n) reaches here as a huge size_t.
    TORCH_CHECK(static_cast<ptrdiff_t>(new_bytes) >= 0,
                "Trying to resize a neuron storage to a negative number of bytes: ",
                static_cast<ptrdiff_t>(new_bytes));
    const size_t old_bytes = impl->nbytes();
    if (new_bytes == old_bytes) return;
    auto* allocator = impl->allocator() != nullptr ? impl->allocator() : getDeviceAllocator();
    c10::DataPtr new_data;
    if (new_bytes > 0) {
      new_data = allocator->allocate(new_bytes);
    } else {
      new_data = c10::DataPtr(nullptr, impl->device());
    }
    const size_t copy_bytes = std::min(old_bytes, new_bytes);
    if (copy_bytes > 0 && impl->data() != nullptr) {
      // The kept bytes move in stream order (no host wait); the old block
      // is not reused before the copy has read it.
      c10::DeviceGuard guard(impl->device());
      const auto stream = getCurrentStream(impl->device().index());
      NEURON_CHECK(nrtMemcpyAsync(new_data.get(), impl->data(), copy_bytes,
                                  nrtMemcpyDeviceToDevice, stream.handle()));
      c10::DataPtr old = impl->set_data_ptr(std::move(new_data));
      getDeviceAllocator()->recordStream(old, stream.unwrap());
    } else {
      impl->set_data_ptr_noswap(std::move(new_data));
    }
    impl->set_nbytes(new_bytes);
  }

 private:
  static void setCurrentDevice_(c10::DeviceIndex device) { torchneuron::setCurrentDevice(device); }
};

struct RegisterHooks {
  RegisterHooks() {
    // Never destroyed: core ATen keeps the pointer and may call it while
    // this library's statics are destroyed at exit.
    static auto* hooks = new NeuronHooks();
    at::RegisterPrivateUse1HooksInterface(hooks);
  }
};
RegisterHooks g_register_hooks;

}  // namespace

// Storage resize used by the ATen kernels in this library.
void resizeStorageBytes(const c10::Storage& storage, size_t new_bytes) {
  at::detail::getPrivateUse1Hooks().resizePrivateUse1Bytes(storage, new_bytes);
}

}  // namespace torchneuron
