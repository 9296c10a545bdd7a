// The direct paths of add, sub, mul and div (DirectOp.h); large contiguous
// calls are queued fusible (Fusion.h).
#include "aten/DirectOp.h"
#include "aten/Fusion.h"
#include "aten/HostScalar.h"
#include "aten/ListLoop.h"
#include "aten/LoopStep.h"
#include "core/SerialCompute.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/sub_cpu_dispatch.h>
#include <ATen/ops/result_type.h>
#include <torch/library.h>

#include <cfloat>
#include <cmath>

namespace torchneuron {
namespace {

enum class Kind { Add, Sub, Mul, Div };

// Each kind's op: its overloads' names, its generic-path schema names, and
// whether it takes alpha.
struct OpNames {
  const char* functional;
  const char* inplace;
  const char* out;
  const char* name;          // "aten::add": the functional and out= schemas' name
  const char* inplaceName;   // "aten::add_"
  bool alpha;
};
constexpr OpNames kOps[] = {
    {"aten::add.Tensor", "aten::add_.Tensor", "aten::add.out", "aten::add", "aten::add_", true},
    {"aten::sub.Tensor", "aten::sub_.Tensor", "aten::sub.out", "aten::sub", "aten::sub_", true},
    {"aten::mul.Tensor", "aten::mul_.Tensor", "aten::mul.out", "aten::mul", "aten::mul_", false},
    {"aten::div.Tensor", "aten::div_.Tensor", "aten::div.out", "aten::div", "aten::div_", false},
};
constexpr const OpNames& namesOf(Kind k) { return kOps[static_cast<int>(k)]; }

bool fastDtype(at::ScalarType t) {
  switch (t) {
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kHalf: case at::kFloat: case at::kDouble: case at::kBFloat16: case at::kBool:
    case at::kComplexFloat: case at::kComplexDouble:
      return true;
    default:
      return false;
  }
}

bool usableOperand(const at::Tensor& t, c10::Device device) {
  if (!t.defined() || t.is_conj() || t.is_neg()) return false;
  if (t.device() == device) return true;
  return t.device().is_cpu() && t.dim() == 0;
}

// Alpha must be acceptable to the CPU kernel without error.
bool alphaIsSimple(const at::Scalar& alpha, at::ScalarType result) {
  if (alpha.isIntegral(/*includeBool=*/false)) {
    return !(result == at::kBool && alpha.toLong() != 1);
  }
  if (alpha.isFloatingPoint()) return at::isFloatingType(result) || at::isComplexType(result);
  return false;
}

// Output strides for a result of shape `shape`: those of a dense same-shape
// input (like TensorIterator), else contiguous.
at::Tensor allocateOutput(c10::IntArrayRef shape, at::ScalarType dtype, const at::Tensor& a,
                          const at::Tensor& b) {
  for (const at::Tensor* t : {&a, &b}) {
    if (isNeuron(*t) && t->sizes() == shape && t->is_non_overlapping_and_dense()) {
      return emptyDeviceStrided(shape, t->strides(), dtype);
    }
  }
  return emptyDevice(shape, dtype);
}

void compute(Kind kind, at::Tensor out, const at::Tensor& a, const at::Tensor& b,
             const at::Scalar& alpha) {
  switch (kind) {
    case Kind::Add: at::cpu::add_out(out, a, b, alpha); break;
    case Kind::Sub: at::cpu::sub_out(out, a, b, alpha); break;
    case Kind::Mul: at::cpu::mul_out(out, a, b); break;
    case Kind::Div: at::cpu::div_out(out, a, b); break;
  }
}

// The loop step computing `kind` (sub is add with -alpha, as in ATen).
LoopStep::Kind stepKindOf(Kind kind) {
  return kind == Kind::Mul ? LoopStep::kMul : kind == Kind::Div ? LoopStep::kDiv : LoopStep::kAdd;
}

// A flat float32 op on dense device operands of the result's size (the
// second may be a CPU scalar: x * 0.5), as a list loop's step (ListLoop.h):
// each element with the roundings ATen's kernel gives it (add and sub fuse
// alpha's product into the add, as ATen's kernel does; sub is add with
// -alpha, as in ATen; a scalar is converted to float as TensorIterator
// converts it), checked against ATen's kernels, scalar forms included, at
// their first use. On the worker it replaces building a TensorIterator for
// ATen's kernel, which was nearly all of a small op's device time (the
// arithmetic of a 64-float add is about 1% of it). A float32 device 0-dim
// second operand is the step's scalar too, read when the step runs (ATen's
// kernel sees it as the same 0-dim CPU scalar): *valueAt then points at it.
// Where the loops are off or unavailable, or an operand is another dtype
// or a scalar first, or alpha does not convert to float as ATen converts
// it: false.
bool loopStepOf(Kind kind, const FlatOperand& out, const FlatOperand& a, const FlatOperand& b,
                const at::Scalar& alpha, LoopStep* step, const float** valueAt) {
  for (const FlatOperand* o : {&out, &a})
    if (o->host.defined() || o->zeroDim || o->dtype != at::kFloat) return false;
  const bool scalar = b.host.defined();
  if (!scalar && b.dtype != at::kFloat) return false;
  if (scalar && !at::isFloatingType(b.host.scalar_type()) &&
      !at::isIntegralType(b.host.scalar_type(), /*includeBool=*/true))
    return false;
  float alphaF = 1.0f;
  if (kind == Kind::Add || kind == Kind::Sub) {
    if (alpha.isIntegral(/*includeBool=*/false)) {
      alphaF = static_cast<float>(alpha.toLong());
    } else if (alpha.isFloatingPoint()) {
      // ATen raises where a finite alpha overflows float: its kernel then.
      const double d = alpha.toDouble();
      if (!std::isfinite(d) || std::fabs(d) > FLT_MAX) return false;
      alphaF = static_cast<float>(d);
    } else {
      return false;
    }
    if (kind == Kind::Sub) alphaF = -alphaF;
  }
  if (!listLoopsEnabled()) return false;
  const bool tensor = !scalar && !b.zeroDim;
  *step = {stepKindOf(kind), static_cast<float*>(out.data), static_cast<const float*>(a.data),
           tensor ? static_cast<const float*>(b.data) : nullptr, nullptr,
           scalar ? hostScalarAsFloat(b.host) : 0.0f, alphaF};
  *valueAt = b.zeroDim ? static_cast<const float*>(b.data) : nullptr;
  return true;
}

// Step `s` on elements [begin, end), split among the compute threads as
// ATen splits an elementwise kernel (inside a fusion pass's parallel
// region: on the calling thread). The loop gives every element the same
// form wherever a split falls.
void runStepRange(const LoopStep& s, const float* valueAt, int64_t begin, int64_t end) {
  LoopStep base = s;
  if (valueAt != nullptr) base.value = *valueAt;
  referenceParallelFor(begin, end, at::internal::GRAIN_SIZE, [&](int64_t lo, int64_t hi) {
    LoopStep t = base;
    t.out += lo;
    t.self += lo;
    if (t.a != nullptr) t.a += lo;
    runLoopSteps(&t, 1, hi - lo);
  });
}

// A float32 op on dense device operands where one operand repeats along a
// single run of broadcast dims (x * rstd[..., None], w * x, q * cos[None,
// None]) as a repeat step (LoopStep.h) instead of ATen's kernel behind a
// TensorIterator. Only ops whose element is one IEEE operation either way
// (mul, div, add and sub with alpha 1), so the form that computes an
// element (vector body, row tail, this loop) cannot change its bits.
bool repeatStepOf(Kind kind, const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                  const at::Scalar& alpha, RepeatStep* r) {
  if (out.scalar_type() != at::kFloat || !out.is_contiguous() || out.dim() == 0) return false;
  for (const at::Tensor* t : {&a, &b})
    if (!isNeuron(*t) || t->dim() == 0 || t->scalar_type() != at::kFloat || !t->is_contiguous())
      return false;
  if (kind == Kind::Add || kind == Kind::Sub) {
    const bool one = alpha.isIntegral(/*includeBool=*/false) ? alpha.toLong() == 1
                     : alpha.isFloatingPoint()               ? alpha.toDouble() == 1.0
                                                             : false;
    if (!one) return false;
  }
  const bool aFull = a.sizes() == out.sizes(), bFull = b.sizes() == out.sizes();
  if (aFull == bFull) return false;  // both full: flat; neither: two broadcasts
  const at::Tensor& repeated = aFull ? b : a;
  // The dims where the repeated operand is 1 and the output is not must be
  // one run (dims of size 1 in the output aside): the operand is then blocks
  // of `inner` elements, each read `rep` times in a row.
  const int64_t nd = out.dim(), offset = nd - repeated.dim();
  int64_t inner = 1, rep = 1;
  int state = 0;  // 0: before the run, 1: in it, 2: after it
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t os = out.size(d), rs = d < offset ? 1 : repeated.size(d - offset);
    if (os == 1) continue;
    if (rs == os) {
      if (state == 1) state = 2;
      if (state == 2) inner *= os;
    } else {
      if (state == 2) return false;
      state = 1;
      rep *= os;
    }
  }
  if (state == 0) return false;
  // Short stretches would cost more than ATen's loop.
  const bool rows = inner == 1 && rep >= 16 && aFull;
  if (!rows && inner < 16) return false;
  if (!listLoopsEnabled()) return false;
  r->step = {stepKindOf(kind), out.mutable_data_ptr<float>(), a.const_data_ptr<float>(),
             b.const_data_ptr<float>(), nullptr, 0.0f, kind == Kind::Sub ? -1.0f : 1.0f};
  r->inner = inner;
  r->rep = rep;
  r->repeatSelf = !aFull;
  return true;
}

void runRepeatRange(const RepeatStep& s, int64_t begin, int64_t end) {
  referenceParallelFor(begin, end, at::internal::GRAIN_SIZE,
                       [&](int64_t lo, int64_t hi) { runRepeatStep(s, lo, hi); });
}

// A repeat step, for a fusion pass: its repeated operand is read across
// blocks, so enqueue lists it in acrossReads (nothing the pass writes may
// overlap it, Fusion.h), unless it is a value per row.
struct RepeatOp final : FusibleOp {
  RepeatStep step;
  void run() override { runRange(0, numel); }
  void runRange(int64_t begin, int64_t end) override { runRepeatRange(step, begin, end); }
};

// The queued op, for a fusion pass (Fusion.h) when every operand is a
// scalar or contiguous of the output's shape (a flat call, DirectOp.h).
struct FastOp final : FusibleOp {
  Kind kind;
  FlatOperand out, a, b;
  at::Scalar alpha;
  at::ScalarType scalarType;  // of CPU scalar operands (scalarTypeFor)
  bool loop = false;          // computed as `step` (loopStepOf)
  LoopStep step{};
  const float* valueAt = nullptr;  // the step's scalar, a device 0-dim operand
  void run() override { runRange(0, numel); }
  void runRange(int64_t begin, int64_t end) override {
    if (loop) return runStepRange(step, valueAt, begin, end);
    compute(kind, out.piece(begin, end), a.piece(begin, end, scalarType),
            b.piece(begin, end, scalarType), alpha);
  }
};

// The dtype a CPU scalar operand is handed to the kernel in: the one its
// TensorIterator computes in (the operands' result type), where the
// kernel would convert it to that anyway (HostScalar.h); else Undefined.
at::ScalarType scalarTypeFor(at::ScalarType resultType) {
  return convertibleScalarType(resultType) ? resultType : at::ScalarType::Undefined;
}

bool fusible(const at::Tensor& t, const at::Tensor& out) {
  if (t.device().is_cpu() || t.dim() == 0) return true;
  return t.sizes() == out.sizes() && t.is_contiguous();
}

void enqueue(Kind kind, const char* name, const at::Tensor& out, const at::Tensor& a,
             const at::Tensor& b, const at::Scalar& alpha, at::ScalarType resultType) {
  auto stream = getCurrentStream(out.device().index());
  const at::ScalarType scalarType = scalarTypeFor(resultType);
  const bool flat = out.is_contiguous() && out.dim() > 0 && fusible(a, out) && fusible(b, out);
  if (flat && out.numel() >= kMinFusibleElements && fusionEnabled()) {
    auto op = std::make_unique<FastOp>();
    op->kind = kind;
    op->out = FlatOperand::of(out, /*written=*/true);
    op->a = FlatOperand::of(a);
    op->b = FlatOperand::of(b);
    op->alpha = alpha;
    op->scalarType = scalarType;
    op->numel = out.numel();
    op->loop = loopStepOf(kind, op->out, op->a, op->b, alpha, &op->step, &op->valueAt);
    if (op->loop) countFlatLoopOp();
    launchFusible(stream, describeDirect(name, out, {&a, &b}), std::move(op));
    return;
  }
  if (flat) {
    FlatOperand ro = FlatOperand::of(out, true), ra = FlatOperand::of(a), rb = FlatOperand::of(b);
    LoopStep step;
    const float* valueAt = nullptr;
    if (loopStepOf(kind, ro, ra, rb, alpha, &step, &valueAt)) {
      countFlatLoopOp();
      launchOnStream(stream, name, [step, valueAt, numel = out.numel()]() {
        runStepRange(step, valueAt, 0, numel);
      });
      return;
    }
    launchOnStream(stream, name, [kind, numel = out.numel(), ro = std::move(ro),
                                  ra = std::move(ra), rb = std::move(rb), alpha,
                                  scalarType]() {
      compute(kind, ro.cpu(numel), ra.cpu(numel, scalarType),
              rb.cpu(numel, scalarType), alpha);
    });
    return;
  }
  RepeatStep repeat;
  if (repeatStepOf(kind, out, a, b, alpha, &repeat)) {
    countBroadcastLoopOp();
    if (out.numel() >= kMinFusibleElements && fusionEnabled()) {
      auto op = std::make_unique<RepeatOp>();
      op->step = repeat;
      op->numel = out.numel();
      const at::Tensor& r = repeat.repeatSelf ? a : b;
      // A value per row (x - mean[..., None]) is a plain read: it may follow
      // the row op that computes it in a pass (Fusion.h).
      if (repeat.inner != 1) op->acrossReads.push_back({r.const_data_ptr(), r.nbytes()});
      launchFusible(stream, describeDirect(name, out, {&a, &b}), std::move(op));
      return;
    }
    launchOnStream(stream, name,
                   [repeat, numel = out.numel()]() { runRepeatRange(repeat, 0, numel); });
    return;
  }
  launchOnStream(stream, name, [kind, ro = Operand::of(out, /*written=*/true), ra = Operand::of(a),
                                rb = Operand::of(b), alpha, scalarType]() {
    compute(kind, ro.cpu(), ra.cpuAs(scalarType), rb.cpuAs(scalarType), alpha);
  });
}

enum class Mode { Functional, InPlace, Out };

// Tries the fast path; returns an undefined tensor when the generic path
// must run.
at::Tensor tryFast(Kind kind, const char* name, const at::Tensor& self, const at::Tensor& other,
                   const at::Scalar& alpha, Mode mode, const at::Tensor* out_arg) {
  if (!isNeuron(self)) return {};
  const c10::Device device = self.device();
  if (!usableOperand(self, device) || !usableOperand(other, device)) return {};
  if (self.scalar_type() == at::kBool && kind == Kind::Add) return {};
  // CPU's sub refuses bool operands (the generic path raises its error).
  if (kind == Kind::Sub && (self.scalar_type() == at::kBool || other.scalar_type() == at::kBool))
    return {};
  // Only dtypes CPU's add and mul kernels have: the others (uint16/32/64,
  // float8) take the generic path, which raises CPU's NotImplementedError at
  // the op instead of failing a queued kernel.
  for (const at::Tensor* t : {&self, &other})
    if (!fastDtype(t->scalar_type())) return {};
  at::ScalarType rtype;
  at::DimVector shape;
  try {
    // Operands of one dtype give that dtype (at::result_type, without its
    // dispatcher call); equal sizes need no broadcast.
    rtype = self.scalar_type() == other.scalar_type() ? self.scalar_type()
                                                      : at::result_type(self, other);
    shape = self.sizes() == other.sizes() ? at::DimVector(self.sizes())
                                          : at::infer_size_dimvector(self.sizes(), other.sizes());
  } catch (const c10::Error&) {
    return {};
  }
  // Nor results of other dtypes (bfloat16 + a complex number gives
  // BComplex32, which CPU's kernels lack).
  if (!fastDtype(rtype)) return {};
  if (namesOf(kind).alpha && !alphaIsSimple(alpha, rtype)) return {};
  // True division of integers gives the default float dtype: the generic path.
  if (kind == Kind::Div && !(at::isFloatingType(rtype) || at::isComplexType(rtype))) return {};
  // A zero-element result's strides are TensorIterator's choice (a sliced
  // input's are not kept): the generic path gives CPU's.
  if (mode == Mode::Functional && c10::multiply_integers(shape) == 0) return {};
  OnDevice onDevice(device);  // for the allocation and the launch
  at::Tensor out;
  if (mode == Mode::Functional) {
    out = allocateOutput(shape, rtype, self, other);
  } else {
    out = mode == Mode::InPlace ? self : *out_arg;
    if (!isNeuron(out) || out.device() != device || out.sizes() != c10::IntArrayRef(shape)) {
      return {};
    }
    if (out.is_conj() || out.is_neg()) return {};
    if (!at::canCast(rtype, out.scalar_type())) return {};
    if (at::has_internal_overlap(out) != at::MemOverlap::No) return {};
    for (const at::Tensor* in : {&self, &other}) {
      if (isNeuron(*in) && at::get_overlap_status(out, *in) == at::MemOverlapStatus::Partial) {
        return {};
      }
    }
  }
  if (out.numel() > 0) enqueue(kind, name, out, self, other, alpha, rtype);
  return out;
}

// The three overloads of each kind, with or without alpha. Their counters
// and generic-path handles are per kind (static locals of each instance).
template <Kind K>
at::Tensor functional(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  static OpCounters* counters = opCounters(namesOf(K).functional);
  at::Tensor r = tryFast(K, namesOf(K).functional, self, other, alpha, Mode::Functional, nullptr);
  if (r.defined()) {
    recordOp(counters, OpPath::Async);
    return r;
  }
  static const auto& op = genericOp(namesOf(K).name, "Tensor");
  return namesOf(K).alpha ? viaGeneric(op, {self, other, alpha}) : viaGeneric(op, {self, other});
}

template <Kind K>
at::Tensor& inplace(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  static OpCounters* counters = opCounters(namesOf(K).inplace);
  if (tryFast(K, namesOf(K).inplace, self, other, alpha, Mode::InPlace, nullptr).defined()) {
    recordOp(counters, OpPath::Async);
    return self;
  }
  static const auto& op = genericOp(namesOf(K).inplaceName, "Tensor");
  namesOf(K).alpha ? viaGeneric(op, {self, other, alpha}) : viaGeneric(op, {self, other});
  return self;
}

template <Kind K>
at::Tensor& outVariant(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha,
                       at::Tensor& out) {
  static OpCounters* counters = opCounters(namesOf(K).out);
  if (tryFast(K, namesOf(K).out, self, other, alpha, Mode::Out, &out).defined()) {
    recordOp(counters, OpPath::Async);
    return out;
  }
  static const auto& op = genericOp(namesOf(K).name, "out");
  namesOf(K).alpha ? viaGeneric(op, {self, other, alpha, out}) : viaGeneric(op, {self, other, out});
  return out;
}

// The schemas without alpha.
template <Kind K>
at::Tensor functionalNoAlpha(const at::Tensor& self, const at::Tensor& other) {
  return functional<K>(self, other, 1);
}
template <Kind K>
at::Tensor& inplaceNoAlpha(at::Tensor& self, const at::Tensor& other) {
  return inplace<K>(self, other, 1);
}
template <Kind K>
at::Tensor& outNoAlpha(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  return outVariant<K>(self, other, 1, out);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("add.Tensor", TORCH_FN(functional<Kind::Add>));
  m.impl("add_.Tensor", TORCH_FN(inplace<Kind::Add>));
  m.impl("add.out", TORCH_FN(outVariant<Kind::Add>));
  m.impl("sub.Tensor", TORCH_FN(functional<Kind::Sub>));
  m.impl("sub_.Tensor", TORCH_FN(inplace<Kind::Sub>));
  m.impl("sub.out", TORCH_FN(outVariant<Kind::Sub>));
  m.impl("mul.Tensor", TORCH_FN(functionalNoAlpha<Kind::Mul>));
  m.impl("mul_.Tensor", TORCH_FN(inplaceNoAlpha<Kind::Mul>));
  m.impl("mul.out", TORCH_FN(outNoAlpha<Kind::Mul>));
  m.impl("div.Tensor", TORCH_FN(functionalNoAlpha<Kind::Div>));
  m.impl("div_.Tensor", TORCH_FN(inplaceNoAlpha<Kind::Div>));
  m.impl("div.out", TORCH_FN(outNoAlpha<Kind::Div>));
}

}  // namespace torchneuron
