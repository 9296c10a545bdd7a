// The kernel ABI's parallel-for (CompiledLaunch.h): ATen's intra-op pool,
// the threads the device's own ATen kernels split their work over.
//
// Its own file because it is the one translation unit built with -fopenmp:
// at::parallel_for is header code over `#pragma omp parallel`, which a
// compiler without OpenMP ignores (the loop would run on one thread). The
// library then needs libgomp.so.1, the soname of the OpenMP runtime torch
// loads first, so the process keeps one pool.
#include "inductor/CompiledLaunch.h"

#include <ATen/Parallel.h>

extern "C" void torchneuron_parallel_for(int64_t begin, int64_t end, int64_t grain,
                                         void (*body)(int64_t, int64_t, void*), void* ctx) {
  at::parallel_for(begin, end, grain < 1 ? 1 : grain,
                   [body, ctx](int64_t lo, int64_t hi) { body(lo, hi, ctx); });
}
