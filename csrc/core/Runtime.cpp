#include "core/Runtime.h"

#include "core/HostWait.h"

#include <c10/util/Exception.h>

#include <pthread.h>

#include <atomic>
#include <limits>
#include <string>
#include <deque>
#include <mutex>
#include <vector>

namespace torchneuron {

const char* const kBadForkMessage =
    "Cannot re-initialize neuron in forked subprocess. To use neuron with multiprocessing, you "
    "must use the 'spawn' start method";

std::string describeStatus(nrtStatus status) {
  std::string out = nrtGetErrorName(status);
  out += " (";
  out += nrtGetErrorString(status);
  out += ")";
  const char* detail = nrtGetLastErrorMessage();
  if (detail != nullptr && detail[0] != '\0') {
    out += ": ";
    out += detail;
  }
  return out;
}

void throwRuntimeError(nrtStatus status, const char* expr, const char* file, int line) {
  std::string call(expr);
  call = call.substr(0, call.find('('));  // the runtime function's name
  std::string msg;
  if (status == NRT_ERROR_FORKED) {
    // The runtime refuses every device call in a child forked after it
    // started (its worker threads are gone): CUDA's message and exception.
    TORCH_CHECK(false, kBadForkMessage, " (", call, ": ", describeStatus(status), ")");
  }
  if (status == NRT_ERROR_KERNEL_FAILED) {
    const char* detail = nrtGetLastErrorMessage();
    msg = "A neuron kernel failed: " +
          std::string(detail != nullptr && detail[0] != '\0' ? detail : "(no message)");
    if (call == "nrtLaunchKernel") {
      msg += ". (NEURON_LAUNCH_BLOCKING=1: raised by the op that launched it.)";
    } else {
      msg += ". Kernels run asynchronously, so this was reported by " + call +
             " and the failing op may be an earlier one; set NEURON_LAUNCH_BLOCKING=1 to "
             "raise it at the op that launched it.";
    }
  } else {
    msg = "neuron runtime call " + call + " failed with " + describeStatus(status);
  }
  msg += " [" + std::string(file) + ":" + std::to_string(line) + "]";
  if (status == NRT_ERROR_OUT_OF_MEMORY) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
  }
  TORCH_CHECK(false, msg);
}

namespace {

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_in_bad_fork{false};
std::once_flag g_atfork_once;

void onForkChild() {
  if (g_initialized.load()) {
    g_in_bad_fork.store(true);
  }
}

struct DeviceCountCache {
  c10::DeviceIndex count = 0;
  bool ok = false;
  std::string error;
  DeviceCountCache() {
    int n = 0;
    nrtStatus st = nrtGetDeviceCount(&n);
    if (st == NRT_SUCCESS && n > std::numeric_limits<c10::DeviceIndex>::max()) {
      // A device index is a c10::DeviceIndex: more devices cannot be named.
      error = "the runtime reports " + std::to_string(n) + " devices; PyTorch can address at most " +
              std::to_string(std::numeric_limits<c10::DeviceIndex>::max());
    } else if (st == NRT_SUCCESS) {
      ok = true;
      count = static_cast<c10::DeviceIndex>(n);
    } else {
      error = describeStatus(st);
    }
  }
};

const DeviceCountCache& deviceCountCache() {
  static DeviceCountCache cache;
  return cache;
}

// A launch is about to wait for its stream's full queue (runtime.h): the
// wait is recorded, without a Python stack (the launching code may hold a
// lock a GIL holder waits for) and so never flagged by the sync debug mode,
// as CUDA's does not flag a full launch queue.
void onLaunchThrottle(nrtStream_t) {
  try {
    noteHostWait(WaitCause::LaunchQueue, "launch (the stream holds NEURON_RT_QUEUE_DEPTH items)",
                 /*withStack=*/false);
  } catch (...) {
    // A hook called from the runtime must not throw; the count is what matters.
  }
}

}  // namespace

c10::DeviceIndex deviceCount() noexcept {
  try {
    return deviceCountCache().count;
  } catch (...) {
    return 0;
  }
}

std::string initError() {
  const auto& cache = deviceCountCache();
  return cache.ok ? std::string() : cache.error;
}

void lazyInit() {
  TORCH_CHECK(!g_in_bad_fork.load(), kBadForkMessage);
  if (g_initialized.load(std::memory_order_acquire)) {
    return;
  }
  std::call_once(g_atfork_once, [] {
    pthread_atfork(nullptr, nullptr, onForkChild);
    (void)nrtSetLaunchThrottleHook(&onLaunchThrottle);
  });
  const auto& cache = deviceCountCache();
  TORCH_CHECK(cache.ok, "neuron runtime failed to initialise: ", cache.error,
              ". Check the NEURON_RT_* environment variables.");
  TORCH_CHECK(cache.count > 0,
              "No neuron devices are visible (NEURON_RT_NUM_CORES / NEURON_RT_VISIBLE_CORES "
              "select none).");
  g_initialized.store(true, std::memory_order_release);
}

bool isInitialized() noexcept { return g_initialized.load(); }

void drainDevicesAtExit() noexcept {
  // Queued kernels are CPU kernels: they use the dispatcher, allocators and
  // thread pools of the host libraries, which are static objects destroyed
  // once the interpreter (or main) is done. The executor's threads outlive
  // all of that, so a kernel still queued at exit used to run while they
  // were torn down (an abort at exit, "terminate called without an active
  // exception"). Called before that teardown starts: wait for every device.
  if (!g_initialized.load() || g_in_bad_fork.load()) return;
  // Idle workers stop releasing compute teams (ComputeThreads.cpp): that
  // too is host-library code, which must not run during the teardown.
  (void)nrtSetWorkerIdleHook(nullptr);
  (void)nrtSetLaunchThrottleHook(nullptr);
  for (c10::DeviceIndex d = 0; d < deviceCount(); ++d) {
    // A kernel failure nobody synchronized for is not an exit error (as on
    // CUDA); it was reported to no one and is dropped here.
    (void)nrtDeviceSynchronize(d);
  }
}
bool isInBadFork() noexcept { return g_in_bad_fork.load(); }

void checkDeviceIndex(c10::DeviceIndex index) {
  const auto count = deviceCount();
  TORCH_CHECK(index >= 0 && index < count, "Invalid neuron device index ",
              static_cast<int>(index), ": expected 0 <= index < ", static_cast<int>(count),
              " (the number of visible neuron devices)");
}

c10::DeviceIndex currentDevice() {
  int dev = 0;
  NEURON_CHECK(nrtGetDevice(&dev));
  return static_cast<c10::DeviceIndex>(dev);
}

void setCurrentDevice(c10::DeviceIndex index) {
  checkDeviceIndex(index);
  NEURON_CHECK(nrtSetDevice(index));
}

c10::DeviceIndex resolveDevice(c10::DeviceIndex index) {
  if (index < 0) {
    return currentDevice();
  }
  checkDeviceIndex(index);
  return index;
}

const nrtDeviceProperties& deviceProperties(c10::DeviceIndex index) {
  checkDeviceIndex(index);
  static std::once_flag once;
  static std::vector<nrtDeviceProperties> props;
  static std::vector<std::once_flag>* flags = nullptr;
  std::call_once(once, [] {
    props.resize(deviceCount());
    flags = new std::vector<std::once_flag>(deviceCount());
  });
  std::call_once((*flags)[index], [index] {
    NEURON_CHECK(nrtGetDeviceProperties(&props[index], index));
  });
  return props[index];
}

}  // namespace torchneuron
