// The threads a device kernel computes with.
//
// Kernels run on the runtime's executor threads and split their work with
// ATen's intra-op parallelism (OpenMP), whose thread count is a setting of
// each thread: a thread ATen did not start computes with OpenMP's default
// (every core), whatever torch.set_num_threads said. So the count is carried
// from the host to the executor:
// - NEURON_RT_COMPUTE_THREADS, when set (validated by the runtime), fixes it;
// - else it follows the launching thread's torch.get_num_threads(), so
//   torch.set_num_threads (and OMP_NUM_THREADS, torchrun's 1 per process)
//   bounds the device's compute as it bounds CPU's.
// Both sides cost a thread-local read and a relaxed atomic per launch.
// The OpenMP teams of threads that do not compute now are released (the
// launching thread's at each launch, an executor worker's when it goes
// idle): idle teams make every team's threads sleep between regions (see
// releaseTeam in the .cpp for the measurements).
// Work run on a launching thread (NEURON_LAUNCH_BLOCKING=1) keeps that
// thread's own count: torch's setting is never changed.
// The executor's threads (and the team threads they create) run at the
// host's scheduling priority unless TORCHNEURON_COMPUTE_NICE lowers it (the
// .cpp says why not by default); a launching thread's priority is never
// changed.
#pragma once

#include <utility>

namespace torchneuron {

// Host side, at each launch: publishes the launching thread's count.
void noteLaunchComputeThreads();

// Executor side, before each work item: applies the published count to the
// executing thread when it changed.
void applyComputeThreads();

// The count the executing thread computes with (at::get_num_threads()).
int currentComputeThreads();

// MKL's count on the executing thread, and the part of it that is the
// thread's own (0: MKL follows the thread's OpenMP count); {-1, 0} without MKL.
std::pair<int, int> currentMklThreads();

}  // namespace torchneuron
