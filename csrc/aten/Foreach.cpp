// Foreach.cpp — the in-place foreach ops (an optimizer's step) as one queued
// work item per call.
//
// PyTorch gives a PrivateUse1 device the composite foreach kernels, which
// call the per-tensor op once per tensor: PyTorch's default AdamW over 64
// parameters made about 500 host dispatches per step. Routed to the generic
// path instead, a foreach call is one queued item whose kernel is CPU's own
// foreach kernel (the same per-tensor ops, so the same bits): the host pays
// one dispatch, one Meta lookup and one launch per call. On the executor,
// the tensors of a list are shared among the compute threads when every one
// is small enough that its op runs on one thread anyway (QueuedKernel.h,
// listLength) and runs index by index in a fusion pass with the foreach
// calls queued behind it (Fusion.h). The unary functional forms
// (_foreach_sqrt) allocate their results and queue their .out form. Ops
// outside the fusion list (Fusion.h: their kernels' element split is known)
// and the other functional forms keep the composite kernels.
#include "aten/Common.h"
#include "aten/Fusion.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <string>
#include <unordered_map>

namespace torchneuron {
namespace {

void foreachEntry(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  genericFallback(op, stack);
}

// A functional unary foreach op (an optimizer's _foreach_sqrt) on dense
// floating-point lists: the results are allocated here, laid out as CPU's
// per-tensor kernel lays out a dense input's result (empty_like), and the
// op's .out form is queued like the in-place ones. Other lists take the
// per-tensor op, as the composite kernel would.
void functionalEntry(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::OperatorName& name = op.schema().operator_name();
  auto& d = c10::Dispatcher::singleton();
  const c10::List<at::Tensor> self = stack->back().toTensorList();
  bool dense = !self.empty();
  for (const at::Tensor& t : self) {
    dense = dense && isNeuron(t) && t.device() == self.get(0).device() &&
            at::isFloatingType(t.scalar_type()) && t.is_non_overlapping_and_dense() &&
            !t.is_conj() && !t.is_neg();
  }
  c10::List<at::Tensor> results;
  results.reserve(self.size());
  if (dense) {
    static thread_local std::unordered_map<std::string, c10::OperatorHandle> outs;
    auto it = outs.find(name.name);
    if (it == outs.end())
      it = outs.emplace(name.name, d.findSchemaOrThrow(name.name.c_str(), "out")).first;
    for (const at::Tensor& t : self) results.push_back(at::empty_like(t));
    torch::jit::Stack s{stack->back(), results};
    genericFallback(it->second, &s);
  } else {
    // "aten::_foreach_sqrt" -> "aten::sqrt", once per tensor.
    const std::string base = "aten::" + name.name.substr(std::string("aten::_foreach_").size());
    const c10::OperatorHandle one = d.findSchemaOrThrow(base.c_str(), "");
    for (const at::Tensor& t : self) {
      torch::jit::Stack s{t};
      one.callBoxed(&s);
      results.push_back(s.back().toTensor());
    }
  }
  stack->pop_back();
  stack->emplace_back(std::move(results));
}

// A unary functional foreach op with an .out form: (Tensor[] self) -> Tensor[].
bool unaryFunctional(const c10::OperatorName& name) {
  if (name.name.back() == '_' || !name.overload_name.empty() || !fusibleForeachName(name.name))
    return false;
  auto op = c10::Dispatcher::singleton().findOp(name);
  auto out = c10::Dispatcher::singleton().findOp({name.name, "out"});
  if (!op || !out) return false;
  const auto& s = op->schema();
  return s.arguments().size() == 1 && s.returns().size() == 1 &&
         s.arguments()[0].type()->str() == "Tensor[]" && s.returns()[0].type()->str() == "Tensor[]";
}

// "_foreach_add_" and the like, for ops on the fusion list.
bool routed(const c10::OperatorName& name) {
  return name.name.back() == '_' && fusibleForeachName(name.name);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    const bool functional = unaryFunctional(name);
    if (!routed(name) && !functional) continue;
    std::string op = name.name.substr(6);  // without "aten::"
    if (!name.overload_name.empty()) op += "." + name.overload_name;
    if (functional)
      m.impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&functionalEntry>());
    else
      m.impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&foreachEntry>());
  }
}

}  // namespace torchneuron
