// QueuedKernel.cpp: see QueuedKernel.h.
#include "aten/QueuedKernel.h"

#include "aten/AllocationRedirect.h"
#include "aten/Common.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <c10/util/accumulate.h>

namespace torchneuron {
namespace {

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

// Whether a result may be computed in output `o`'s memory: its storage whole.
bool placeable(const TensorRef& o) { return o.offset == 0 && o.storageBytes != 0; }

// The fresh outputs a functional kernel's results may be computed in.
// Each is served the kernel's allocation of its size that a result of this
// call (`meta`: these arguments) last came from when it landed elsewhere,
// else the one its rank among outputs of that size gives (the first for the
// first).
c10::SmallVector<ResultPlacement::Target, 4> placementTargets(
    const TensorRefs& outs, const MetaResult* meta) {
  c10::SmallVector<ResultPlacement::Target, 4> targets;
  for (size_t f = 0; f < outs.size(); ++f) {
    const auto& o = outs[f];
    if (!o || !placeable(*o)) continue;
    uint32_t ordinal = 0;
    for (const auto& t : targets) ordinal += t.bytes == o->storageBytes ? 1 : 0;
    if (meta != nullptr && f < MetaResult::kMaxPlaced) {
      if (const uint8_t learned = meta->placementOrdinal[f].load(std::memory_order_relaxed))
        ordinal = learned - 1u;
    }
    targets.push_back({o->data, o->storageBytes, ordinal});
  }
  return targets;
}

// A result of output `f` that landed elsewhere: if it came from an
// allocation of its output's size the placement passed over, the next call
// with these arguments serves that one (a kernel allocates in the same order
// each call).
void learnPlacement(const MetaResult* meta, size_t f, const ResultPlacement& placement,
                    const at::Tensor& result, const TensorRef& out) {
  if (meta == nullptr || f >= MetaResult::kMaxPlaced || !placeable(out)) return;
  if (!result.has_storage() || result.storage_offset() != 0) return;
  const int64_t ordinal = placement.ordinalOf(out.storageBytes, result.storage().data());
  if (ordinal >= 0 && ordinal < 255)
    meta->placementOrdinal[f].store(static_cast<uint8_t>(ordinal + 1), std::memory_order_relaxed);
}

// Whether `t`'s storage overlaps device bytes `span`.
bool overlaps(const at::Tensor& t, const nrtBufferRange& span) {
  return t.has_storage() && rangesOverlap({t.storage().data(), t.storage().nbytes()}, span);
}

}  // namespace

bool Kernel::run(const MetaResult* meta) const {
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
  {
    // A functional kernel's fresh results may land in their outputs' memory.
    std::optional<ResultPlacement> placement;
    if (!viaOut) placement.emplace(placementTargets(outs, meta));
    target.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &s);
    if (placement) {
      placement->stop();
      if (!copyResults(s, *placement, meta)) return false;
    }
  }
  for (const auto& [t, ref] : given) {
    // (A kernel may also leave a conjugate or negative bit on an output,
    // as linalg_lu_solve does: its memory then holds other values.)
    if (t.data_ptr() != ref->data || t.sizes() != c10::IntArrayRef(ref->sizes) ||
        t.strides() != c10::IntArrayRef(ref->strides) || t.scalar_type() != ref->dtype ||
        t.is_conj() || t.is_neg())
      return false;
  }
  return true;
}

bool Kernel::copyResults(torch::jit::Stack& s, const ResultPlacement& placement,
                         const MetaResult* meta) const {
  // Results computed in place stay; the others are copied into place, each
  // read before any output it overlaps is written (a temporary's size may
  // have matched another result's output first).
  c10::SmallVector<std::pair<at::Tensor, const TensorRef*>, 4> moves;
  size_t f = 0;
  for (size_t r = 0; r < plan->returnArg.size(); ++r) {
    if (plan->returnArg[r] >= 0) continue;
    const auto& o = outs[f++];
    if (!o) continue;
    const at::Tensor& result = s[r].toTensor();
    if (!sameLayout(result, *o)) return false;
    if (result.data_ptr() == o->data) continue;
    moves.emplace_back(result, &*o);
    learnPlacement(meta, f - 1, placement, result, *o);
  }
  for (auto& [result, o] : moves)
    for (const auto& other : outs)
      if (other && overlaps(result, spanOf(*other))) result = result.clone();
  for (auto& [result, o] : moves) {
    o->cpu().copy_(result);
    recordFreshOutputCopy(plan->counters);
  }
  // Every storage over served memory is dropped now, unless the kernel kept
  // one (it would write a user's tensor later): an error naming the op.
  moves.clear();
  s.clear();
  TORCH_CHECK(!placement.anyStillReferenced(), plan->name,
              ": CPU's kernel kept a reference to its results' memory after it returned");
  return true;
}

