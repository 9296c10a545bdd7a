// Fence.cpp — see Fence.h.
#include "Fence.h"

#include <cstdio>
#include <cstdlib>

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace nrt {
namespace {

#if defined(__linux__) && defined(__NR_membarrier)
long membarrier(int cmd) { return ::syscall(__NR_membarrier, cmd, 0, 0); }

// Registration is needed before the expedited command, and the kernel (or a
// container's seccomp filter) may offer neither: then both sides use full
// fences. NRT_ASYMMETRIC_FENCE=0 asks for that too (A/B measurements).
bool registerProcess() {
  const char* env = std::getenv("NRT_ASYMMETRIC_FENCE");
  if (env != nullptr && env[0] == '0') return false;
  const long cmds = membarrier(MEMBARRIER_CMD_QUERY);
  if (cmds < 0 || (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}
#else
bool registerProcess() { return false; }
#endif

}  // namespace

bool asymmetricFenceAvailable() {
  static const bool available = registerProcess();
  return available;
}

void heavyFence() {
  if (!asymmetricFenceAvailable()) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return;
  }
#if defined(__linux__) && defined(__NR_membarrier)
  // It cannot fail once registered (the runtime refuses to run in a forked
  // child, whose registration would be gone); if it did, launches would
  // have no fence to pair with, so stop rather than lose a task.
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) {
    std::fprintf(stderr, "neuron runtime: membarrier(PRIVATE_EXPEDITED) failed after registration\n");
    std::abort();
  }
#endif
}

}  // namespace nrt
