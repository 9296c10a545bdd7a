// CallKey.cpp: see CallKey.h.
#include "aten/CallKey.h"

#include "aten/Common.h"

#include <ATen/Context.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/DefaultDtype.h>
#include <c10/util/SmallVector.h>

#include <algorithm>

namespace torchneuron {

// dtype, where the tensor lives (device, wrapped number, CPU) and rank;
// false for an undefined tensor.
bool keyTensorHead(std::string& key, const at::Tensor& t) {
  if (!t.defined()) {
    keyPut<int8_t>(key, -1);
    return false;
  }
  keyPut<int8_t>(key, static_cast<int8_t>(t.scalar_type()));
  keyPut<int8_t>(key, isNeuron(t) ? 1 : (t.unsafeGetTensorImpl()->is_wrapped_number() ? 2 : 3));
  keyPut<int8_t>(key, static_cast<int8_t>(t.dim()));
  return true;
}

void keyTensor(std::string& key, const at::Tensor& t) {
  if (!keyTensorHead(key, t)) return;
  for (int64_t v : t.sizes()) keyPut(key, v);
  for (int64_t v : t.strides()) keyPut(key, v);
}

namespace {

template <class T, class List>
void keyList(std::string& key, char tag, const List& list) {
  keyPut<int8_t>(key, tag);
  for (const auto& v : list) keyPut<T>(key, static_cast<T>(v));
  keyPut<int8_t>(key, ';');
}

}  // namespace

// Appends a non-tensor argument; false when it cannot be part of a key.
// With floatsByType, a float or complex scalar counts by its type only (see
// kindKey).
bool keyValue(std::string& key, const c10::IValue& iv, bool floatsByType) {
  if (iv.isNone()) return keyPut<int8_t>(key, 'n'), true;
  if (iv.isInt()) return keyPut<int8_t>(key, 'i'), keyPut(key, iv.toInt()), true;
  if (floatsByType && (iv.isDouble() || iv.isComplexDouble()))
    return keyPut<int8_t>(key, iv.isDouble() ? 'D' : 'C'), true;
  if (iv.isDouble()) return keyPut<int8_t>(key, 'd'), keyPut(key, iv.toDouble()), true;
  if (iv.isBool()) return keyPut<int8_t>(key, 'b'), keyPut(key, iv.toBool()), true;
  if (iv.isComplexDouble())
    return keyPut<int8_t>(key, 'c'), keyPut(key, iv.toComplexDouble()), true;
  if (iv.isIntList()) return keyList<int64_t>(key, 'I', iv.toIntList()), true;
  if (iv.isDoubleList()) return keyList<double>(key, 'F', iv.toDoubleList()), true;
  if (iv.isBoolList()) return keyList<bool>(key, 'B', iv.toBoolList()), true;
  if (iv.isString()) {
    keyPut<int8_t>(key, 's');
    key.append(iv.toStringRef());
    keyPut<int8_t>(key, 0);
    return true;
  }
  if (iv.isDevice()) return keyPut<int8_t>(key, 'v'), keyPut(key, iv.toDevice().index()), true;
  if (iv.isList()) {  // a Scalar[] (a foreach op's per-tensor scalars)
    c10::ArrayRef<c10::IValue> items = iv.toListRef();
    keyPut<int8_t>(key, 'l');
    keyPut<int64_t>(key, static_cast<int64_t>(items.size()));
    for (const c10::IValue& item : items) {
      if (item.isList() || !keyValue(key, item, floatsByType)) return false;
    }
    return true;
  }
  return false;
}

// Global state that an op's result depends on: the default dtype (integer
// true division, factories' result dtypes) and the deterministic-algorithms
// flags (ops that raise or choose another kernel under them). Part of both
// keys, so a cached Meta pass or verdict never outlives the state it was
// made under.
void keyGlobals(std::string& key) {
  keyPut<int8_t>(key, static_cast<int8_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
  const auto& ctx = at::globalContext();
  keyPut<int8_t>(key, static_cast<int8_t>(ctx.deterministicAlgorithms() |
                                          (ctx.deterministicAlgorithmsWarnOnly() << 1) |
                                          (ctx.deterministicFillUninitializedMemory() << 2)));
}

// How written tensors overlap themselves and other arguments. CPU's kernels
// raise on internal overlap of a written tensor and on partial overlap of a
// written tensor with an input (at::assert_no_internal_overlap,
// assert_no_partial_overlap), so calls that differ in that relation are
// different calls: keyed apart, a failing one is checked inline (and raises
// at the op through the synchronous path) instead of being queued on the
// strength of a call that did not overlap. Only tensors sharing a storage
// can overlap, so lists of distinct tensors cost one sort.
void keyAliasing(std::string& key, const std::vector<bool>& writtenArg,
                 const torch::jit::Stack& stack, size_t begin) {
  struct Entry {
    const c10::StorageImpl* storage;
    int16_t index;
    bool written;
    at::Tensor t;
  };
  c10::SmallVector<Entry, 8> entries;
  int16_t index = 0;
  for (size_t i = 0; i < writtenArg.size(); ++i) {
    forEachTensor(stack[begin + i], [&](const at::Tensor& t) {
      const int16_t pos = index++;
      if (!isNeuron(t) || !t.has_storage()) return;
      if (writtenArg[i]) {
        keyPut<int8_t>(key, static_cast<int8_t>(at::has_internal_overlap(t)));
      }
      entries.push_back({t.storage().unsafeGetStorageImpl(), pos, writtenArg[i], t});
    });
  }
  if (entries.size() < 2) return;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.storage != b.storage ? a.storage < b.storage : a.index < b.index;
  });
  for (size_t a = 0; a < entries.size(); ++a) {
    for (size_t b = a + 1; b < entries.size() && entries[b].storage == entries[a].storage; ++b) {
      if (!entries[a].written && !entries[b].written) continue;
      keyPut<int8_t>(key, 'a');
      keyPut(key, entries[a].index);
      keyPut(key, entries[b].index);
      keyPut<int8_t>(key, static_cast<int8_t>(at::get_overlap_status(entries[a].t, entries[b].t)));
    }
  }
}

