// Enqueueing host closures as kernels on a neuron stream.
#pragma once

#include "core/Runtime.h"
#include "core/Stream.h"

#include <c10/util/Exception.h>

#include <exception>
#include <type_traits>
#include <memory>
#include <utility>

namespace torchneuron {

namespace detail {
template <class F>
nrtStatus runClosure(void* args) {
  std::unique_ptr<F> fn(*static_cast<F**>(args));
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
// and metadata only. The closure is moved to the heap once (no std::function
// wrapper): launches are on every op's path.
template <class F>
void launchOnStream(const NeuronStream& stream, const char* name, F&& fn) {
  using Fn = std::decay_t<F>;
  auto* heap = new Fn(std::forward<F>(fn));
  const nrtStatus st =
      nrtLaunchKernel(stream.handle(), name, &detail::runClosure<Fn>, &heap, sizeof(heap));
  if (st != NRT_SUCCESS && st != NRT_ERROR_KERNEL_FAILED) {
    // Not queued: we still own the closure.
    delete heap;
  }
  if (st != NRT_SUCCESS) {
    throwRuntimeError(st, "nrtLaunchKernel", __FILE__, __LINE__);
  }
}

}  // namespace torchneuron
