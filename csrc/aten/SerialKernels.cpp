// SerialKernels.cpp — see SerialKernels.h.
#include "aten/SerialKernels.h"

#include "aten/QueuedKernel.h"
#include "core/SerialCompute.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <ATen/WrapDimUtilsMulti.h>
#include <c10/util/accumulate.h>
#include <omp.h>

#include <unordered_map>

namespace torchneuron {
namespace {

// Argument i as a device tensor, or nullptr.
const TensorRef* tensorAt(const Kernel& k, size_t i) {
  if (i >= k.slots.size() || k.slots[i].kind != ArgSlot::kTensor || !k.slots[i].tensors[0])
    return nullptr;
  return &*k.slots[i].tensors[0];
}

const c10::IValue* valueAt(const Kernel& k, size_t i) {
  if (i >= k.slots.size() || k.slots[i].kind != ArgSlot::kValue) return nullptr;
  return &k.slots[i].value;
}

// Whether sizes and strides are a contiguous layout (size-1 dims aside).
bool contiguous(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  int64_t expected = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}
bool contiguous(const TensorRef& t) { return contiguous(t.sizes, t.strides); }

int64_t numel(const TensorRef& t) { return c10::multiply_integers(t.sizes); }

bool floating(const TensorRef& t) { return t.dtype == at::kFloat || t.dtype == at::kDouble; }

// Whether `dim` (wrapped) is the last dim of `t`.
bool lastDim(const TensorRef& t, const c10::IValue* dim) {
  if (dim == nullptr || !dim->isInt()) return false;
  const int64_t nd = static_cast<int64_t>(t.sizes.size());
  const int64_t d = dim->toInt();
  return nd > 0 && (d == nd - 1 || d == -1);
}

// Flash attention, forward and backward (cpu_flash_attention[_backward] in
// ATen's FlashAttentionKernel.cpp): at::parallel_for over batch x head (x
// query block, forward) with grain 1; each part is computed whole by one
// thread into its own slice, with per-thread scratch. Its products are
// cpublas::gemm calls inside that loop: on the reference count they run
// inside the parallel region, where MKL computes on the calling thread, and
// one thread computes them the same way only if the reference really opened
// a region: batch x heads of 2 or more.
bool flashAttention(const Kernel& k, size_t query, int64_t productsPerBlock) {
  const TensorRef* q = tensorAt(k, query);
  const TensorRef* v = tensorAt(k, query + 2);
  if (!q || !v || q->sizes.size() != 4 || v->sizes.size() != 4) return false;
  if (q->dtype != at::kFloat && q->dtype != at::kBFloat16) return false;
  const int64_t batchHeads = q->sizes[0] * q->sizes[1];
  if (batchHeads < 2) return false;
  const int64_t macs = batchHeads * q->sizes[2] * v->sizes[2] * q->sizes[3] * productsPerBlock;
  return serialWorthy(macs);
}

// _scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, ...)
bool flashForward(const Kernel& k) {
  const c10::IValue* dropout = valueAt(k, 3);
  if (dropout == nullptr || !dropout->isDouble() || dropout->toDouble() != 0.0) return false;
  return flashAttention(k, 0, 2);
}

// _scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, ...)
bool flashBackward(const Kernel& k) { return flashAttention(k, 1, 4); }

// _log_softmax(self, dim, half_to_float) over the last dim of a contiguous
// float tensor: ATen's vec_log_softmax_lastdim splits rows in groups; every
// row's max, sum and log are computed from that row alone, with the vector
// forms (vec::map's tail is a vector too) whatever the group.
bool logSoftmax(const Kernel& k) {
  const TensorRef* self = tensorAt(k, 0);
  const c10::IValue* halfToFloat = valueAt(k, 2);
  if (!self || !floating(*self) || !contiguous(*self) || !lastDim(*self, valueAt(k, 1))) return false;
  if (halfToFloat == nullptr || !halfToFloat->isBool() || halfToFloat->toBool()) return false;
  return serialWorthy(numel(*self) * 4);
}

// _log_softmax_backward_data(grad_output, output, dim, input_dtype): rows
// independent in the same way (vec_log_softmax_backward_lastdim).
bool logSoftmaxBackward(const Kernel& k) {
  const TensorRef* grad = tensorAt(k, 0);
  const TensorRef* out = tensorAt(k, 1);
  if (!grad || !out || !floating(*grad) || grad->dtype != out->dtype) return false;
  if (!contiguous(*grad) || !contiguous(*out) || !lastDim(*grad, valueAt(k, 2))) return false;
  return serialWorthy(numel(*grad) * 3);
}

// nll_loss_backward(grad_output, self, target, weight, reduction,
// ignore_index, total_weight): grad_input.zero_() (a constant fill), then
// each batch row writes its own element from its own target.
bool nllLossBackward(const Kernel& k) {
  const TensorRef* self = tensorAt(k, 1);
  if (!self || self->sizes.size() > 2) return false;
  return serialWorthy(numel(*self));
}

// sum.dim_IntList / mean.dim (self, dim, keepdim, dtype) of a contiguous
// float tensor to more than one value: TensorIterator's parallel_reduce
// then runs parallel_dim_reduction, which splits the outputs (at multiples
// of 128 bytes of adjacent columns) and reduces each output with the serial
// loop; only a reduction to a single value splits its inputs
// (two_pass_reduction, per-thread partial sums).
bool dimReduction(const Kernel& k) {
  const TensorRef* self = tensorAt(k, 0);
  const c10::IValue* dims = valueAt(k, 1);
  if (!self || dims == nullptr || !dims->isIntList() || self->sizes.size() > 64) return false;
  // (The call's Meta pass checked the dims, as dim_list_to_bitset does.)
  return serialDimReduction(self->sizes, self->strides, self->dtype,
                            at::dim_list_to_bitset(dims->toDimVector(), self->sizes.size()));
}

// silu_backward(grad_output, self): a TensorIterator kernel with one
// vectorized loop (cpu_kernel_vec) over a chunk of a flat range; its vector
// body and scalar tail compute an element differently (Sleef's exp against
// std::exp). On contiguous operands of one shape each chunk of the
// reference's split (at::parallel_for over GRAIN_SIZE) starts a vector loop;
// when every chunk start is a multiple of 64 elements (a whole number of
// vector pairs of every type here, AVX-512's included), each element falls
// in the vector body or the tail exactly as in one loop over everything.
bool contiguousPointwise(const Kernel& k) {
  int64_t n = -1;
  auto same = [&n](const TensorRef& t) {
    if (!contiguous(t)) return false;
    const int64_t m = numel(t);
    if (n < 0) n = m;
    return m == n && (t.dtype == at::kFloat || t.dtype == at::kDouble ||
                      t.dtype == at::kBFloat16 || t.dtype == at::kHalf);
  };
  for (const ArgSlot& slot : k.slots) {
    if (slot.kind == ArgSlot::kValue) continue;
    if (slot.kind != ArgSlot::kTensor || !slot.tensors[0] || !same(*slot.tensors[0])) return false;
  }
  for (const auto& out : k.outs)
    if (out && !same(*out)) return false;
  if (n <= 0) return false;
  const int64_t chunk = parallelForChunk(n, at::internal::GRAIN_SIZE, omp_get_max_threads());
  if (chunk < n && chunk % 64 != 0) return false;
  return serialWorthy(n);
}

}  // namespace

bool serialDimReduction(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype,
                        const std::bitset<64>& reduced) {
  if (dtype != at::kFloat && dtype != at::kDouble) return false;
  if (!contiguous(sizes, strides)) return false;
  int64_t outputs = 1;
  bool any = false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (reduced.test(d)) any = true;
    else outputs *= sizes[d];
  }
  return any && outputs > 1 && serialWorthy(c10::multiply_integers(sizes));
}

SerialRule serialRuleFor(const std::string& name) {
  static const std::unordered_map<std::string, SerialRule> rules = {
      {"aten::_scaled_dot_product_flash_attention_for_cpu", &flashForward},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", &flashBackward},
      {"aten::_log_softmax", &logSoftmax},
      {"aten::_log_softmax_backward_data", &logSoftmaxBackward},
      {"aten::nll_loss_backward", &nllLossBackward},
      {"aten::sum.dim_IntList", &dimReduction},
      {"aten::mean.dim", &dimReduction},
      {"aten::silu_backward", &contiguousPointwise},
  };
  const auto it = rules.find(name);
  return it == rules.end() ? nullptr : it->second;
}

}  // namespace torchneuron
