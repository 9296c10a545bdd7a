// The asynchronous generic path: any op whose output metadata the Meta
// backend can compute runs its CPU kernel on the executor, in stream order,
// writing straight into device memory; the host thread only validates,
// allocates and enqueues.
#pragma once

#include <ATen/core/stack.h>
#include <c10/core/Device.h>

namespace c10 {
class OperatorHandle;
}

namespace torchneuron {

// Tries to enqueue `op` (arguments on `stack`, all neuron tensors on device
// `device`) asynchronously. On success the stack holds the op's results and
// true is returned; otherwise the stack is untouched and the caller runs the
// synchronous generic path, which produces the same results (and errors).
bool tryAsyncPath(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                  c10::DeviceIndex device);

// Turns the asynchronous generic path on or off (on by default); with it off
// every op without a dedicated kernel runs synchronously. For tests and
// debugging.
void setAsyncPathEnabled(bool enabled);
bool asyncPathEnabled();

}  // namespace torchneuron
