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
//
// This file checks the arguments and runs the steps; the mechanisms live
// apart: the per-operator plan (OpPlan.h), the call's cache keys
// (CallKey.h), the Meta pass and its cache (MetaPass.h), the queued kernel
// and how it rebuilds its arguments (QueuedKernel.h, KernelArgs.h), and the
// verification of a kind of call (Verification.h).
#include "aten/AsyncPath.h"

#include "aten/CallKey.h"
#include "aten/Fusion.h"
#include "aten/KernelArgs.h"
#include "aten/ListLoop.h"
#include "aten/MetaPass.h"
#include "aten/OpPlan.h"
#include "aten/QueuedKernel.h"
#include "aten/Verification.h"
#include "aten/Common.h"
#include "aten/Launch.h"
#include "core/Config.h"
#include "core/Generator.h"
#include "core/HostWait.h"
#include "core/SerialCompute.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
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
// The executor side.

// A queued kernel as it runs alone: its warnings reach the user
// (KernelWarnings.h), but not those already given at the op by the Meta
// pass; a kernel that left the layouts it was given is an error naming the
// op, and calls of its kind run synchronously from then on.
// f() with the warnings it raises passed on, except those the Meta pass
// already gave at the op; its exception, if any, after them.
template <class F>
auto withKernelWarnings(const MetaResult& meta, F&& f) {
  HeldWarnings held;
  std::exception_ptr error;
  decltype(f()) result{};
  {
    c10::WarningUtils::WarningHandlerGuard guard(&held);
    try {
      result = f();
    } catch (...) {
      error = std::current_exception();
    }
  }
  for (const auto& w : held.warnings)
    if (!meta.warnedAlready(w)) c10::warn(w);
  if (error) std::rethrow_exception(error);
  return result;
}

void runQueued(const Kernel& kernel, const MetaResult& meta) {
  if (withKernelWarnings(meta, [&] { return kernel.run(&meta); })) return;
  meta.verdict.store(MetaResult::kDisagrees, std::memory_order_release);
  TORCH_CHECK(false, "CPU's kernel for ", kernel.plan->name,
              " did not write into the layout its Meta kernel gave for these "
              "arguments; the results are not on the device. Calls like this "
              "one now run synchronously; TORCHNEURON_ASYNC=0 runs every op so.");
}

// A pointwise kernel a fusion pass may split (Fusion.h).
struct FusibleKernel final : FusibleOp {
  FusibleKernel(Kernel k, std::shared_ptr<const MetaResult> m) : kernel(std::move(k)), meta(std::move(m)) {}
  void run() override { runQueued(kernel, *meta); }
  void runRange(int64_t begin, int64_t end) override { kernel.runRange(begin, end); }
  Kernel kernel;
  std::shared_ptr<const MetaResult> meta;
};

// A foreach kernel whose lists are shared among the compute threads: each
// list element's op runs whole on one thread, as it does alone (it is below
// the size its kernel would split), so the bits are those of a lone run.
void runSplit(const Kernel& kernel, const MetaResult& meta, int64_t length) {
  withKernelWarnings(meta, [&] {
    at::parallel_for(0, length, 1,
                     [&](int64_t begin, int64_t end) { kernel.runListRange(begin, end); });
    return true;
  });
}

// A foreach kernel over an op of the fusion list (Foreach.cpp): alone, it
// shares its lists among the threads when that computes what a serial run
// does; in a fusion pass it runs index by index with the others.
struct FusibleForeach final : FusibleOp {
  FusibleForeach(Kernel k, std::shared_ptr<const MetaResult> m)
      : kernel(std::move(k)), meta(std::move(m)) {}
  void run() override {
    const FusibleOp* self = this;
    if (smallLists && listLength > 1 && indexwiseIndependent({&self, 1}))
      runSplit(kernel, *meta, listLength);
    else
      runQueued(kernel, *meta);
  }
  void runRange(int64_t, int64_t) override {
    TORCH_INTERNAL_ASSERT(false, "a foreach kernel has no element range");
  }
  void runList(int64_t begin, int64_t end) override { kernel.runListRange(begin, end); }
  void runListElements(int64_t index, int64_t begin, int64_t end) override {
    kernel.runListElements(index, begin, end);
  }
  bool describeLoop(ListLoopOp* out) const override { return describeListLoop(kernel, out); }
  Kernel kernel;
  std::shared_ptr<const MetaResult> meta;
};

