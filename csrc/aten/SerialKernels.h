// ATen CPU kernels that compute the same bits on one thread as on any
// count (SerialCompute.h), with the conditions under which that holds.
//
// A kernel qualifies when its work splits into independent parts that one
// thread computes whole whatever the count (rows, batch x head pairs,
// output columns), nothing is summed across parts, and a part's arithmetic
// does not depend on which thread or chunk runs it. Each rule below names
// ATen's loop that makes it so. Kernels with per-thread partial sums
// (two-pass reductions to one value, LayerNorm's backward), splits that move
// a vectorized loop's tail (plain TensorIterator kernels; those on the
// fusion list get their split reproduced instead, Fusion.cpp), or inner
// products that fork threads of their own do not.
//
// tests/test_serial_kernels.py runs each rule's op on one thread and on
// every thread against CPU eager, bitwise; bench/bench_thread_invariance.py
// finds calls whose bits depend on the count.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <bitset>
#include <string>

namespace torchneuron {

struct Kernel;

// Whether this call of the rule's op may run on one thread (its layout and
// size qualify, and serial kernels are on); asked on the executor thread
// that runs it, whose count is the reference.
using SerialRule = bool (*)(const Kernel&);

// The dimReduction rule (SerialKernels.cpp) for sum or mean of a tensor of
// these sizes, strides and dtype over the dims set in `reduced` (wrapped):
// a reduction of a contiguous float tensor to more than one value.
bool serialDimReduction(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype,
                        const std::bitset<64>& reduced);

// The rule of operator `name` ("aten::_log_softmax"), or nullptr.
SerialRule serialRuleFor(const std::string& name);

}  // namespace torchneuron
