// AsyncPath.cpp — see AsyncPath.h.
//
// An op is eligible when its schema says exactly what it writes: every
// result is either a fresh Tensor or an alias of a written (a!) argument,
// and no argument is a read-only alias (views stay native). For fresh
// results we need the op's out= overload ("foo.out" / "foo.bar_out"), so
// that the CPU kernel writes into device memory we allocated up front:
//
//   host:     args -> Meta tensors -> op on Meta (shapes, dtypes, strides and
//             all argument checks) -> allocate device outputs -> enqueue
//   executor: CPU tensors aliasing device memory -> out= (or in-place) CPU
//             kernel
//
// Anything the Meta pass cannot settle (no Meta kernel, data-dependent
// shapes, resized out= tensors, undefined results) returns false and the
// synchronous path runs the op instead.
#include "aten/AsyncPath.h"

#include "aten/CallKey.h"
#include "aten/KernelArgs.h"
#include "aten/MetaPass.h"
#include "aten/OpPlan.h"
#include "aten/Common.h"
#include "aten/Launch.h"
#include "core/Config.h"
#include "core/Generator.h"
#include "core/HostWait.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/DefaultDtype.h>
#include <c10/util/SmallVector.h>
#include <c10/util/accumulate.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace torchneuron {
namespace {

// ---------------------------------------------------------------------------
// The host side.

struct Prepared {
  std::vector<ArgSlot> slots;  // arguments for the executor
  std::vector<size_t> generatorSlots;  // slots whose generator is derived at enqueue
  // written device tensors and where the executor's copy of their metadata lives
  struct Written {
    at::Tensor device;
    std::optional<TensorRef>* ref;
    bool out;  // an out= argument (may be resized); else an in-place self
  };
  std::vector<Written> written;
  std::string key;  // the Meta pass's inputs, for the cache; empty: uncacheable
  bool cacheable = true;
};

// Meta kernels are not CPU's kernels: a few disagree with CPU's kernels
// about a result's dtype, shape or strides (statistics of reduced-precision
// norms, losses that reduce in place of their out=, svd's Vh). So the first
// call of an op with a given *kind* of arguments (dtypes, ranks, contiguity,
// lengths 0/1/many and plain values, not the lengths themselves) runs inline
// on the host (verifyInline); the verdict is kept per kind, so a loop whose
// lengths change (decoding) stays asynchronous. The queued kernel checks the layouts again, every time, and
// reports a disagreement as an error naming the op, never a wrong result.
struct VerdictCache {
  std::mutex mu;
  std::unordered_map<std::string, int> verdicts;
};
VerdictCache& verdictCache() {
  static auto* cache = new VerdictCache();
  return *cache;
}

void recordVerdict(const std::string& kind, int verdict) {
  if (kind.empty()) return;
  VerdictCache& vc = verdictCache();
  std::lock_guard<std::mutex> lk(vc.mu);
  if (vc.verdicts.size() >= 65536) vc.verdicts.clear();
  vc.verdicts[kind] = verdict;
}

// Checks one tensor argument and records it for the executor; false when the
// op must take the slow path.
bool prepTensor(const at::Tensor& t, bool written, bool out, c10::DeviceIndex device,
                std::optional<TensorRef>* ref, c10::IValue* other, Prepared& p) {
  keyTensor(p.key, t);
  if (!t.defined()) {
    *other = c10::IValue();
    return true;
  }
  if (t.is_conj() || t.is_neg() || t.layout() != at::kStrided) return false;
  if (isNeuron(t)) {
    if (t.device().index() != device) return false;
    ref->emplace(t, written);
    if (written) p.written.push_back({t, ref, out});
    return true;
  }
  // CPU scalars mix with device tensors (like CUDA); anything else is the
  // slow path's device-mismatch error. The copy pins the value at enqueue.
  if (written || !t.device().is_cpu() || t.dim() != 0) return false;
  *other = t.clone();
  return true;
}

bool prepare(const Plan& plan, const torch::jit::Stack& stack, size_t begin,
             c10::DeviceIndex device, Prepared& p) {
  const size_t n = plan.writtenArg.size();
  p.slots.resize(n);
  p.key.reserve(256);
  keyPut(p.key, &plan);
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& iv = stack[begin + i];
    ArgSlot& slot = p.slots[i];
    const bool written = plan.writtenArg[i];
    if (iv.isTensor()) {
      slot.kind = ArgSlot::kTensor;
      slot.tensors.resize(1);
      slot.others.resize(1);
      if (!prepTensor(iv.toTensor(), written, plan.outArg[i], device, &slot.tensors[0], &slot.others[0], p))
        return false;
      if (!slot.tensors[0]) {
        slot.kind = ArgSlot::kValue;
        slot.value = slot.others[0];
      }
    } else if (iv.isTensorList() || iv.isOptionalTensorList()) {
      const bool optional = iv.isOptionalTensorList();
      slot.kind = optional ? ArgSlot::kOptTensorList : ArgSlot::kTensorList;
      std::vector<std::optional<at::Tensor>> items;
      if (optional) {
        for (const std::optional<at::Tensor>& t : iv.toOptionalTensorList()) items.push_back(t);
      } else {
        for (const at::Tensor& t : iv.toTensorList()) items.emplace_back(t);
      }
      slot.tensors.resize(items.size());
      slot.others.resize(items.size());
      keyPut<int32_t>(p.key, static_cast<int32_t>(items.size()));
      for (size_t j = 0; j < items.size(); ++j) {
        if (!items[j].has_value()) {
          keyPut<int8_t>(p.key, -2);
          continue;
        }
        if (!prepTensor(*items[j], written, plan.outArg[i], device, &slot.tensors[j], &slot.others[j], p))
          return false;
      }
    } else if (iv.isDevice() && iv.toDevice().type() == kNeuron) {
      if (iv.toDevice().has_index() && iv.toDevice().index() != device) return false;
      slot.value = c10::Device(c10::DeviceType::CPU);
      keyPut<int8_t>(p.key, 'D');
    } else if (plan.generatorArg[i]) {
      slot.value = iv;  // derived once the op is certain to be queued
      p.generatorSlots.push_back(i);
      keyPut<int8_t>(p.key, 'G');
    } else {
      slot.value = iv;
      if (!keyValue(p.key, iv)) p.cacheable = false;
    }
  }
  keyGlobals(p.key);
  keyAliasing(p.key, plan.writtenArg, stack, begin);
  return true;
}

