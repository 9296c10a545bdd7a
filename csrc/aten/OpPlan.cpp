// OpPlan.cpp: see OpPlan.h.
#include "aten/OpPlan.h"

#include "aten/Fusion.h"

#include "aten/Common.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <mutex>
#include <unordered_map>

namespace torchneuron {
namespace {

bool isTensorLike(const c10::TypePtr& t) {
  c10::TypePtr e = t;
  if (auto opt = t->cast<c10::OptionalType>()) e = opt->getElementType();
  if (e->kind() == c10::TypeKind::TensorType) return true;
  if (auto list = e->cast<c10::ListType>()) {
    c10::TypePtr el = list->getElementType();
    if (auto o = el->cast<c10::OptionalType>()) el = o->getElementType();
    return el->kind() == c10::TypeKind::TensorType;
  }
  return false;
}

// The out= overload of a functional op ("foo.out" / "foo.bar_out"): the same
// arguments followed by one written Tensor per result.
std::optional<c10::OperatorHandle> findOutOverload(const c10::FunctionSchema& s, size_t numFresh) {
  const std::string& overload = s.overload_name();
  std::string outName = overload.empty() ? "out" : overload + "_out";
  auto out = c10::Dispatcher::singleton().findOp({s.name(), outName});
  if (!out) return std::nullopt;
  const auto& args = s.arguments();
  const auto& oargs = out->schema().arguments();
  if (oargs.size() != args.size() + numFresh) return std::nullopt;
  for (size_t i = 0; i < args.size(); ++i) {
    if (oargs[i].name() != args[i].name()) return std::nullopt;
  }
  for (size_t i = args.size(); i < oargs.size(); ++i) {
    const c10::AliasInfo* ai = oargs[i].alias_info();
    if (!ai || !ai->isWrite() || oargs[i].type()->kind() != c10::TypeKind::TensorType)
      return std::nullopt;
  }
  return out;
}

void makePlan(const c10::OperatorHandle& op, Plan& p) {
  const c10::FunctionSchema& s = op.schema();
  p.name = fullName(s.operator_name());
  p.counters = opCounters(p.name);
  for (const char* bn : {"aten::native_batch_norm", "aten::_native_batch_norm_legit",
                         "aten::_batch_norm_with_update"})
    p.batchNorm |= p.name.rfind(bn, 0) == 0;
  if (s.is_vararg() || s.is_varret()) return;
  const auto& args = s.arguments();
  bool anyWritten = false;
  for (const auto& a : args) {
    const c10::AliasInfo* ai = a.alias_info();
    bool written = ai && ai->isWrite();
    if (ai && !written) return;  // a view of an argument
    if (written && !isTensorLike(a.type())) return;
    anyWritten |= written;
    p.writtenArg.push_back(written);
    p.outArg.push_back(written && a.kwarg_only());
    p.generatorArg.push_back(isKindOrOptional(a.type(), c10::TypeKind::GeneratorType));
    p.hostValuesArg.push_back(readOnHost(s, p.hostValuesArg.size()));
  }
  for (const auto& r : s.returns()) {
    if (r.type()->kind() != c10::TypeKind::TensorType) return;
    const c10::AliasInfo* ai = r.alias_info();
    if (!ai) {
      p.returnArg.push_back(-1);
      p.numFresh++;
      continue;
    }
    if (!ai->isWrite()) return;
    int found = -1;
    for (size_t i = 0; i < args.size(); ++i) {
      const c10::AliasInfo* aa = args[i].alias_info();
      if (aa && aa->isWrite() && aa->beforeSets() == ai->beforeSets()) found = static_cast<int>(i);
    }
    if (found < 0) return;
    p.returnArg.push_back(found);
  }
  if (p.numFresh == 0 && !anyWritten) return;  // nothing to compute (e.g. record_stream)
  if (p.numFresh > 0) p.outOp = findOutOverload(s, p.numFresh);
  // An out= overload without a CPU kernel of its own is ATen's generated one
  // (CompositeExplicitAutograd: the functional kernel, then a copy into out);
  // the functional kernel alone computes its results in the outputs
  // (ResultPlacement) and saves that copy.
  if (p.outOp && !p.outOp->hasKernelForDispatchKey(c10::DispatchKey::CPU)) p.outOp.reset();
  p.eligible.store(true);
  return;
}

// Plans are made once per operator and never freed (a thread-local map then
// finds them without a lock); an operator whose Meta pass raised
// NotImplementedError is marked ineligible in place.
struct PlanCache {
  std::mutex mu;
  std::unordered_map<c10::OperatorHandle, Plan*> plans;
};
PlanCache& planCache() {
  static auto* cache = new PlanCache();
  return *cache;
}

// "aten::_foreach_sqrt.out(Tensor[] self, *, Tensor(a!)[] out) -> ()" gives
// "aten::sqrt.out(Tensor self, *, Tensor(a!) out)"; other schemas nothing.
std::optional<c10::OperatorHandle> perTensorOutOf(const c10::FunctionSchema& s) {
  const std::string prefix = "aten::_foreach_";
  const auto& args = s.arguments();
  if (s.overload_name() != "out" || s.name().rfind(prefix, 0) != 0 || args.size() != 2 ||
      !s.returns().empty() || args[0].type()->str() != "Tensor[]" ||
      args[1].type()->str() != "Tensor[]" || !args[1].kwarg_only())
    return std::nullopt;
  auto one = c10::Dispatcher::singleton().findSchema(
      {"aten::" + s.name().substr(prefix.size()), "out"});
  if (!one) return std::nullopt;
  const auto& oneArgs = one->schema().arguments();
  if (oneArgs.size() != 2 || oneArgs[0].type()->str() != "Tensor" ||
      oneArgs[1].type()->str() != "Tensor" || !oneArgs[1].kwarg_only())
    return std::nullopt;
  return *one;
}

}  // namespace

bool readOnHost(const c10::FunctionSchema& schema, size_t i) {
  const auto& a = schema.arguments()[i];
  return schema.name().rfind("aten::_foreach_", 0) == 0 && a.name() == "scalars" &&
         a.type()->kind() == c10::TypeKind::TensorType && !a.alias_info();
}

Plan* planFor(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<c10::OperatorHandle, Plan*> local;
  auto hit = local.find(op);
  if (hit != local.end()) return hit->second;
  PlanCache& c = planCache();
  std::lock_guard<std::mutex> lk(c.mu);
  Plan*& plan = c.plans[op];
  if (!plan) {
    plan = new Plan();
    makePlan(op, *plan);
    plan->fusible = fusibleOpName(plan->name);
    plan->listSplit = fusibleForeachName(plan->name);
    plan->serialRule = serialRuleFor(plan->name);
    if (plan->listSplit) plan->perTensorOut = perTensorOutOf(op.schema());
  }
  local.emplace(op, plan);
  return plan;
}

void markIneligible(const c10::OperatorHandle& op) { planFor(op)->eligible.store(false); }

}  // namespace torchneuron