// The bytes each list index of a foreach kernel touches.
void describeLists(const Kernel& k, FusibleOp& op) {
  bool first = true;
  for (size_t i = 0; i < k.slots.size(); ++i) {
    const ArgSlot& slot = k.slots[i];
    const bool write = k.plan->writtenArg[i];
    if (slot.kind == ArgSlot::kTensorList) {
      for (size_t j = 0; j < slot.tensors.size(); ++j) {
        op.indexSpans.push_back({spanOf(*slot.tensors[j]), static_cast<int64_t>(j), write});
        if (first) op.indexNumel.push_back(c10::multiply_integers(slot.tensors[j]->sizes));
      }
      first = false;
    } else if (slot.kind == ArgSlot::kTensor && slot.tensors[0]) {
      op.indexSpans.push_back({spanOf(*slot.tensors[0]), -1, write});
    }
  }
}

void launchQueued(const NeuronStream& stream, Kernel kernel, std::shared_ptr<const MetaResult> meta) {
  const WorkDesc work = describe(kernel);
  bool small = false;
  if (kernel.plan->listSplit && fusionEnabled()) {
    if (const int64_t length = kernel.listLength(&small)) {
      auto op = std::make_unique<FusibleForeach>(std::move(kernel), std::move(meta));
      op->listLength = length;
      op->smallLists = small;
      op->elementwiseLists = !small && op->kernel.listsElementwise();
      describeLists(op->kernel, *op);
      launchFusible(stream, work, std::move(op));
      return;
    }
  }
  if (kernel.plan->fusible && fusionEnabled()) {
    const int64_t numel = kernel.fusibleNumel();
    if (numel >= kMinFusibleElements) {
      auto op = std::make_unique<FusibleKernel>(std::move(kernel), std::move(meta));
      op->numel = numel;
      launchFusible(stream, work, std::move(op));
      return;
    }
  }
  launchWork(stream, work, [kernel = std::move(kernel), meta = std::move(meta)]() {
    // (The rule runs here: it reads the executing thread's count.)
    const SerialRule rule = kernel.plan->serialRule;
    SerialScope scope(rule != nullptr && rule(kernel));
    runQueued(kernel, *meta);
  });
}

// ---------------------------------------------------------------------------
// The host side.

struct Prepared {
  c10::SmallVector<ArgSlot, 2> slots;  // arguments for the executor
  std::vector<size_t> generatorSlots;  // slots whose generator is derived at enqueue
  // written device tensors and where the executor's copy of their metadata lives
  struct Written {
    at::Tensor device;
    std::optional<TensorRef>* ref;
    bool out;  // an out= argument (may be resized); else an in-place self
  };
  c10::SmallVector<Written, 1> written;
  std::string key;  // the Meta pass's inputs, for the cache; empty: uncacheable
  bool cacheable = true;
};

// Checks one tensor argument and records it for the executor; false when the
// op must take the slow path.
// (hostValues: the argument is read on the host whatever its size, readOnHost.)
bool prepTensor(const at::Tensor& t, bool written, bool out, c10::DeviceIndex device,
                std::optional<TensorRef>* ref, c10::IValue* other, Prepared& p,
                bool hostValues = false) {
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
  // slow path's device-mismatch error. The copy pins the value at enqueue. A
  // Python number's wrapped tensor is the binding's own and is kept as is: a
  // copy would lose the wrapped-number mark, and the kernel would promote
  // with it as a double tensor (bool + 0.3 computed in float64, not float32).
  if (written || !t.device().is_cpu() || (t.dim() != 0 && !hostValues)) return false;
  *other = t.unsafeGetTensorImpl()->is_wrapped_number() ? t : t.clone();
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
      if (!prepTensor(iv.toTensor(), written, plan.outArg[i], device, &slot.tensors[0],
                      &slot.others[0], p, plan.hostValuesArg[i]))
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
      // The output metadata of an op on the fusion list (and of a foreach
      // over one) never depends on a float's value: an optimizer's per-step
      // scalars do not make every step a new Meta pass.
      if (!keyValue(p.key, iv, /*floatsByType=*/plan.fusible || plan.listSplit))
        p.cacheable = false;
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
  bool metaRanNow = false, metaRefused = false;
  std::shared_ptr<const MetaResult> meta =
      metaFor(op, *plan, *stack, begin, p.key, p.cacheable, metaRanNow, metaRefused);
  if (metaRefused && verify != nullptr) verify->refusedBy = &op;
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
    verdict = cachedVerdict(k);
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
  c10::SmallVector<at::Tensor, 1> fresh;
  TensorRefs outs;
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
    launchQueued(getCurrentStream(device), std::move(kernel), std::move(meta));
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
  // CPU's kernel ran the call the Meta kernel refused: the refusal was about
  // the op, not about bad arguments.
  if (refusedBy != nullptr) markIneligible(*refusedBy);
  if (!meta) return;
  meta->verdict.store(MetaResult::kDisagrees, std::memory_order_release);
  recordVerdict(kind, MetaResult::kDisagrees);
}

AsyncVerify::AsyncVerify() = default;
AsyncVerify::~AsyncVerify() = default;

}  // namespace torchneuron
