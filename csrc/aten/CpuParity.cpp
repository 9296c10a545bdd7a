// CpuParity.cpp — neuron runs CPU's own kernel wherever CPU has one.
//
// Many ATen ops have both a dedicated CPU kernel and a generic
// CompositeExplicitAutograd (or CompositeImplicitAutograd) decomposition
// that every other backend gets by default (native_layer_norm, for example, decomposes into batch norm). The
// two are not bitwise identical, and our promise is CPU's bits. So at start-up
// every such op without a neuron kernel of its own is routed to the generic
// path, which runs the CPU kernel on device memory (asynchronously where it
// can). A few ops need it although they have no decomposition:
// convolution (PrivateUse1 would ask for convolution_overrideable) and
// _fused_sdp_choice (CPU's choice of attention kernel, made from metadata).
#include "aten/Common.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <torch/library.h>

#include <mutex>
#include <string>
#include <unordered_set>

namespace torchneuron {
namespace {

void genericEntry(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  genericFallback(op, stack);
}

// Convolutions give their results in the memory format PyTorch's own rules
// name for this device: for a backend other than CPU/CUDA/XPU/MPS that is the
// contiguous format (at::native::_determine_backend_memory_format of the
// Overrideable backend; FakeTensor, and so torch.compile and export, predict
// the same). CPU's kernel, which computes them, keeps channels_last inputs
// channels_last: the values are CPU's, laid out contiguously (a queued copy).
void convolutionEntry(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  genericFallback(op, stack);
  const size_t n = op.schema().returns().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    c10::IValue& iv = (*stack)[i];
    if (!iv.isTensor()) continue;
    const at::Tensor& t = iv.toTensor();
    if (t.defined() && t.dim() >= 3 && !t.is_contiguous()) iv = t.contiguous();
  }
}
bool isConvolution(const std::string& name) {
  return name == "aten::convolution" || name == "aten::convolution_backward";
}

// A CPU view of a device tensor for kernels that read metadata only
// (sizes, strides, dtype, requires_grad), never data: no need to wait.
at::Tensor metadataAlias(const at::Tensor& t) {
  if (!isNeuron(t)) return t;
  at::Tensor a = cpuAlias(t);
  if (t.requires_grad()) a.set_requires_grad(true);
  return a;
}

void metadataOnly(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    c10::IValue& iv = (*stack)[i];
    if (iv.isTensor()) iv = metadataAlias(iv.toTensor());
  }
  recordOp(fullName(op.schema().operator_name()), OpPath::Native);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

// Composite ops whose neuron decomposition would differ from CPU, or that
// PrivateUse1 cannot run at all without a kernel.
const std::unordered_set<std::string>& explicitOps() {
  static const std::unordered_set<std::string> ops = {
      "aten::convolution",
      "aten::convolution_backward",
      "aten::conj_physical_",  // its composite calls a DispatchStub only CPU/CUDA fill
      // addr_ calls addr_out(self, self): the kernel tells in-place by C++
      // object identity (&result == &self), which a boxed call cannot keep
      "aten::addr_",
      // its composite refuses devices other than CPU, CUDA and XPU by name
      "aten::mode.values",
  };
  return ops;
}

// scaled_dot_product_attention asks this stub which kernel to use (through
// _fused_sdp_choice's Meta kernel, so also while tracing with fake tensors);
// we answer what CPU would answer, so neuron runs CPU's attention kernel
// (flash attention for CPU where it applies) and matches CPU bit for bit.
// CPU's choice reads sizes, strides, dtypes and requires_grad only, so it is
// called on the tensors as they are: real, fake or with symbolic sizes.
// (Re-dispatching on CPU aliases would hand real tensors to a fake mode.)
int64_t fusedSdpChoice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<at::Tensor>& mask, double dropout, bool causal,
                       std::optional<double> scale, bool gqa) {
  return at::native::_fused_sdp_choice_cpp(q, k, v, mask, dropout, causal, scale, gqa);
}

}  // namespace
}  // namespace torchneuron

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchneuron::fusedSdpChoice)
}

namespace torchneuron {

void registerCpuParityKernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Lives for the process: registrations end with their Library.
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                   __FILE__, __LINE__);
    static std::vector<std::string> names;  // Library::impl keeps the pointer
    auto& dispatcher = c10::Dispatcher::singleton();
    std::vector<std::pair<std::string, bool>> todo;  // (name, metadata only)
    for (const c10::OperatorName& on : dispatcher.getAllOpNames()) {
      if (on.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(on);
      if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
      const std::string name = fullName(on);
      if (name == "aten::_fused_sdp_choice") {
        todo.emplace_back(name, true);
        continue;
      }
      const bool cpuKernel = op->hasKernelForDispatchKey(c10::DispatchKey::CPU);
      // A CPU kernel next to a decomposition other backends get (explicit,
      // or implicit as for silu_backward and mish_backward).
      const bool composite =
          op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
      if ((cpuKernel && composite) || explicitOps().count(name)) todo.emplace_back(name, false);
    }
    names.reserve(todo.size());
    for (auto& [name, meta] : todo) {
      names.push_back(name);
      lib->impl(names.back().c_str(),
                meta                 ? torch::CppFunction::makeFromBoxedFunction<&metadataOnly>()
                : isConvolution(name) ? torch::CppFunction::makeFromBoxedFunction<&convolutionEntry>()
                                      : torch::CppFunction::makeFromBoxedFunction<&genericEntry>());
    }
  });
}

}  // namespace torchneuron