bool denseRowMajor(const TensorRef& r) {
  int64_t expected = 1;
  for (size_t d = r.sizes.size(); d-- > 0;) {
    if (r.sizes[d] != 1 && r.strides[d] != expected) return false;
    expected *= r.sizes[d];
  }
  return true;
}

namespace {

// Elements [begin, end) of a contiguous tensor, as a 1-D CPU tensor over its
// device memory; a 0-dim tensor whole.
at::Tensor elementsOf(const TensorRef& r, CpuStorages& storages, int64_t begin, int64_t end) {
  at::Tensor t = r.cpu(storages);
  if (r.sizes.empty()) return t;
  const int64_t size = end - begin, stride = 1;
  t.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(&size, 1),
                                                 c10::IntArrayRef(&stride, 1), r.offset + begin);
  return t;
}

// A CPU tensor argument other than a 0-dim scalar (a foreach op's per-index
// values, readOnHost): read whole by the kernel, never split with the rest.
bool wholeCpuTensor(const ArgSlot& slot) {
  return slot.kind == ArgSlot::kValue && slot.value.isTensor() &&
         slot.value.toTensor().defined() && slot.value.toTensor().dim() != 0;
}
}  // namespace

int64_t Kernel::fusibleNumel() const {
  c10::SmallVector<int64_t, 5> shape;
  bool any = false;
  auto fits = [&](const TensorRef& r) {
    if (r.sizes.empty()) return true;
    if (!any) {
      shape = r.sizes;
      any = true;
    } else if (r.sizes != shape) {
      return false;
    }
    return denseRowMajor(r);
  };
  for (const ArgSlot& slot : slots) {
    if (slot.kind == ArgSlot::kTensor && slot.tensors[0]) {
      if (!fits(*slot.tensors[0])) return 0;
    } else if (slot.kind != ArgSlot::kValue && slot.kind != ArgSlot::kTensor) {
      return 0;
    } else if (wholeCpuTensor(slot)) {
      return 0;  // it would be read whole by every block
    } else if (slot.value.isList()) {
      return 0;
    }
  }
  for (const auto& o : outs)
    if (!o || !fits(*o)) return 0;
  if (!any) return 0;
  return c10::multiply_integers(shape);
}

void Kernel::runRange(int64_t begin, int64_t end) const {
  at::AutoDispatchBelowADInplaceOrView below;
  torch::jit::Stack s;
  s.reserve(slots.size() + outs.size());
  CpuStorages storages;
  auto piece = [&](const TensorRef& r) { return elementsOf(r, storages, begin, end); };
  for (const ArgSlot& slot : slots) {
    if (slot.kind == ArgSlot::kTensor && slot.tensors[0]) s.emplace_back(piece(*slot.tensors[0]));
    else s.push_back(slot.value);
  }
  if (viaOut)
    for (const auto& o : outs) s.emplace_back(piece(*o));
  target.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &s);
  if (viaOut) return;
  // No out= overload (or its verdict was the functional kernel): copy the
  // fresh results into place, as run() does.
  size_t f = 0;
  for (size_t r = 0; r < plan->returnArg.size(); ++r) {
    if (plan->returnArg[r] >= 0) continue;
    const auto& o = outs[f++];
    if (o) piece(*o).copy_(s[r].toTensor());
  }
}

int64_t Kernel::listLength(bool* small) const {
  int64_t len = -1;
  *small = true;
  for (const ArgSlot& slot : slots) {
    int64_t n = 0;
    if (slot.kind == ArgSlot::kTensorList) {
      n = static_cast<int64_t>(slot.tensors.size());
      for (const auto& ref : slot.tensors) {
        if (!ref) return 0;
        *small = *small && c10::multiply_integers(ref->sizes) <= at::internal::GRAIN_SIZE;
      }
    } else if (slot.kind == ArgSlot::kOptTensorList) {
      return 0;
    } else if (slot.kind == ArgSlot::kValue && slot.value.isList()) {
      n = static_cast<int64_t>(slot.value.toListRef().size());
    } else if (wholeCpuTensor(slot)) {
      return 0;  // per-index values go whole with the lists: no part of them
    } else {
      continue;
    }
    if (len < 0) len = n;
    else if (len != n) return 0;
  }
  return len > 0 ? len : 0;
}

