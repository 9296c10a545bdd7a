// The backward of CPU flash attention in bfloat16
// (_scaled_dot_product_flash_attention_for_cpu_backward), computed with CPU's
// bits at a fraction of CPU's cost.
//
// Why: CPU's kernel makes five small products per (query block, key block).
// Two give float results and go to MKL; the three that accumulate into the
// bfloat16 gradients (beta = 1) go to oneDNN through ideep, which builds a
// primitive descriptor, attributes and memory objects for every call: about
// 20 us each for a 32x64x32 product. A tiny Llama's backward (4 x 4 heads,
// 64 tokens) spends 2.1 ms there against 0.29 ms in float32.
//
// How the bits stay CPU's: on a machine with AVX512-BF16 both libraries
// compute a bfloat16 product as one accumulator per output element fed by
// VDPBF16PS over consecutive pairs of the reduced dimension, in order
// (probed with products 2^25, 1, -2^25 placed at random positions, which
// come out 0 or 1 depending on the order); oneDNN then adds the scaled sum
// to the old value in float and rounds once to bfloat16. These kernels do
// the same with the same instruction, and everything between the products
// (the row sums, exp, the bfloat16 conversions) is ATen's own vectorized code
// from its headers, built for AVX-512 as ATen's kernel is. That is a
// reading of two libraries' behaviour, not a guarantee, so FlashBackward.cpp
// calibrates each geometry against CPU's kernel before using this one.
//
// This file's .cpp is built with AVX-512 flags (CMakeLists.txt); it is only
// entered when flashBackwardBf16Available() (FlashBackward.h) says the
// machine has them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torchneuron {

// Strides in elements; tensors are [batch, heads, seq, head_dim] views with
// head_dim contiguous (logsumexp: [batch, heads, seq]).
struct FlashBwdStrides {
  int64_t b = 0, h = 0, s = 0;
};

struct FlashBwdGeometry {
  // heads: of the query; kvHeads: of key and value, dividing heads (grouped
  // query attention: query head j reads key/value head j / (heads / kvHeads)).
  int64_t batch = 0, heads = 0, kvHeads = 0, qLen = 0, kvLen = 0, headDim = 0;
  int64_t qSplit = 0, kvSplit = 0;  // CPU's block sizes for this query length
  bool causal = false;
  float scale = 0.f;
  FlashBwdStrides gradOut, q, k, v, out, lse, gradQ, gradK, gradV;
};

struct FlashBwdData {
  const uint16_t *gradOut, *q, *k, *v, *out;
  const float* lse;
  uint16_t *gradQ, *gradK, *gradV;  // zero-filled by the caller
};

// CPU's block sizes (FlashAttentionKernel.cpp's dispatch on the query length).
void flashBwdBlocks(int64_t qLen, int64_t kvLen, int64_t* qSplit, int64_t* kvSplit);

// Bytes of scratch one thread needs for flashBwdUnits (64-byte aligned).
size_t flashBwdScratchBytes(const FlashBwdGeometry& g);

// Computes the gradients of units [begin, end) of batch * kvHeads: a unit is
// one key/value head of one batch entry and the query heads that read it,
// taken in order (their terms accumulate into the unit's key and value
// gradients in that order). Units share no output, so any split among
// threads gives the same bits.
void flashBwdUnits(const FlashBwdGeometry& g, const FlashBwdData& d, int64_t begin, int64_t end,
                   void* scratch);

}  // namespace torchneuron
