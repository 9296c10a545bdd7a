// KernelWarnings: warnings raised by queued device work reach the user.
//
// A queued kernel runs on an executor thread, where a warning (CPU's kernel
// warning that an index is deprecated, a value out of range, ...) would only
// reach the C++ log. So each work item runs with a handler that collects its
// warnings, with the name of the work item; the host thread re-emits them,
// prefixed with that name, at its next synchronizing call (or its next launch
// or host wait, whichever comes first) — where PyTorch's Python bindings turn
// them into Python warnings. CUDA's kernels cannot warn at all.
#pragma once

#include <c10/util/Exception.h>

#include <vector>

namespace torchneuron {

// Runs on the executor after a work item named `name` (a string that lives as
// long as the process) raised `warnings`.
void stashKernelWarnings(const char* name, std::vector<c10::Warning>&& warnings);

// Re-emits the stashed warnings on the calling (host) thread; a no-op on an
// executor thread and when nothing is stashed (one relaxed load).
void flushKernelWarnings();

// Whether this thread is running a queued work item right now.
bool inQueuedWork();
void setInQueuedWork(bool on);

}  // namespace torchneuron