// Batch norm in eval mode returns empty statistics from CPU's functional
// kernel, where its Meta kernel and its out= kernel keep per-channel ones
// (and an out= call leaves empty statistics empty, where Meta would resize
// them): these calls run synchronously. (Argument 5 is `training` for
// native_batch_norm and _native_batch_norm_legit; the other overloads have
// no bool there.)
bool functionalShapesDependOnArguments(const Plan& plan, const torch::jit::Stack& stack,
                                       size_t begin) {
  if (!plan.batchNorm) return false;
  const c10::IValue& training = stack[begin + 5];
  return training.isBool() && !training.toBool();
}

// CPU's training-mode batch norm out= kernels read a non-contiguous input
// wrongly (garbage statistics; the functional kernels make it contiguous
// first), so such calls run the functional kernel and copy its results.
bool outOverloadMisreads(const Plan& plan, const torch::jit::Stack& stack, size_t begin) {
  if (!plan.batchNorm) return false;
  const c10::IValue& input = stack[begin];
  if (!input.isTensor()) return false;
  const at::Tensor& t = input.toTensor();
  return !t.is_contiguous() && !t.is_contiguous(at::MemoryFormat::ChannelsLast) &&
         !t.is_contiguous(at::MemoryFormat::ChannelsLast3d);
}

// A copy of an argument's tensors (same layouts), for a run that must not
// touch the originals.
c10::IValue copyOf(const c10::IValue& iv) {
  auto copy = [](const at::Tensor& t) {
    if (!t.defined()) return t;
    at::Tensor c = at::empty_strided(t.sizes(), t.strides(), t.options());
    return c.copy_(t);
  };
  return mapTensors(iv, copy);
}

// Same sizes, dtype and strides (strides only where they matter: dims
// longer than 1 of a non-empty tensor), and no conjugate/negative bit.
bool sameLayout(const at::Tensor& t, const TensorRef& ref) {
  if (t.scalar_type() != ref.dtype || t.sizes() != c10::IntArrayRef(ref.sizes)) return false;
  if (t.is_conj() || t.is_neg()) return false;
  if (t.numel() == 0) return true;
  for (size_t d = 0; d < ref.sizes.size(); ++d) {
    if (ref.sizes[d] > 1 && t.strides()[d] != ref.strides[d]) return false;
  }
  return true;
}

