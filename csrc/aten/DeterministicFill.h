// Under torch.use_deterministic_algorithms(True) (with
// torch.utils.deterministic.fill_uninitialized_memory, its default), CPU and
// CUDA fill the memory of new uninitialised tensors — NaN for floating and
// complex dtypes, the dtype's maximum for integers and bool — so that reading
// it is reproducible. neuron does the same, with the fill queued on the
// current stream as a work item (no host wait).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>

namespace torchneuron {

// Whether the global flags ask for it.
bool deterministicFillEnabled();
// Fills all of `t` (a fresh neuron tensor), when enabled.
void fillUninitializedIfDeterministic(const at::Tensor& t);
// After a resize that grew t's storage from `oldBytes`: fills the new bytes
// of the storage, as ATen's fill_resize_deterministic_ does, when enabled.
void fillResizedIfDeterministic(const at::Tensor& t, size_t oldBytes);

}  // namespace torchneuron
