// Whether a planned BLAS product (Gemm.h) computes on one thread the bits it
// computes on the executing thread's count (SerialCompute.h).
//
// MKL splits a product among its threads by the geometry (sizes, leading
// dimensions, transposes, the operands' alignment) and the thread count, not
// by the values: the demo GPT's weight gradients (inner dimension 1024) are
// summed in two halves on two threads, products with short inner dimensions
// are split only by rows and columns and keep their bits. So each geometry is
// tried once per process: the call on random operands laid out and
// aligned like the real ones, on the thread's count and on one thread, bits
// compared. A differing split changes the bits of nearly every element of
// such a product, so random operands expose it; equal bits admit the
// geometry.
#pragma once

#include "aten/Gemm.h"

namespace torchneuron {

// The verdict for `call`'s geometry with the executing thread's count (tried
// on its first use in the process; false outside an executor thread's normal
// state, e.g. already on one thread).
bool serialGemmAgrees(const GemmCall& call);

// How many geometries have been tried, and how many agreed (tests).
struct SerialGemmStats {
  uint64_t tried = 0;
  uint64_t agreed = 0;
};
SerialGemmStats serialGemmStats();

}  // namespace torchneuron