bool Kernel::listsElementwise() const {
  std::vector<const TensorRef*> first;  // the first list's tensor at each index
  for (const ArgSlot& slot : slots) {
    if (slot.kind == ArgSlot::kTensorList) {
      if (first.empty()) {
        for (const auto& ref : slot.tensors) first.push_back(ref ? &*ref : nullptr);
      }
      if (slot.tensors.size() != first.size()) return false;
      for (size_t j = 0; j < slot.tensors.size(); ++j) {
        const auto& ref = slot.tensors[j];
        if (!ref || !first[j] || ref->sizes != first[j]->sizes || !denseRowMajor(*ref))
          return false;
      }
    } else if (slot.kind == ArgSlot::kTensor) {
      if (slot.tensors[0] && !slot.tensors[0]->sizes.empty()) return false;
    } else if (slot.kind != ArgSlot::kValue || wholeCpuTensor(slot)) {
      return false;
    }
  }
  return !first.empty();
}

void Kernel::runListElements(int64_t index, int64_t begin, int64_t end) const {
  at::AutoDispatchBelowADInplaceOrView below;
  torch::jit::Stack s;
  s.reserve(slots.size());
  CpuStorages storages;
  auto piece = [&](const TensorRef& r) { return elementsOf(r, storages, begin, end); };
  if (plan->perTensorOut) {  // (self, out): the per-tensor kernel writes in place
    s.emplace_back(piece(*slots[0].tensors[index]));
    s.emplace_back(piece(*slots[1].tensors[index]));
    plan->perTensorOut->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &s);
    return;
  }
  for (const ArgSlot& slot : slots) {
    if (slot.kind == ArgSlot::kTensorList) {
      c10::List<at::Tensor> part;
      part.push_back(piece(*slot.tensors[index]));
      s.emplace_back(std::move(part));
    } else if (slot.kind == ArgSlot::kValue && slot.value.isList()) {
      const c10::impl::GenericList full = slot.value.toList();
      c10::impl::GenericList part(full.elementType());
      part.push_back(full.get(index));
      s.emplace_back(std::move(part));
    } else {
      s.push_back(rebuild(slot, storages));
    }
  }
  target.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &s);
}

void Kernel::runListRange(int64_t begin, int64_t end) const {
  at::AutoDispatchBelowADInplaceOrView below;
  torch::jit::Stack s;
  s.reserve(slots.size());
  CpuStorages storages;
  if (plan->perTensorOut) {
    // (self, out), index by index: CPU's foreach .out kernel would compute
    // every result into fresh memory and copy it into place (an optimizer's
    // _foreach_sqrt: a malloc, a free and a copy per tensor per step).
    for (int64_t j = begin; j < end; ++j) {
      s.clear();
      s.emplace_back(slots[0].tensors[j]->cpu(storages));
      s.emplace_back(slots[1].tensors[j]->cpu(storages));
      plan->perTensorOut->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &s);
    }
    return;
  }
  for (const ArgSlot& slot : slots) {
    if (slot.kind == ArgSlot::kTensorList) {
      c10::List<at::Tensor> part;
      part.reserve(end - begin);
      for (int64_t j = begin; j < end; ++j) part.push_back(slot.tensors[j]->cpu(storages));
      s.emplace_back(std::move(part));
    } else if (slot.kind == ArgSlot::kValue && slot.value.isList()) {
      const c10::impl::GenericList full = slot.value.toList();
      c10::impl::GenericList part(full.elementType());
      part.reserve(end - begin);
      for (int64_t j = begin; j < end; ++j) part.push_back(full.get(j));
      s.emplace_back(std::move(part));
    } else {
      s.push_back(rebuild(slot, storages));
    }
  }
  target.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &s);
}

bool Kernel::functionalLayoutsMatch(const c10::OperatorHandle& op,
                                  std::vector<std::optional<TensorMeta>>* layouts) const {
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

}  // namespace torchneuron
