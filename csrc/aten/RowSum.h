// RowSum.h — sums of the rows of contiguous memory, in the order ATen's CPU
// sum adds them.
//
// ATen sums a floating row with a fixed cascade (cascade_sum, SumKernel.cpp):
// vectors of the row go to four interleaved partial sums, each kept in up to
// four levels that take a lower level's total every 2^k steps; the tail
// elements, then the lanes of the final vector, are added to a scalar. A row
// shorter than one vector takes the same cascade element by element. The
// order depends on the width of ATen's vectors (32 or 64 bytes, by the CPU
// capability and which kernels it registers), so the width is not assumed:
// the first use compares both with ATen's own sum and keeps the one that
// gives its bits (none: these paths stay off).
//
// Rows are independent in ATen too: a reduction over trailing dims with
// several rows splits only between rows (parallel_dim_reduction), whatever
// its thread count. A single row is split between threads once it has
// GRAIN_SIZE elements (two_pass_reduction), so callers keep shorter ones.
//
// The device's sum and mean over trailing dims of contiguous tensors use
// these instead of building a TensorIterator per call, which costs about as
// much as CPU eager's whole small sum.
#pragma once

#include <cstdint>

namespace torchneuron {

// Elements of T per ATen vector in its sum kernel, or 0 when neither width
// reproduces its bits. Computed at the first call (it runs ATen's sum).
int rowSumLanesFloat();
int rowSumLanesDouble();

// Whether sum and mean take these rows (on by default; an A/B switch for
// benchmarks and tests: off, they queue ATen's own kernels).
bool rowSumsEnabled();
void setRowSumsEnabled(bool on);

// out[r] = the sum of in[r * len, (r + 1) * len), as ATen's sum gives it,
// divided by `divisor` unless that is 1 (ATen's mean: the sum, then a
// division of the stored sum), for rows [begin, end). `lanes` is the value
// of rowSumLanes*; len >= 1.
void rowSums(const float* in, float* out, int64_t len, int64_t begin, int64_t end, int lanes,
             float divisor);
void rowSums(const double* in, double* out, int64_t len, int64_t begin, int64_t end, int lanes,
             double divisor);

}  // namespace torchneuron
