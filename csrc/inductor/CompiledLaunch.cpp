#include "inductor/CompiledLaunch.h"

#include "aten/Launch.h"
#include "aten/OpTracking.h"
#include "core/Runtime.h"
#include "core/Stream.h"

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

namespace torchneuron {
namespace {

struct CompiledKernel {
  std::string name;  // the work item's name: lives with the process
  c10::DeviceIndex device;
  nrtWorkKind kind;
  OpCounters* counters;  // op tracking counts each launch as an async op
};

CompiledKernel* intern(const std::string& name, int device, nrtWorkKind kind) {
  static std::mutex mu;
  static std::map<std::tuple<std::string, int, int>, std::unique_ptr<CompiledKernel>> kernels;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = kernels[{name, device, static_cast<int>(kind)}];
  if (!slot)
    slot.reset(new CompiledKernel{name, static_cast<c10::DeviceIndex>(device), kind,
                                  opCounters(name)});
  return slot.get();
}

void writeError(char* error, size_t errorSize, const char* what) {
  if (error && errorSize) std::snprintf(error, errorSize, "%s", what);
}

}  // namespace
}  // namespace torchneuron

extern "C" {

const void* torchneuron_compiled_kernel(const char* name, int device) {
  return torchneuron::intern(std::string("inductor::") + (name ? name : "<unnamed>"), device,
                             nrtWorkKernel);
}

const void* torchneuron_custom_kernel(const char* name, int device) {
  return torchneuron::intern(name ? name : "<unnamed custom kernel>", device, nrtWorkCustom);
}


int torchneuron_launch_compiled(const void* kernel, void (*run)(const void*), const void* args,
                                size_t size, char* error, size_t errorSize) {
  using namespace torchneuron;
  const auto* k = static_cast<const CompiledKernel*>(kernel);
  try {
    TORCH_CHECK(k && run, "torchneuron_launch_compiled: no kernel");
    // The argument block, 8-byte aligned as the kernel module's struct is.
    c10::SmallVector<uint64_t, 16> block;
    block.resize_for_overwrite((size + 7) / 8);
    if (size) std::memcpy(block.data(), args, size);
    WorkDesc work;
    work.name = k->name.c_str();
    work.kind = k->kind;
    launchWork(getCurrentStream(k->device), work,
               [run, block = std::move(block)] { run(block.data()); });
    recordOp(k->counters, OpPath::Async);
    return 0;
  } catch (const c10::Error& e) {
    writeError(error, errorSize, e.what_without_backtrace());
  } catch (const std::exception& e) {
    writeError(error, errorSize, e.what());
  }
  return -1;
}

}  // extern "C"
