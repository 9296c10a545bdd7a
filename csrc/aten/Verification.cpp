// Verification.cpp: see Verification.h.
#include "aten/Verification.h"

#include "core/Config.h"

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace torchneuron {
namespace {

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

}  // namespace

int cachedVerdict(const std::string& kind) {
  VerdictCache& vc = verdictCache();
  std::lock_guard<std::mutex> lk(vc.mu);
  auto it = vc.verdicts.find(kind);
  return it != vc.verdicts.end() ? it->second : MetaResult::kUnverified;
}

void recordVerdict(const std::string& kind, int verdict) {
  if (kind.empty()) return;
  VerdictCache& vc = verdictCache();
  std::lock_guard<std::mutex> lk(vc.mu);
  if (vc.verdicts.size() >= 65536) vc.verdicts.clear();
  vc.verdicts[kind] = verdict;
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

namespace {

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

}  // namespace

// The verdict for `real`'s kind from a run on scratch memory, or kUnverified
// when the scratch run cannot tell (see above). Warnings of a conclusive run
// are the op's argument warnings: passed on. With `cpuLayouts`, a kDisagrees
// of an op writing only fresh results also gives the layouts CPU's
// functional kernel gave them (one entry per fresh result), if it ran.
int verifyOnScratch(const c10::OperatorHandle& op, const Kernel& real, bool onlyFresh,
                    std::vector<std::optional<TensorMeta>>* cpuLayouts) {
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

}  // namespace torchneuron