// Warnings of an inline try, passed on only when the try was the op's run.
struct HeldWarnings : c10::WarningHandler {
  std::vector<c10::Warning> warnings;
  void process(const c10::Warning& w) override { warnings.push_back(w); }
  void replay() {
    for (const auto& w : warnings) c10::warn(w);
  }
};

// One queued op: the CPU kernel over CPU tensors aliasing device memory.
struct Kernel {
  c10::OperatorHandle target;  // the out= overload, or the op itself
  bool viaOut;
  const Plan* plan;
  std::vector<ArgSlot> slots;
  std::vector<std::optional<TensorRef>> outs;

  // Runs the kernel; false when it did not write into the layouts and
  // memory it was given (a kernel that resized or re-pointed an output wrote
  // somewhere else: its results are not on the device).
  bool run() const {
    at::AutoDispatchBelowADInplaceOrView below;
    torch::jit::Stack s;
    s.reserve(slots.size() + outs.size());
    CpuStorages storages;
    // Every tensor the kernel may write, with the layout it must keep.
    c10::SmallVector<std::pair<at::Tensor, const TensorRef*>, 4> given;
    for (size_t i = 0; i < slots.size(); ++i) {
      s.push_back(rebuild(slots[i], storages));
      if (!plan->writtenArg[i]) continue;
      const auto& refs = slots[i].tensors;
      if (s.back().isTensor() && !refs.empty() && refs[0]) {
        given.emplace_back(s.back().toTensor(), &*refs[0]);
      } else if (s.back().isTensorList()) {
        c10::List<at::Tensor> list = s.back().toTensorList();
        for (size_t j = 0; j < refs.size(); ++j)
          if (refs[j]) given.emplace_back(list.get(j), &*refs[j]);
      }
    }
    if (viaOut) {
      for (const auto& o : outs) {
        s.emplace_back(o->cpu(storages));
        given.emplace_back(s.back().toTensor(), &*o);
      }
    }
    target.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &s);
    for (const auto& [t, ref] : given) {
      // (A kernel may also leave a conjugate or negative bit on an output,
      // as linalg_lu_solve does: its memory then holds other values.)
      if (t.data_ptr() != ref->data || t.sizes() != c10::IntArrayRef(ref->sizes) ||
          t.strides() != c10::IntArrayRef(ref->strides) || t.scalar_type() != ref->dtype ||
          t.is_conj() || t.is_neg())
        return false;
    }
    if (viaOut) return true;
    // No out= overload: copy the fresh results into place.
    size_t f = 0;
    for (size_t r = 0; r < plan->returnArg.size(); ++r) {
      if (plan->returnArg[r] >= 0) continue;
      const auto& o = outs[f++];
      if (!o) continue;
      const at::Tensor& result = s[r].toTensor();
      if (!sameLayout(result, *o)) return false;
      o->cpu().copy_(result);
    }
    return true;
  }

  // Whether CPU's functional kernel gives its fresh results the layouts the
  // Meta pass gave (a result's strides steer the kernels that read it: a
  // transposed Vh from svd sends a later mm down another BLAS route). Runs
  // the op again, into CPU memory, on copies of its arguments (some schemas
  // do not say what they write: native_batch_norm updates running stats).
  bool functionalLayoutsMatch(const c10::OperatorHandle& op,
                              std::vector<std::optional<TensorMeta>>* layouts = nullptr) const {
    at::AutoDispatchBelowADInplaceOrView below;
    torch::jit::Stack s;
    s.reserve(slots.size());
    CpuStorages storages;
    for (const ArgSlot& slot : slots) s.push_back(copyOf(rebuild(slot, storages)));
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &s);
    size_t f = 0;
    bool match = true;
    for (size_t r = 0; r < plan->returnArg.size(); ++r) {
      if (plan->returnArg[r] >= 0) continue;
      const auto& o = outs[f++];
      const bool defined = s[r].isTensor() && s[r].toTensor().defined();
      if (layouts != nullptr) {
        layouts->push_back(defined ? std::optional<TensorMeta>(TensorMeta(s[r].toTensor()))
                                   : std::nullopt);
      }
      if (!o ? defined : !defined || !sameLayout(s[r].toTensor(), *o)) match = false;
    }
    return match;
  }

  // run() on the host; false (and its warnings dropped: the synchronous path
  // gives the op's own) when it raised or did not keep the layouts.
  bool tryInline() const {
    return tryQuietly([&] { return run(); }, /*replayOnSuccess=*/true);
  }

  // f() with its exceptions meaning false and its warnings held back: passed
  // on only when replayOnSuccess and f() succeeded.
  template <class F>
  static bool tryQuietly(F&& f, bool replayOnSuccess = false) {
    HeldWarnings held;
    bool ok = false;
    {
      c10::WarningUtils::WarningHandlerGuard guard(&held);
      try {
        ok = f();
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (ok && replayOnSuccess) held.replay();
    return ok;
  }
};

nrtBufferRange spanOf(const TensorRef& r) {
  return bufferSpan(r.data, r.sizes, r.strides, c10::elementSize(r.dtype));
}

// The work item of a queued kernel: its op and the buffers it reads and writes.
WorkDesc describe(const Kernel& k) {
  WorkDesc work;
  work.name = k.plan->name.c_str();
  for (size_t i = 0; i < k.slots.size(); ++i) {
    auto& list = k.plan->writtenArg[i] ? work.writes : work.reads;
    for (const auto& ref : k.slots[i].tensors)
      if (ref) list.push_back(spanOf(*ref));
  }
  for (const auto& o : k.outs)
    if (o) work.writes.push_back(spanOf(*o));
  return work;
}

// Whether a read tensor argument on the device is not contiguous.
bool anyNonContiguousInput(const Plan& plan, const torch::jit::Stack& stack, size_t begin) {
  bool found = false;
  for (size_t i = 0; i < plan.writtenArg.size() && !found; ++i) {
    if (plan.writtenArg[i]) continue;
    forEachTensor(stack[begin + i], [&](const at::Tensor& t) {
      found |= isNeuron(t) && !t.is_contiguous();
    });
  }
  return found;
}

// Whether any argument is a device tensor with elements.
bool anyDeviceData(const torch::jit::Stack& stack, size_t begin, size_t n) {
  bool any = false;
  for (size_t i = begin; i < begin + n; ++i) {
    forEachTensor(stack[i], [&](const at::Tensor& t) {
      any |= t.defined() && isNeuron(t) && t.numel() > 0;
    });
  }
  return any;
}

// Whether tensor `t` (a written argument) is passed as another argument too.
bool readToo(const torch::jit::Stack& stack, size_t begin, size_t n, const at::Tensor& t) {
  int uses = 0;
  for (size_t i = begin; i < begin + n; ++i) {
    const c10::IValue& iv = stack[i];
    if (iv.isTensor() && iv.toTensor().is_same(t)) ++uses;
  }
  return uses > 1;
}

// The first call of a kind: runs `kernel` inline and tells how later calls
// may run. kAgrees: the out= (or in-place) kernel wrote exactly into the
// Meta layouts, and the functional kernel would have produced them too;
// kFunctional: the out= kernel did not, the functional kernel plus a copy
// did (tried only when just our fresh outputs were written); kDisagrees:
// neither (the caller runs the op synchronously).
int verifyInline(const c10::OperatorHandle& op, Kernel& kernel, bool onlyFresh) {
  const bool viaOut = kernel.viaOut;
  if (kernel.tryInline()) {
    if (!viaOut || !onlyFresh ||
        Kernel::tryQuietly([&] { return kernel.functionalLayoutsMatch(op); }))
      return MetaResult::kAgrees;
    return MetaResult::kDisagrees;  // right values, CPU's strides differ
  }
  if (!viaOut || !onlyFresh) return MetaResult::kDisagrees;
  kernel.viaOut = false;
  kernel.target = op;
  return kernel.tryInline() ? MetaResult::kFunctional : MetaResult::kDisagrees;
}

// ---------------------------------------------------------------------------
// Verification on scratch memory: the first call of a kind, checked without
// waiting for the device.
//
// Whether CPU's kernel writes into the Meta layouts depends on the
// arguments' metadata, not on their values (ops whose shapes depend on data
// never reach this path). So the first call of a kind runs the kernel on
// zero-filled host scratch memory with the same layouts — overlapping device
// ranges map to one scratch buffer, so aliasing (x.op_(x), out= overlapping
// an input) is what the kernel sees on the device — and the real run is
// queued as usual. A kernel that raises on zeros (a singular matrix, an
// all-zero multinomial row) or arguments too large to mirror leave the
// question open: the caller then verifies on the real data, inline, after
// waiting for the stream.

constexpr size_t kMaxScratchBytes = size_t(256) << 20;

// Points every device tensor of `k` at scratch memory held by `keep`; false
// when the mirror would exceed kMaxScratchBytes.
bool redirectToScratch(Kernel& k, std::vector<at::Tensor>& keep) {
  std::vector<TensorRef*> refs;
  for (ArgSlot& slot : k.slots)
    for (auto& r : slot.tensors)
      if (r) refs.push_back(&*r);
  for (auto& o : k.outs)
    if (o) refs.push_back(&*o);
  struct Span {
    uintptr_t lo, hi;
    TensorRef* ref;
  };
  std::vector<Span> spans;
  for (TensorRef* r : refs) {
    const nrtBufferRange b = spanOf(*r);
    // An empty tensor touches no memory (and ATen gives it no data pointer).
    if (b.bytes == 0) continue;
    const auto lo = reinterpret_cast<uintptr_t>(b.ptr);
    spans.push_back({lo, lo + b.bytes, r});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.lo < b.lo; });
  size_t total = 0;
  for (size_t i = 0; i < spans.size();) {
    // One scratch buffer per union of overlapping spans; it keeps the
    // device address's alignment modulo 64 (vectorised loops may branch on it).
    uintptr_t lo = spans[i].lo, hi = spans[i].hi;
    size_t j = i + 1;
    while (j < spans.size() && spans[j].lo < hi) hi = std::max(hi, spans[j++].hi);
    total += hi - lo + 64;
    if (total > kMaxScratchBytes) return false;
    at::Tensor buf = at::zeros({static_cast<int64_t>(hi - lo + 64)}, at::kByte);
    char* base = static_cast<char*>(buf.data_ptr()) + (lo % 64);
    for (; i < j; ++i) {
      TensorRef* r = spans[i].ref;
      r->data = base + (reinterpret_cast<uintptr_t>(r->data) - lo);
    }
    keep.push_back(std::move(buf));
  }
  for (const ArgSlot& slot : k.slots) {
    // Random ops are verified on their real run: their argument warnings
    // (random_'s "from is out of bounds") then reach the user at the op.
    if (slot.kind == ArgSlot::kValue && slot.value.isGenerator()) return false;
  }
  return true;
}