namespace {

void kindOfTensor(std::string& key, const at::Tensor& t) {
  if (!keyTensorHead(key, t)) return;
  keyPut<int8_t>(key, t.is_contiguous() ? 1 : (t.is_non_overlapping_and_dense() ? 2 : 3));
  // Lengths 0 and 1 are where kernels take other routes (broadcasting,
  // squeezing, empty results); other lengths are all alike.
  for (int64_t n : t.sizes()) keyPut<int8_t>(key, n > 1 ? 2 : static_cast<int8_t>(n));
}

}  // namespace

// A kind keys float and complex scalars by type, not value: a kernel's
// output layout follows argument dtypes, ranks, lengths and integer
// arguments (dims, sizes), never the value of a float (alpha, lr, eps, a
// clamp bound), while such values change every step under a learning-rate
// schedule or AdamW's bias correction — keyed by value, every step would be
// a new kind verified inline, with the host waiting for the device. Integers
// stay keyed by value: they name dims and lengths. (Should a kernel's layout
// ever depend on a float's value, the queued layout check still reports it
// as an error naming the op, never a wrong result.)
std::string kindKey(const void* op, const std::vector<bool>& writtenArg,
                    const torch::jit::Stack& stack, size_t begin, size_t n) {
  std::string key;
  keyPut(key, op);
  for (size_t i = begin; i < begin + n; ++i) {
    const c10::IValue& iv = stack[i];
    if (iv.isTensor()) {
      kindOfTensor(key, iv.toTensor());
    } else if (iv.isTensorList()) {
      keyPut<int8_t>(key, 'L');
      for (const at::Tensor& t : iv.toTensorList()) kindOfTensor(key, t);
    } else if (iv.isOptionalTensorList()) {
      keyPut<int8_t>(key, 'O');
      for (const std::optional<at::Tensor>& t : iv.toOptionalTensorList())
        t.has_value() ? kindOfTensor(key, *t) : keyPut<int8_t>(key, -2);
    } else if (!keyValue(key, iv, /*floatsByType=*/true)) {
      keyPut<int8_t>(key, 'x');
    }
  }
  keyGlobals(key);
  keyAliasing(key, writtenArg, stack, begin);
  return key;
}

}  // namespace torchneuron
