// Backend configuration: the one place where csrc/ reads the environment.
//
//   TORCHNEURON_GENERIC_ASYNC=1           queue in-place/out= ops of the generic
//                                         path on the stream after a Meta check
//                                         (default 0: synchronous)
//   TORCHNEURON_GENERIC_ASYNC_MIN_NUMEL=N only for ops writing >= N elements
//                                         (default 262144)
//
// The runtime's own variables (NEURON_RT_*, NEURON_LAUNCH_BLOCKING) are read by
// the runtime.
#pragma once

#include <cstdint>

namespace torchneuron {

struct BackendConfig {
  bool generic_async = false;
  int64_t generic_async_min_numel = int64_t{1} << 18;
};

// Read once, on first use.
const BackendConfig& backendConfig();

}  // namespace torchneuron