// The verdict for `real`'s kind from a run on scratch memory, or kUnverified
// when the scratch run cannot tell (see above). Warnings of a conclusive run
// are the op's argument warnings: passed on. With `cpuLayouts`, a kDisagrees
// of an op writing only fresh results also gives the layouts CPU's
// functional kernel gave them (one entry per fresh result), if it ran.
int verifyOnScratch(const c10::OperatorHandle& op, const Kernel& real, bool onlyFresh,
                    std::vector<std::optional<TensorMeta>>* cpuLayouts = nullptr) {
  Kernel k = real;
  std::vector<at::Tensor> keep;
  if (!redirectToScratch(k, keep)) return MetaResult::kUnverified;
  HeldWarnings held;
  int verdict = MetaResult::kUnverified;
  std::vector<std::optional<TensorMeta>> layouts;
  auto layoutsMatch = [&] {
    layouts.clear();
    return k.functionalLayoutsMatch(op, &layouts);
  };
  {
    c10::WarningUtils::WarningHandlerGuard guard(&held);
    try {
      if (k.run()) {
        verdict = !k.viaOut || !onlyFresh || layoutsMatch()
                      ? MetaResult::kAgrees
                      : MetaResult::kDisagrees;  // right values, CPU's strides differ
      } else if (!k.viaOut || !onlyFresh) {
        verdict = MetaResult::kDisagrees;
        if (onlyFresh && cpuLayouts != nullptr) layoutsMatch();
      } else {
        k.viaOut = false;
        k.target = op;
        verdict = k.run() ? MetaResult::kFunctional : MetaResult::kDisagrees;
        if (verdict == MetaResult::kDisagrees && cpuLayouts != nullptr) layoutsMatch();
      }
    } catch (const std::exception&) {
      verdict = MetaResult::kUnverified;  // raised on zeros: ask the real data
    }
  }
  if (verdict == MetaResult::kDisagrees && cpuLayouts != nullptr) *cpuLayouts = std::move(layouts);
  if (verdict != MetaResult::kUnverified) held.replay();
  return verdict;
}

