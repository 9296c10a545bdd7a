// The Meta pass of the asynchronous generic path (AsyncPath.cpp): the op run
// on Meta tensors gives the layout of every written tensor and fresh result,
// its argument checks and warnings, before any data exists. Cached per call
// key (CallKey.h): a training loop pays for it once per shape.
#pragma once

#include "aten/OpPlan.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <atomic>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchneuron {

// What the Meta pass tells us: the final layout of every written tensor and
// of every fresh result. It depends only on argument metadata, so it is
// cached per (op, metadata): a training loop pays for it once per shape.
struct TensorMeta {
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  at::ScalarType dtype = at::kFloat;

  explicit TensorMeta(const at::Tensor& t)
      : sizes(t.sizes().begin(), t.sizes().end()),
        strides(t.strides().begin(), t.strides().end()),
        dtype(t.scalar_type()) {}
};
struct MetaResult {
  std::vector<TensorMeta> written;
  std::vector<std::optional<TensorMeta>> fresh;  // nullopt: an undefined result
  bool allFreshDefined = true;
  // What the Meta pass warned (argument checks a kernel would warn about too,
  // e.g. random_'s "from is out of bounds"): given at the op when the kernel
  // is queued, and not again when the kernel raises the same warning.
  std::vector<c10::Warning> warnings;
  bool warnedAlready(const c10::Warning& w) const {
    for (const auto& m : warnings)
      if (m.msg() == w.msg()) return true;
    return false;
  }
  // A Python meta kernel (torch._prims_common's out= wrapper) resized a
  // non-empty out= tensor and warned about it in its own words, straight
  // into Python's warnings (never in `warnings`).
  bool resizeWarnedInPython = false;
  // Whether CPU's kernel agrees with this Meta pass (see VerdictCache).
  mutable std::atomic<int> verdict{kUnverified};
  // kFunctional: the out= overload disagrees but the functional kernel (its
  // results copied into place) agrees. kLearned, for a kind only: CPU's
  // functional kernel gives fresh results the Meta shapes in other strides
  // (a channels_last convolution), so each call's layouts are learned from
  // CPU's kernel on scratch memory (see learnedLayouts).
  enum Verdict : int { kUnverified, kAgrees, kFunctional, kDisagrees, kLearned };
  // Per fresh result (the first kMaxPlaced), 1 + which of the functional
  // kernel's allocations of the result's size became the result when a
  // call of these arguments placed it elsewhere; 0: none learned
  // (ResultPlacement). Kept per call: a kernel's allocations depend on the
  // sizes (oneDNN reorders an input of the output's size first, or not).
  static constexpr size_t kMaxPlaced = 4;
  mutable std::array<std::atomic<uint8_t>, kMaxPlaced> placementOrdinal{};
};


// The Meta result for the call of `op` with arguments stack[begin, ...):
// from the cache under `key` when `cacheable`, else from a Meta pass run now
// (ranNow). Null when the Meta pass cannot settle the call (the synchronous
// path runs it). `refused`: the Meta kernel said it has no answer (no Meta
// kernel, a data-dependent result). Meta kernels say so for some bad
// arguments too (neg of a bool tensor raises NotImplementedError), so the
// caller takes the op off the asynchronous path only once CPU's kernel ran
// the same call without an error (AsyncVerify::finish).
std::shared_ptr<const MetaResult> metaFor(const c10::OperatorHandle& op, const Plan& plan,
                                          const torch::jit::Stack& stack, size_t begin,
                                          const std::string& key, bool cacheable, bool& ranNow,
                                          bool& refused);

// Meta kernels written in Python raise Python exceptions, which reach C++ as
// exceptions this library cannot look into (it does not depend on Python).
// The bindings install a test that tells a refusal (NotImplementedError, or
// fake tensors' data-dependent and dynamic-shape exceptions: no Meta answer
// exists for the op, so it leaves the asynchronous path once CPU's kernel
// runs the call) from an error about these arguments (a shape mismatch: the synchronous path raises
// CPU's error for this call only). Without a test every foreign exception
// counts as a refusal.
using ForeignMetaRefusalTest = bool (*)(std::exception_ptr error);
void setForeignMetaRefusalTest(ForeignMetaRefusalTest test);

// Replaces the cached result under `key` (learned layouts).
void cacheMeta(const std::string& key, std::shared_ptr<const MetaResult> meta);

}  // namespace torchneuron
