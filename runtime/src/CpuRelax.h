// CpuRelax.h — one turn of a busy wait.
#pragma once

#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace nrt {

// x86's pause (the loop spins slower, leaves without a pipeline flush, and
// a sibling hyperthread gets the core); elsewhere a yield.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace nrt