// Learned layouts. Some CPU kernels give a fresh result the shape and dtype
// the Meta pass gives, in other strides: they follow their inputs' memory
// format where the Meta kernel does not (CPU's convolutions keep channels_last
// inputs channels_last; the Meta kernel answers for the Overrideable backend).
// Strides are metadata: those CPU's kernel chose on scratch memory are those
// it chooses for the same arguments on the device. So the call gets a
// MetaResult with CPU's strides (cached under the call's exact key, verdict
// kFunctional: CPU's functional kernel runs and its results are copied into
// place) and its kind is marked kLearned, so other calls of the kind learn
// theirs on scratch too instead of running synchronously. Null when CPU's
// results differ in more than strides (the call then runs synchronously).
std::shared_ptr<MetaResult> learnedLayouts(const MetaResult& meta,
                                           const std::vector<std::optional<TensorMeta>>& cpu) {
  static const bool enabled = backendConfig().learned_layouts;
  if (!enabled || !meta.written.empty() || cpu.size() != meta.fresh.size()) return nullptr;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const auto& a = cpu[i];
    const auto& b = meta.fresh[i];
    if (a.has_value() != b.has_value()) return nullptr;
    if (a && (a->sizes != b->sizes || a->dtype != b->dtype)) return nullptr;
  }
  auto learned = std::make_shared<MetaResult>();
  learned->fresh = cpu;
  learned->allFreshDefined = meta.allFreshDefined;
  learned->warnings = meta.warnings;
  learned->resizeWarnedInPython = meta.resizeWarnedInPython;
  learned->verdict.store(MetaResult::kFunctional, std::memory_order_relaxed);
  return learned;
}

