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
// listSplitLength). Ops outside the fusion list (Fusion.h: their kernels'
// element split is known) and the functional forms (they return lists, which
// the generic path does not queue) keep the composite kernels.
#include "aten/Common.h"
#include "aten/Fusion.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>

namespace torchneuron {
namespace {

void foreachEntry(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  genericFallback(op, stack);
}

// "_foreach_add_" and the like, for ops on the fusion list.
bool routed(const c10::OperatorName& name) {
  const std::string prefix = "aten::_foreach_";
  if (name.name.rfind(prefix, 0) != 0 || name.name.back() != '_') return false;
  return fusibleForeachName(name.name);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (!routed(name)) continue;
    std::string op = name.name.substr(6);  // without "aten::"
    if (!name.overload_name.empty()) op += "." + name.overload_name;
    m.impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&foreachEntry>());
  }
}

}  // namespace torchneuron
