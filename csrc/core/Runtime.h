// Runtime access for the backend: status checking, lazy initialisation,
// device count/current device and fork safety. Every other file reaches the
// runtime through NEURON_CHECK and the helpers declared here.
#pragma once

#include <neuron/runtime.h>

#include <c10/core/Device.h>
#include <c10/macros/Macros.h>

#include <string>

namespace torchneuron {

// Throws the exception matching a failed runtime call: c10::OutOfMemoryError
// for NRT_ERROR_OUT_OF_MEMORY, c10::Error otherwise. The message names the
// call, the status and the runtime's detailed message.
[[noreturn]] C10_NOINLINE void throwRuntimeError(nrtStatus status, const char* expr,
                                                 const char* file, int line);

// Human-readable description of a status with the thread's last message.
std::string describeStatus(nrtStatus status);

#define NEURON_CHECK(EXPR)                                                  \
  do {                                                                      \
    const nrtStatus _nrt_status = (EXPR);                                   \
    if (C10_UNLIKELY(_nrt_status != NRT_SUCCESS)) {                         \
      ::torchneuron::throwRuntimeError(_nrt_status, #EXPR, __FILE__, __LINE__); \
    }                                                                       \
  } while (0)

// For destructors and noexcept paths: reports a failure as a warning.
#define NEURON_WARN_IF_ERROR(EXPR)                                          \
  do {                                                                      \
    const nrtStatus _nrt_status = (EXPR);                                   \
    if (C10_UNLIKELY(_nrt_status != NRT_SUCCESS)) {                         \
      TORCH_WARN("neuron: ", #EXPR, " failed: ",                            \
                 ::torchneuron::describeStatus(_nrt_status));               \
    }                                                                       \
  } while (0)

// Number of visible devices; 0 when the runtime is unusable (never throws).
c10::DeviceIndex deviceCount() noexcept;
// Why the runtime is unusable (its configuration error), "" when it is not.
std::string initError();

// CUDA's words for using the device in a child forked after initialisation.
extern const char* const kBadForkMessage;

// Initialises the backend once (idempotent, thread-safe). Throws when the
// process is a child forked after initialisation or when no device exists.
void lazyInit();
bool isInitialized() noexcept;
// True in a child process forked after the runtime was initialised.
bool isInBadFork() noexcept;

// Throws unless 0 <= index < deviceCount().
void checkDeviceIndex(c10::DeviceIndex index);

// Calling thread's current device (initially 0).
c10::DeviceIndex currentDevice();
void setCurrentDevice(c10::DeviceIndex index);
// Resolves -1 to the current device and checks the index.
c10::DeviceIndex resolveDevice(c10::DeviceIndex index);

// Device properties, queried once per device.
const nrtDeviceProperties& deviceProperties(c10::DeviceIndex index);

}  // namespace torchneuron