std::atomic<bool> gAsyncEnabled{backendConfig().async_path};

}  // namespace

void setAsyncPathEnabled(bool enabled) { gAsyncEnabled.store(enabled); }
bool asyncPathEnabled() { return gAsyncEnabled.load(); }

bool tryAsyncPath(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                  c10::DeviceIndex device, AsyncVerify* verify) {
  auto refuse = [verify](const char* why) {
    if (verify != nullptr) verify->refusal = why;
    return false;
  };
  if (!gAsyncEnabled.load(std::memory_order_relaxed)) return refuse("TORCHNEURON_ASYNC=0");
  Plan* plan = planFor(op);
  if (!plan->eligible.load(std::memory_order_relaxed))
    return refuse("its schema or Meta kernel cannot give its outputs ahead of the data");
  const size_t numArgs = plan->writtenArg.size();
  const size_t begin = stack->size() - numArgs;

  if (functionalShapesDependOnArguments(*plan, *stack, begin))
    return refuse("eval-mode batch norm: CPU's statistics differ in shape");
  Prepared p;
  if (!prepare(*plan, *stack, begin, device, p))
    return refuse("an argument is not a dense tensor on this device (or a CPU scalar)");

  // Shapes, dtypes and argument checks, from the Meta backend (cached).
  bool metaRanNow = false;
  std::shared_ptr<const MetaResult> meta = metaFor(op, *plan, *stack, begin, p.key, p.cacheable, metaRanNow);
  if (!meta || meta->written.size() != p.written.size())
    return refuse("no Meta result for these arguments");
  // The Python warning reached the user now; the synchronous path must not repeat it.
  if (verify != nullptr) verify->resizeWarned = metaRanNow && meta->resizeWarnedInPython;
  // CPU's kernels lay out a zero-element result each their own way (flip
  // keeps the input's strides, a TensorIterator op makes it contiguous, a
  // linalg kernel transposes), and a run that writes nothing cannot show
  // whether the Meta pass agrees: CPU's kernel decides, synchronously.
  bool anyEmpty = false, allEmpty = true;
  for (const auto& f : meta->fresh) {
    if (!f) continue;
    const bool empty = c10::multiply_integers(f->sizes) == 0;
    anyEmpty |= empty;
    allEmpty &= empty;
  }
  if (anyEmpty) {
    // Nothing read, nothing written: the synchronous path need not wait.
    if (verify != nullptr) {
      verify->touchesNoData = allEmpty && !anyDeviceData(*stack, begin, numArgs);
    }
    return refuse("a zero-element result: its strides are CPU's kernel's choice");
  }
  int verdict = meta->verdict.load(std::memory_order_acquire);
  std::string kind;  // set when this call must verify its kind of arguments
  if (verdict == MetaResult::kUnverified) {
    std::string k = kindKey(plan, plan->writtenArg, *stack, begin, numArgs);
    VerdictCache& vc = verdictCache();
    {
      std::lock_guard<std::mutex> lk(vc.mu);
      auto it = vc.verdicts.find(k);
      if (it != vc.verdicts.end()) verdict = it->second;
    }
    // A kind whose layouts are learned: this call learns its own.
    if (verdict == MetaResult::kLearned) verdict = MetaResult::kUnverified;
    if (verdict == MetaResult::kUnverified) {
      kind = std::move(k);
    } else if (p.cacheable) {
      meta->verdict.store(verdict, std::memory_order_release);
    }
  }
  if (verdict == MetaResult::kDisagrees)
    return refuse("CPU's kernel does not write the layouts Meta gives for this kind of arguments");
  for (size_t i = 0; i < p.written.size(); ++i) {
    auto& w = p.written[i];
    const TensorMeta& m = meta->written[i];
    if (w.device.sizes() == c10::IntArrayRef(m.sizes) &&
        w.device.strides() == c10::IntArrayRef(m.strides))
      continue;
    // An out= tensor of the wrong size (typically empty): resize it here, as
    // the CPU kernel would, when that gives the layout the kernel expects.
    // Not an in-place op's self, nor an out= tensor that is also read
    // (x.op_(y) as op(x, y, out=x)): CPU refuses to resize those (some Meta
    // kernels do not) and the synchronous path raises CPU's error.
    if (!w.out || readToo(*stack, begin, numArgs, w.device))
      return refuse("a written tensor has the wrong size and cannot be resized");
    // Only an empty out= tensor whose Meta layout is the contiguous one a
    // resize gives; the rest is CPU's to decide, untouched (a factory keeps a
    // non-contiguous out= of the right numel as it is, TensorIterator
    // restrides to the inputs' memory format, non-empty outs warn): the
    // synchronous path runs CPU's kernel on them as given.
    // (With a non-contiguous input, CPU's TensorIterator gives an empty out=
    // the input's memory format where a Python Meta kernel resizes it
    // contiguously: abs(x) of a channels_last x.)
    if (w.device.numel() != 0 || anyNonContiguousInput(*plan, *stack, begin) ||
        c10::IntArrayRef(m.strides) != c10::IntArrayRef(c10::contiguous_strides(m.sizes)))
      return refuse("an out= tensor CPU's kernel may lay out its own way");
    w.device.resize_(m.sizes);
    if (w.device.strides() != c10::IntArrayRef(m.strides))
      return refuse("a resized out= tensor has the wrong strides");
    w.ref->emplace(w.device);
  }

  // Fresh outputs in device memory.
  c10::DeviceGuard guard(c10::Device(kNeuron, device));
  std::vector<at::Tensor> fresh;
  std::vector<std::optional<TensorRef>> outs;
  auto allocateFresh = [&fresh, &outs](const MetaResult& m) {
    fresh.clear();
    outs.clear();
    for (const std::optional<TensorMeta>& f : m.fresh) {
      fresh.push_back(f ? at::detail::empty_strided_generic(
                              f->sizes, f->strides, getDeviceAllocator(),
                              c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), f->dtype)
                        : at::Tensor());
      const at::Tensor& t = fresh.back();
      outs.push_back(t.defined() ? std::optional<TensorRef>(t) : std::nullopt);
    }
  };
  allocateFresh(*meta);

  // The random stream is reserved now, in host program order, exactly as
  // the synchronous path does it.
  for (size_t i : p.generatorSlots) {
    c10::IValue& v = p.slots[i].value;
    at::Generator gen = v.isNone() ? getDefaultGenerator(device) : v.toGenerator();
    checkNeuronGenerator(gen);
    v = gen.get<NeuronGeneratorImpl>()->deriveCpuGenerator();
  }

  // The CPU kernel.
  // out= overloads want every result; undefined ones go through a copy.
  const bool viaOut = plan->outOp.has_value() && meta->allFreshDefined &&
                      verdict != MetaResult::kFunctional &&
                      !outOverloadMisreads(*plan, *stack, begin);
  Kernel kernel{viaOut ? *plan->outOp : op, viaOut, plan, std::move(p.slots), std::move(outs)};
  bool ranInline = false;
  if (verdict == MetaResult::kUnverified) {
    // The first call with this kind of arguments: verified on scratch memory
    // (no wait), else run inline on the real data, in stream order.
    std::vector<std::optional<TensorMeta>> cpuLayouts;
    int found = verifyOnScratch(op, kernel, /*onlyFresh=*/p.written.empty(), &cpuLayouts);
    bool learned = false;
    if (found == MetaResult::kDisagrees) {
      if (std::shared_ptr<MetaResult> l = learnedLayouts(*meta, cpuLayouts)) {
        allocateFresh(*l);
        kernel.outs = outs;
        meta = l;
        if (p.cacheable) cacheMeta(p.key, meta);
        found = MetaResult::kFunctional;
        learned = true;
      }
    }
    if (found == MetaResult::kUnverified) {
      noteHostWait(WaitCause::Verification, plan->name);
      getCurrentStream(device).synchronize();
      found = verifyInline(op, kernel, /*onlyFresh=*/p.written.empty());
      ranInline = found != MetaResult::kDisagrees;
    }
    if (found == MetaResult::kDisagrees) {
      if (verify != nullptr) {
        verify->meta = meta;
        verify->kind = std::move(kind);
      }
      return refuse("first call of this kind: CPU's kernel does not write the layouts Meta gives");
    }
    recordVerdict(kind, learned ? MetaResult::kLearned : found);
    if (p.cacheable) meta->verdict.store(found, std::memory_order_release);
    if (found == MetaResult::kFunctional) {
      kernel.viaOut = false;
      kernel.target = op;
    }
  }
  if (ranInline) {
    recordOp(plan->counters, OpPath::Inline);
  } else {
    for (const auto& w : meta->warnings) c10::warn(w);
    launchWork(getCurrentStream(device), describe(kernel),
                   [kernel = std::move(kernel), meta]() {
                     // The kernel's warnings reach the user (KernelWarnings.h),
                     // but not those already given at the op by the Meta pass.
                     HeldWarnings held;
                     bool ok = false;
                     std::exception_ptr error;
                     {
                       c10::WarningUtils::WarningHandlerGuard guard(&held);
                       try {
                         ok = kernel.run();
                       } catch (...) {
                         error = std::current_exception();
                       }
                     }
                     for (const auto& w : held.warnings)
                       if (!meta->warnedAlready(w)) c10::warn(w);
                     if (error) std::rethrow_exception(error);
                     if (ok) return;
                     meta->verdict.store(MetaResult::kDisagrees, std::memory_order_release);
                     TORCH_CHECK(false, "CPU's kernel for ", kernel.plan->name,
                                 " did not write into the layout its Meta kernel gave for these "
                                 "arguments; the results are not on the device. Calls like this "
                                 "one now run synchronously; TORCHNEURON_ASYNC=0 runs every op so.");
                   });
    recordOp(plan->counters, OpPath::Async);
  }

  // Results: fresh device outputs, or the written arguments they alias.
  std::vector<c10::IValue> results;
  results.reserve(plan->returnArg.size());
  size_t f = 0;
  for (int arg : plan->returnArg) {
    results.push_back(arg < 0 ? c10::IValue(fresh[f++]) : (*stack)[begin + arg]);
  }
  torch::jit::drop(*stack, numArgs);
  for (auto& r : results) stack->push_back(std::move(r));
  return true;
}

void AsyncVerify::finish() {
  if (!meta) return;
  meta->verdict.store(MetaResult::kDisagrees, std::memory_order_release);
  recordVerdict(kind, MetaResult::kDisagrees);
}

AsyncVerify::AsyncVerify() = default;
AsyncVerify::~AsyncVerify() = default;

}  // namespace torchneuron
