// Convolutions: for a backend other than CPU/CUDA, aten::convolution routes
// to convolution_overrideable / convolution_backward_overrideable, whose
// default kernels throw. Both run on the device through the generic path with
// the CPU implementation (aten::convolution / aten::convolution_backward).
#include "aten/Common.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

const c10::OperatorHandle& findOp(const char* name, const char* overload) {
  static_cast<void>(overload);
  auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  return *new c10::OperatorHandle(handle);
}

void convolutionForward(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  static const c10::OperatorHandle& target = findOp("aten::convolution", "");
  runGeneric(op, stack, &target, {});
}

// convolution_backward_overrideable(grad_output, input, weight, stride, padding,
//   dilation, transposed, output_padding, groups, output_mask)
// convolution_backward(grad_output, input, weight, bias_sizes?, stride, ...)
void convolutionBackward(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  static const c10::OperatorHandle& target = findOp("aten::convolution_backward", "");
  runGeneric(op, stack, &target, [](torch::jit::Stack& s, size_t begin) {
    const at::Tensor& weight = s[begin + 2].toTensor();
    const bool transposed = s[begin + 6].toBool();
    const int64_t groups = s[begin + 8].toInt();
    const int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
    s.insert(s.begin() + static_cast<std::ptrdiff_t>(begin + 3),
             c10::IValue(std::vector<int64_t>{channels}));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&convolutionForward>());
  m.impl("convolution_backward_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&convolutionBackward>());
}

}  // namespace torchneuron
