// LoopStep.h — one op of a list loop (ListLoop.h) on raw float32 memory, and
// the loop itself. Plain C++: ListLoopKernels.cpp, which runs the steps, is
// compiled for AVX-512 and must not instantiate inline code shared with the
// rest of the library (the linker could keep its AVX-512 copy for everyone).
#pragma once

#include <cstddef>
#include <cstdint>

namespace torchneuron {

struct LoopStep {
  enum Kind : uint8_t { kMul, kDiv, kAdd, kLerp, kAddcmul, kAddcdiv, kSqrt } kind;
  float* out;        // written: self for an in-place op, else the op's out=
  const float* self;
  const float* a;  // the other tensor (mul/div/add: nullptr, then `value`; sqrt: none)
  const float* b;  // addcmul's and addcdiv's second tensor
  float value;     // mul/div/add's scalar, lerp's weight, addcmul's/addcdiv's value
  float alpha;     // add's alpha
};

// Every step on elements [0, count) of its operands, a tile at a time: each
// step on elements [t, t + 512) before the next tile. Needs AVX-512
// (listLoopsEnabled, ListLoop.h).
void runLoopSteps(const LoopStep* steps, size_t n, int64_t count);

// A mul/div/add step whose operands are the output's size except one that
// repeats (a broadcast: Pointwise.cpp): output element i reads element
// (i / (inner * rep)) * inner + i % inner of the repeated operand, `a`, or
// `self` where repeatSelf. So inner == 1 is a value per row of `rep`
// elements (x * rstd[..., None]); a leading run, a column operand (x * w).
// Elements [begin, end) of the output; inner == 1 needs !repeatSelf.
struct RepeatStep {
  LoopStep step;
  int64_t inner = 0;
  int64_t rep = 0;
  bool repeatSelf = false;
};
void runRepeatStep(const RepeatStep& s, int64_t begin, int64_t end);

// Whether kSqrt steps can run: ATen's square root (MKL's) is at hand.
bool sqrtStepAvailable();

}  // namespace torchneuron
