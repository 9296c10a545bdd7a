// Enqueueing host closures as kernels on a neuron stream.
#pragma once

#include "core/Runtime.h"
#include "core/Stream.h"

#include <c10/util/Exception.h>

#include <exception>
#include <functional>
#include <memory>
#include <utility>

namespace torchneuron {

namespace detail {
inline nrtStatus runClosure(void* args) {
  std::unique_ptr<std::function<void()>> fn(*static_cast<std::function<void()>**>(args));
  try {
    (*fn)();
  } catch (const c10::Error& e) {
    nrtKernelSetError(e.what_without_backtrace());
    return NRT_ERROR_KERNEL_FAILED;
  } catch (const std::exception& e) {
    nrtKernelSetError(e.what());
    return NRT_ERROR_KERNEL_FAILED;
  } catch (...) {
    nrtKernelSetError("unknown exception");
    return NRT_ERROR_KERNEL_FAILED;
  }
  return NRT_SUCCESS;
}
}  // namespace detail

// Queues `fn` on `stream`; it runs on the device executor in stream order.
// The closure must not own device memory (tensors): the caching allocator's
// stream-ordered reuse keeps the memory valid; it must capture raw pointers
// and metadata only.
inline void launchOnStream(const NeuronStream& stream, const char* name, std::function<void()> fn) {
  auto* heap = new std::function<void()>(std::move(fn));
  const nrtStatus st =
      nrtLaunchKernel(stream.handle(), name, &detail::runClosure, &heap, sizeof(heap));
  if (st != NRT_SUCCESS && st != NRT_ERROR_KERNEL_FAILED) {
    // Not queued: we still own the closure.
    delete heap;
  }
  if (st != NRT_SUCCESS) {
    throwRuntimeError(st, "nrtLaunchKernel", __FILE__, __LINE__);
  }
}

}  // namespace torchneuron
