// ListLoop.h — foreach ops a list pass (Fusion.h) runs in a loop of its own
// instead of calling each op's CPU kernel: an optimizer step's mul_, div_,
// add_, lerp_, addcmul_, addcdiv_ and sqrt over float32 lists.
//
// A list pass that walks a parameter in 64K-element blocks still streams
// each block through L2 once per op, with one ATen kernel call per op per
// block: at 16M elements default AdamW was 1.6x CPU eager, most of its time
// in those kernels. A run of such ops is instead computed tile by tile, every
// op of the run on a tile of 512 elements before the next tile, so the run
// reads and writes each element of a block once from L2 and its ops work in
// L1.
//
// Why the bits stay CPU's: each op computes an element with the operations
// ATen's kernel uses for it, in the same order and with the same roundings.
// ATen's float kernels have a vector form (a block's body) and a scalar form
// (its last < 2 vectors), and for these ops the installed libtorch computes
// the same expression in both: products are fused into the following add
// where ATen's vector code calls fmadd (add with alpha, lerp) and where its
// compiler contracted a*b+c (addcmul, and the scalar forms of add and lerp);
// addcdiv's quotient, mul/div and sqrt are single IEEE operations (sqrt is
// Adam's denominator: a loop of its own would end the run there, and the
// ops after it would read the block from L2 again). So one form
// serves every element, whatever the vector width. That holds for ATen's AVX2
// build of these kernels, which it runs on AVX-512 machines too, and its
// AVX-512 build; its DEFAULT build (no FMA) differs, and loops are then off.
// The kernels of ListLoopKernels.cpp are compiled without contraction so
// that the fused multiply-adds are exactly those written, and their first
// use checks every form against the running torch's kernels (another build
// of torch that computes otherwise turns the loops off, with a warning).
// tests/test_list_loops.py compares the loops with CPU on sizes with ragged
// tails and on values that tell an FMA apart.
#pragma once

#include "aten/KernelArgs.h"
#include "aten/LoopStep.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace torchneuron {

// A foreach op as a loop step at each list index.
struct ListLoopOp {
  LoopStep::Kind kind;
  const TensorRefs* self = nullptr;
  const TensorRefs* out = nullptr;  // the out= list of a functional op's .X_out form; else self
  const TensorRefs* a = nullptr;
  const TensorRefs* b = nullptr;
  std::vector<float> values;  // one for every index, or one per index
  float alpha = 1;

  // The step at list index `index`, on its elements from `begin` on.
  LoopStep at(int64_t index, int64_t begin) const;
};

struct Kernel;
// Whether the queued foreach kernel `k` is one of the ops above (the
// in-place overloads with a Scalar, a Scalar list or, for mul/div/add, a
// tensor list, sqrt_, and the out= forms of the same functional overloads)
// over dense float32 tensors of self's shape at each index, with
// scalars ATen converts to float without raising; then *out describes it.
bool describeListLoop(const Kernel& k, ListLoopOp* out);

// Whether ATen's kernels run with its AVX2 or AVX-512 build (the builds the
// loops reproduce: at::get_cpu_capability), this CPU has AVX-512F (what the
// loops are written in) and the loops gave ATen's bits on a probe at their
// first use (read once).
bool listLoopsAvailable();
// Whether list passes use loops: available, and on (TORCHNEURON_LIST_LOOPS,
// default 1; setListLoopsEnabled switches passes that start from then on).
bool listLoopsEnabled();
void setListLoopsEnabled(bool on);
// Whether list loops compute sqrt (default on, where it gives ATen's bits);
// off, its kernel does, inside the same pass. For A/B measurements and tests.
void setSqrtLoopsEnabled(bool on);

}  // namespace torchneuron
