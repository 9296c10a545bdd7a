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
// calls queued behind it (Fusion.h). The functional forms with an out= form
// (_foreach_sqrt, _foreach_add.List, _foreach_mul.Scalar, ...) allocate their
// results and queue that form. Ops outside the fusion list (Fusion.h: their
// kernels' element split is known) and the other functional forms (the
// .Tensor overloads) keep the composite kernels.
#include "aten/Common.h"
#include "aten/Fusion.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <unordered_map>

namespace torchneuron {
namespace {

// Whether the tensors of a foreach call's arguments lie on more than one
// device (an index's op then runs on its own tensors' device).
bool spansDevices(c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::Device> device;
  for (const c10::IValue& arg : args) {
    if (!arg.isTensorList()) continue;
    for (const at::Tensor& t : arg.toTensorList()) {
      if (!t.defined()) continue;
      if (!device) device = t.device();
      else if (t.device() != *device) return true;
    }
  }
  return false;
}

// Runs the op's composite kernel (one call of the per-tensor op per index,
// each on its own tensors' device: what a PrivateUse1 device gets without
// these routes, and what CUDA does with such lists). That kernel fills the
// CPU slot of every foreach op without a CPU kernel of its own; false
// (nothing run) for an op that has one.
bool runComposite(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
      !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd))
    return false;
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  return true;
}

void foreachEntry(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // Lists over several devices: one queued item cannot hold them.
  const size_t n = op.schema().arguments().size();
  if (spansDevices(torch::jit::last(*stack, n)) && runComposite(op, stack)) return;
  genericFallback(op, stack);
}

// The out= form of a functional foreach op on the fusion list whose
// arguments are tensor lists and scalars and which returns one tensor list
// (_foreach_sqrt -> .out, _foreach_add.List -> .List_out), if it has one.
std::optional<c10::OperatorName> outFormOf(const c10::OperatorName& name) {
  if (name.name.back() == '_' || !fusibleForeachName(name.name)) return std::nullopt;
  const std::string& overload = name.overload_name;
  if (!overload.empty() && overload != "Scalar" && overload != "ScalarList" && overload != "List")
    return std::nullopt;
  const c10::OperatorName outName{name.name, overload.empty() ? "out" : overload + "_out"};
  auto& d = c10::Dispatcher::singleton();
  auto op = d.findOp(name);
  if (!op || !d.findOp(outName)) return std::nullopt;
  const auto& schema = op->schema();
  if (schema.returns().size() != 1 || schema.returns()[0].type()->str() != "Tensor[]" ||
      schema.arguments().empty() || schema.arguments()[0].type()->str() != "Tensor[]")
    return std::nullopt;
  for (const auto& arg : schema.arguments()) {
    const std::string type = arg.type()->str();
    if (type != "Tensor[]" && type != "Scalar" && type != "Scalar[]") return std::nullopt;
  }
  return outName;
}

bool realScalar(const c10::IValue& v) { return !v.isComplexDouble(); }

// Whether CPU's per-tensor kernels give every result the layout and dtype of
// self's tensor at its index: every list's tensors are dense, on self's
// device, and of self's dtype, sizes and strides there (floating point), and
// every scalar is real (a float scalar does not promote a floating tensor).
bool likeSelf(c10::ArrayRef<c10::IValue> args) {
  const c10::List<at::Tensor> self = args[0].toTensorList();
  if (self.empty()) return false;
  const c10::Device device = self.get(0).device();
  for (const at::Tensor& t : self) {
    if (!isNeuron(t) || t.device() != device || !at::isFloatingType(t.scalar_type()) ||
        !t.is_non_overlapping_and_dense() || t.is_conj() || t.is_neg())
      return false;
  }
  for (size_t i = 1; i < args.size(); ++i) {
    const c10::IValue& arg = args[i];
    if (arg.isTensorList()) {
      const c10::List<at::Tensor> list = arg.toTensorList();
      if (list.size() != self.size()) return false;
      for (size_t j = 0; j < list.size(); ++j) {
        const at::Tensor t = list.get(j), s = self.get(j);
        if (t.device() != device || t.scalar_type() != s.scalar_type() || t.sizes() != s.sizes() ||
            t.strides() != s.strides() || t.is_conj() || t.is_neg())
          return false;
      }
    } else if (arg.isList()) {
      for (const c10::IValue& v : arg.toListRef())
        if (!realScalar(v)) return false;
    } else if (!realScalar(arg)) {
      return false;
    }
  }
  return true;
}

// A functional foreach op (an optimizer's _foreach_sqrt, SGD's
// _foreach_add(grads, params, alpha=weight_decay)): its results are
// allocated here and its out= form is queued like the in-place ops, one work
// item per call (which a list pass may run, ListLoop.h). The results take the
// layouts CPU's kernels give them: those of self's tensors when every operand
// matches them (likeSelf), else what the op's Meta kernel says.
void functionalEntry(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  // By operator (a pointer's hash), not by a name built per call.
  static thread_local std::unordered_map<c10::OperatorHandle, c10::OperatorHandle> outs;
  auto it = outs.find(op);
  if (it == outs.end()) {
    const c10::OperatorName& name = op.schema().operator_name();
    const auto outName = outFormOf(name);
    TORCH_INTERNAL_ASSERT(outName, fullName(name), " was routed without an out= form");
    it = outs.emplace(op, c10::Dispatcher::singleton().findSchemaOrThrow(
                              outName->name.c_str(), outName->overload_name.c_str()))
             .first;
  }
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(*stack, n);
  if (spansDevices(args) && runComposite(op, stack)) return;
  const c10::List<at::Tensor> self = args[0].toTensorList();
  c10::List<at::Tensor> results;
  results.reserve(self.size());
  if (likeSelf(args)) {
    for (const at::Tensor& t : self) results.push_back(at::empty_like(t));
  } else {
    // The layouts (and dtypes) from the op's Meta kernel, on Meta copies.
    torch::jit::Stack meta;
    for (const c10::IValue& arg : args) {
      if (!arg.isTensorList()) {
        meta.push_back(arg);
        continue;
      }
      c10::List<at::Tensor> copies;
      for (const at::Tensor& t : arg.toTensorList())
        copies.push_back(at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)));
      meta.emplace_back(std::move(copies));
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
    const at::Device device = self.empty() ? at::Device(at::kMeta) : self.get(0).device();
    for (const at::Tensor& m : meta.back().toTensorList())
      results.push_back(at::empty_strided(m.sizes(), m.strides(), m.options().device(device)));
  }
  torch::jit::Stack s(args.begin(), args.end());
  s.emplace_back(results);
  genericFallback(it->second, &s);
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(results));
}

// "_foreach_add_" and the like, for ops on the fusion list.
bool routed(const c10::OperatorName& name) {
  return name.name.back() == '_' && fusibleForeachName(name.name);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    const bool functional = outFormOf(name).has_value();
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
