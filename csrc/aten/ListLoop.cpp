// ListLoop.cpp: which queued foreach kernels are loops (see ListLoop.h).
#include "aten/ListLoop.h"

#include "aten/QueuedKernel.h"
#include "core/Config.h"

#include <ATen/ATen.h>
#include <ATen/Version.h>  // at::get_cpu_capability

#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

namespace torchneuron {
namespace {

// The float ATen's kernel computes with for scalar `v`, or false when ATen
// would raise converting it (a finite double beyond float's range) or it is
// not a real number.
bool floatOf(const c10::IValue& v, float* out) {
  if (v.isDouble()) {
    const double d = v.toDouble();
    if (std::isfinite(d) && std::fabs(d) > FLT_MAX) return false;
    *out = static_cast<float>(d);
    return true;
  }
  if (v.isInt()) {
    *out = static_cast<float>(v.toInt());
    return true;
  }
  if (v.isBool()) {
    *out = v.toBool() ? 1.0f : 0.0f;
    return true;
  }
  return false;
}

// A list of float32 tensors, dense and of the first list's shape at each
// index (`first`: that list, or nullptr for this one).
bool floatList(const ArgSlot& slot, const TensorRefs* first) {
  if (slot.kind != ArgSlot::kTensorList) return false;
  if (first != nullptr && first->size() != slot.tensors.size()) return false;
  for (size_t j = 0; j < slot.tensors.size(); ++j) {
    const auto& ref = slot.tensors[j];
    if (!ref || ref->dtype != at::kFloat || !denseRowMajor(*ref)) return false;
    if (first != nullptr && (*first)[j]->sizes != ref->sizes) return false;
  }
  return true;
}

// One scalar, or one per index of a list of `length`.
bool scalarValues(const ArgSlot& slot, size_t length, std::vector<float>* out) {
  if (slot.kind != ArgSlot::kValue) return false;
  float f = 0;
  if (!slot.value.isList()) {
    if (!floatOf(slot.value, &f)) return false;
    out->assign(1, f);
    return true;
  }
  const c10::impl::GenericList list = slot.value.toList();
  if (list.size() != length) return false;
  out->clear();
  for (const c10::IValue& v : list) {
    if (!floatOf(v, &f)) return false;
    out->push_back(f);
  }
  return true;
}

// Whether sqrt steps give ATen's bits (loopsMatchAten): ATen's sqrt is MKL's,
// which another build may not use; the other kinds stay on without it.
std::atomic<bool>& sqrtLoopsOk() {
  static std::atomic<bool> ok{false};
  return ok;
}

std::atomic<bool>& sqrtLoopsOn() {  // setSqrtLoopsEnabled
  static std::atomic<bool> on{true};
  return on;
}

struct Form {
  LoopStep::Kind kind;
  int lists;       // tensor lists after self
  bool hasValue;   // a Scalar or Scalar[] after the lists
  bool hasAlpha;   // add.List's alpha after that
  bool out = false;  // an out= list last (the functional op's .X_out form)
};

// "_foreach_mul_.Scalar" and the like: the overloads whose CPU kernels are
// the per-tensor ops ListLoop.h reproduces.
bool formOf(const std::string& name, Form* form) {
  const std::string prefix = "aten::_foreach_";
  if (name.rfind(prefix, 0) != 0) return false;
  // sqrt's overloads have no name: "_foreach_sqrt_", "_foreach_sqrt.out".
  if (name == "aten::_foreach_sqrt_" || name == "aten::_foreach_sqrt.out") {
    *form = {LoopStep::kSqrt, 0, false, false, name.back() == 't'};
    return sqrtLoopsOk().load(std::memory_order_relaxed) &&
           sqrtLoopsOn().load(std::memory_order_relaxed);
  }
  const size_t dot = name.find('.');
  if (dot == std::string::npos) return false;
  std::string base = name.substr(prefix.size(), dot - prefix.size());
  std::string overload = name.substr(dot + 1);
  // The out= form of a functional op (what Foreach.cpp queues for
  // _foreach_add(...) and the like) computes what the in-place op does,
  // into `out`.
  const std::string outSuffix = "_out";
  if (overload.size() > outSuffix.size() &&
      overload.compare(overload.size() - outSuffix.size(), outSuffix.size(), outSuffix) == 0) {
    if (base.empty() || base.back() == '_') return false;
    overload.resize(overload.size() - outSuffix.size());
    base += '_';
    form->out = true;
  }
  const bool scalar = overload == "Scalar" || overload == "ScalarList";
  if (base == "mul_" || base == "div_" || base == "add_") {
    const auto kind = base == "mul_" ? LoopStep::kMul : base == "div_" ? LoopStep::kDiv : LoopStep::kAdd;
    if (scalar) *form = {kind, 0, true, false, form->out};
    else if (overload == "List") *form = {kind, 1, false, kind == LoopStep::kAdd, form->out};
    else return false;
    return true;
  }
  if (base == "lerp_" && overload == "Scalar") {
    *form = {LoopStep::kLerp, 1, true, false, form->out};
    return true;
  }
  if ((base == "addcmul_" || base == "addcdiv_") && scalar) {
    *form = {base == "addcmul_" ? LoopStep::kAddcmul : LoopStep::kAddcdiv, 2, true, false,
             form->out};
    return true;
  }
  return false;
}

}  // namespace

LoopStep ListLoopOp::at(int64_t index, int64_t begin) const {
  auto ptr = [&](const TensorRefs* list) -> float* {
    return list == nullptr ? nullptr : static_cast<float*>((*list)[index]->data) + begin;
  };
  LoopStep s{kind, ptr(out != nullptr ? out : self), ptr(self), ptr(a), ptr(b), 0.0f, alpha};
  if (!values.empty()) s.value = values.size() == 1 ? values[0] : values[index];
  return s;
}

bool describeListLoop(const Kernel& k, ListLoopOp* out) {
  Form form{};
  if (!k.outs.empty() || !formOf(k.plan->name, &form)) return false;
  const size_t expected =
      1 + form.lists + (form.hasValue ? 1 : 0) + (form.hasAlpha ? 1 : 0) + (form.out ? 1 : 0);
  if (k.slots.size() != expected || !floatList(k.slots[0], nullptr)) return false;
  const TensorRefs* self = &k.slots[0].tensors;
  const TensorRefs* lists[2] = {nullptr, nullptr};
  for (int i = 0; i < form.lists; ++i) {
    if (!floatList(k.slots[1 + i], self)) return false;
    lists[i] = &k.slots[1 + i].tensors;
  }
  ListLoopOp op;
  op.kind = form.kind;
  op.self = self;
  op.a = lists[0];
  op.b = lists[1];
  size_t next = 1 + form.lists;
  if (form.hasValue && !scalarValues(k.slots[next++], self->size(), &op.values)) return false;
  if (form.hasAlpha) {
    std::vector<float> alpha;
    if (!scalarValues(k.slots[next], self->size(), &alpha) || alpha.size() != 1) return false;
    op.alpha = alpha[0];
  }
  if (form.out) {
    if (!floatList(k.slots.back(), self)) return false;
    op.out = &k.slots.back().tensors;
  }
  *out = std::move(op);
  return true;
}

namespace {
std::atomic<bool>& loopsFlag() {
  static std::atomic<bool> on{backendConfig().list_loops};
  return on;
}
// One op checked against ATen's kernel: `aten` applies it to CPU tensors
// (self, a, b) in place, `step` is the loop's form of it.
struct Probe {
  const char* name;
  LoopStep step;  // pointers filled in by loopsMatchAten
  bool usesA, usesB;
  void (*aten)(at::Tensor& self, const at::Tensor& a, const at::Tensor& b);
};

// Whether the loops give ATen's bits on this build: every kind, each of its
// forms, on 141 elements (a vector body and a scalar tail at any vector width
// up to 16 lanes), from a fixed seed of its own (torch's generators are not
// touched). A torch whose kernels compute otherwise (another compiler's
// contraction, a changed formula) turns the loops off instead of changing
// numbers; the op that differed is named in a warning.
bool loopsMatchAten() {
  constexpr int64_t n = 141;
  std::mt19937 rng(20261206);
  std::normal_distribution<float> normal;
  auto values = [&](bool positive) {
    at::Tensor t = at::empty({n}, at::kFloat);
    float* p = t.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = positive ? std::fabs(normal(rng)) + 0.5f : normal(rng);
    return t;
  };
  using K = LoopStep;
  const Probe probes[] = {
      {"mul_ (scalar)", {K::kMul, nullptr, nullptr, nullptr, nullptr, 0.9987f, 1}, false, false,
       [](at::Tensor& s, const at::Tensor&, const at::Tensor&) { s.mul_(0.9987); }},
      {"mul_", {K::kMul, nullptr, nullptr, nullptr, nullptr, 0, 1}, true, false,
       [](at::Tensor& s, const at::Tensor& a, const at::Tensor&) { s.mul_(a); }},
      {"div_ (scalar)", {K::kDiv, nullptr, nullptr, nullptr, nullptr, 1.7f, 1}, false, false,
       [](at::Tensor& s, const at::Tensor&, const at::Tensor&) { s.div_(1.7); }},
      {"div_", {K::kDiv, nullptr, nullptr, nullptr, nullptr, 0, 1}, true, false,
       [](at::Tensor& s, const at::Tensor& a, const at::Tensor&) { s.div_(a.abs() + 0.5); }},
      {"add_ (scalar)", {K::kAdd, nullptr, nullptr, nullptr, nullptr, 1e-3f, 1}, false, false,
       [](at::Tensor& s, const at::Tensor&, const at::Tensor&) { s.add_(1e-3); }},
      {"add_ (alpha)", {K::kAdd, nullptr, nullptr, nullptr, nullptr, 0, 0.37f}, true, false,
       [](at::Tensor& s, const at::Tensor& a, const at::Tensor&) { s.add_(a, 0.37); }},
      {"lerp_ (weight < 0.5)", {K::kLerp, nullptr, nullptr, nullptr, nullptr, 0.1f, 1}, true, false,
       [](at::Tensor& s, const at::Tensor& a, const at::Tensor&) { s.lerp_(a, 0.1); }},
      {"lerp_ (weight >= 0.5)", {K::kLerp, nullptr, nullptr, nullptr, nullptr, 0.7f, 1}, true, false,
       [](at::Tensor& s, const at::Tensor& a, const at::Tensor&) { s.lerp_(a, 0.7); }},
      {"addcmul_", {K::kAddcmul, nullptr, nullptr, nullptr, nullptr, 0.3f, 1}, true, true,
       [](at::Tensor& s, const at::Tensor& a, const at::Tensor& b) { s.addcmul_(a, b, 0.3); }},
      {"addcdiv_", {K::kAddcdiv, nullptr, nullptr, nullptr, nullptr, -0.01f, 1}, true, true,
       [](at::Tensor& s, const at::Tensor& a, const at::Tensor& b) { s.addcdiv_(a, b, -0.01); }},
      {"sqrt_", {K::kSqrt, nullptr, nullptr, nullptr, nullptr, 0, 1}, false, false,
       [](at::Tensor& s, const at::Tensor&, const at::Tensor&) { s.sqrt_(); }},
  };
  for (const Probe& probe : probes) {
    const bool sqrt = probe.step.kind == K::kSqrt;
    if (sqrt && !sqrtStepAvailable()) continue;
    const at::Tensor self = values(false), a = values(false), b = values(true);
    if (sqrt) {
      // Negative numbers (NaN's bits), signed zeros, infinities, NaN and
      // subnormals (a kernel that flushes them), in the body and the tail.
      const float special[] = {-0.0f, 0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, FLT_MAX};
      float* p = self.data_ptr<float>();
      for (size_t i = 0; i < sizeof special / sizeof *special; ++i) p[3 * i] = p[n - 1 - i] = special[i];
    }
    // div_ by a tensor divides by |a| + 0.5, as ATen's call above does.
    const at::Tensor aLoop = probe.step.kind == K::kDiv ? a.abs() + 0.5 : a;
    at::Tensor expected = self.clone();
    probe.aten(expected, a, b);
    at::Tensor got = self.clone();
    LoopStep step = probe.step;
    step.out = got.data_ptr<float>();
    step.self = step.out;
    step.a = probe.usesA ? aLoop.data_ptr<float>() : nullptr;
    step.b = probe.usesB ? b.data_ptr<float>() : nullptr;
    runLoopSteps(&step, 1, n);
    const bool same =
        std::memcmp(got.data_ptr<float>(), expected.data_ptr<float>(), n * sizeof(float)) == 0;
    if (sqrt) {
      // A torch whose sqrt is not MKL's: its kernel keeps computing it.
      if (same) {
        sqrtLoopsOk().store(true);
      } else {
        TORCH_WARN("torchneuron: list loops leave sqrt to its CPU kernel: MKL's vmsSqrt "
                   "differs from this torch build's sqrt (csrc/aten/ListLoopKernels.cpp)");
      }
      continue;
    }
    if (!same) {
      TORCH_WARN("torchneuron: list loops are off: their ", probe.name,
                 " differs from this torch build's CPU kernel (csrc/aten/ListLoop.h)");
      return false;
    }
  }
  return true;
}

}  // namespace

bool listLoopsAvailable() {
  // ATen's kernels of these ops are its AVX2 build on AVX-512 machines too
  // (REGISTER_DISPATCH leaves AVX-512 to the AVX2 kernel): both are compiled
  // with FMA, and so have the forms the loops reproduce. Its DEFAULT build
  // (ATEN_CPU_CAPABILITY=default) has none: loops are off there. The loops
  // themselves need AVX-512F.
  // A first use checks them against ATen's kernels (loopsMatchAten).
  static const bool on = [] {
    const std::string capability = at::get_cpu_capability();
    if ((capability != "AVX2" && capability != "AVX512") || !__builtin_cpu_supports("avx512f"))
      return false;
    try {
      return loopsMatchAten();
    } catch (const std::exception&) {
      return false;  // no host memory for 141 floats: no loops either
    }
  }();
  return on;
}

bool listLoopsEnabled() {
  return listLoopsAvailable() && loopsFlag().load(std::memory_order_relaxed);
}

void setListLoopsEnabled(bool on) { loopsFlag().store(on); }

void setSqrtLoopsEnabled(bool on) { sqrtLoopsOn().store(on); }

}  // namespace torchneuron
