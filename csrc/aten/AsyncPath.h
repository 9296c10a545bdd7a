// The asynchronous generic path: any op whose output metadata the Meta
// backend can compute runs its CPU kernel on the executor, in stream order,
// writing straight into device memory; the host thread only validates,
// allocates and enqueues.
#pragma once

#include <ATen/core/stack.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <memory>
#include <string>

namespace c10 {
class OperatorHandle;
}

namespace torchneuron {

struct MetaResult;  // MetaPass.h

// A Meta pass the asynchronous path tried to trust and could not: its
// first, inline run did not write into the layouts the Meta pass gave. The
// caller runs the op synchronously; when that succeeds, finish() records that
// this (op, argument metadata) is never run asynchronously again. (When the
// synchronous run raises too, the error was the op's own: nothing is recorded.)
struct AsyncVerify {
  std::shared_ptr<const MetaResult> meta;  // null: nothing to record
  std::string kind;                        // the arguments' kind (AsyncPath.cpp)
  const char* refusal = nullptr;           // why the op is not queued, for tools
  // The Meta kernel refused the op (MetaPass.h): once CPU's kernel has run
  // the call, finish() takes the op off the asynchronous path.
  const c10::OperatorHandle* refusedBy = nullptr;
  // This call's Meta pass (a Python meta kernel) already warned that an out=
  // tensor was resized: the synchronous path drops CPU's kernel's copy.
  bool resizeWarned = false;
  // Every device tensor of the call, and every result, has zero elements:
  // the synchronous path touches no device data and need not wait.
  bool touchesNoData = false;
  void finish();
  AsyncVerify();
  ~AsyncVerify();
};

// Tries to enqueue `op` (arguments on `stack`, all neuron tensors on device
// `device`) asynchronously. On success the stack holds the op's results and
// true is returned; otherwise the stack is untouched and the caller runs the
// synchronous generic path, which produces the same results (and errors),
// then calls verify->finish() once it succeeded.
bool tryAsyncPath(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                  c10::DeviceIndex device, AsyncVerify* verify);

// "An output with one or more elements was resized ...", in any words.
bool isResizeWarning(const c10::Warning& w);

// Turns the asynchronous generic path on or off (on by default); with it off
// every op without a dedicated kernel runs synchronously. For tests and
// debugging.
void setAsyncPathEnabled(bool enabled);
bool asyncPathEnabled();

}  // namespace torchneuron
