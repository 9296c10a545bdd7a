// Backend configuration: the one place where csrc/ reads the environment.
//
//   TORCHNEURON_ASYNC=0   run every op without a dedicated kernel on the
//                         synchronous generic path (default 1: the
//                         asynchronous generic path where it applies); a
//                         debugging aid, like NEURON_LAUNCH_BLOCKING
//   TORCHNEURON_DIST_CHECK=0  skip the agreement check before each neuron
//                         collective (default 1: the ranks first agree on the
//                         operation, dtype and sizes, one small all-reduce,
//                         so that a mismatch raises instead of aborting in Gloo)
//   TORCHNEURON_DIST_SHM=0  make that check through the transport even when
//                         every rank of the group is on this machine (default
//                         1: through shared memory there, AgreementBoard.h)
//
// The runtime's own variables (NEURON_RT_*, NEURON_LAUNCH_BLOCKING) are read by
// the runtime.
#pragma once

#include <cstdint>

namespace torchneuron {

struct BackendConfig {
  bool async_path = true;
  // TORCHNEURON_LEARNED_LAYOUTS=0: no learned layouts (AsyncPath.cpp); such calls run synchronously.
  bool learned_layouts = true;
  // TORCHNEURON_FUSION=0: queued pointwise ops never run fused (Fusion.h).
  bool fusion = true;
  // TORCHNEURON_LIST_LOOPS=0: list passes call every op's CPU kernel (ListLoop.h).
  bool list_loops = true;
  // TORCHNEURON_SERIAL_KERNELS=0: kernels always compute on every compute
  // thread, never on one where that gives the same bits (SerialCompute.h).
  bool serial_kernels = true;
  // TORCHNEURON_FLASH_BACKWARD=0: bfloat16 flash attention backward always
  // runs CPU's kernel, never the device's own (FlashBackward.h).
  bool flash_backward = true;
  bool dist_check = true;
  bool dist_shm = true;
};

// Read once, on first use.
const BackendConfig& backendConfig();

}  // namespace torchneuron
