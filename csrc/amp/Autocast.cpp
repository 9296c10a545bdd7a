// Autocast.cpp — torch.autocast("neuron"): the same op policies as CUDA.
//
// PyTorch ships the policy lists (lower precision, fp32, fp32 with an
// optional dtype, promote) in ATen/autocast_mode.h so that every backend
// casts the same ops the same way; we register each list for the
// AutocastPrivateUse1 key, and let every other op fall through untouched.
// The default lower-precision dtype stays float16, as on CUDA; bfloat16 is
// chosen with torch.autocast("neuron", dtype=torch.bfloat16).
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

// binary_cross_entropy is not safe under autocast (its input comes out of a
// sigmoid in lower precision); CUDA refuses it too.
at::Tensor binaryCrossEntropyBanned(const at::Tensor&, const at::Tensor&,
                                    const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss cannot be "
              "autocast on neuron: their inputs may be float16/bfloat16 probabilities. Use "
              "binary_cross_entropy_with_logits / BCEWithLogitsLoss (which fuse the sigmoid and "
              "are autocast-safe), or compute the loss outside the autocast region.");
}

}  // namespace
}  // namespace torchneuron

#define NEURON_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  // The signatures in ATen's lists are written unqualified.
  using at::IntArrayRef;
  using at::Scalar;
  using at::ScalarType;
  using at::Tensor;
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER_PRECISION_FP)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN(torchneuron::binaryCrossEntropyBanned));
}
