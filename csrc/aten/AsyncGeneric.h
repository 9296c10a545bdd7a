// Asynchronous generic path: in-place and out= ops (which include every
// structured functional op, whose outputs are preallocated on the device
// before the .out kernel is dispatched) are validated on the host with their
// Meta kernel and, when no output needs resizing, their CPU kernel is queued
// on the current stream over aliased device memory instead of running
// synchronously. Anything else (or a Meta failure) takes the synchronous
// generic path, which raises the same errors as CPU.
#pragma once

#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <vector>

namespace c10 {
class OperatorHandle;
}

namespace torchneuron {

// Whether the asynchronous generic path is enabled (core/Config.h:
// TORCHNEURON_GENERIC_ASYNC=1; off by default: with PyTorch's Python Meta
// kernels the validation costs 0.2-1 ms per op, more than the synchronous path
// saves on a 2-core host; also settable at run time). Ops writing fewer than
// TORCHNEURON_GENERIC_ASYNC_MIN_NUMEL elements stay synchronous.
bool genericAsyncEnabled();
void setGenericAsyncEnabled(bool enabled);

// `converted` are the op's arguments with neuron tensors replaced by CPU
// aliases (stack[begin..]); `originals` the arguments as passed. On success
// the kernel is queued, the arguments are replaced by the op's returns and
// true is returned; on false nothing was queued or changed.
bool tryEnqueueGeneric(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin,
                       const std::vector<c10::IValue>& originals, c10::DeviceIndex device,
                       const char* name);

}  // namespace torchneuron
