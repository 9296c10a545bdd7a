// A queued op of the asynchronous generic path (AsyncPath.cpp): the op's
// CPU kernel over CPU tensors aliasing device memory, run by the executor (or
// inline, or on scratch memory, to verify a kind of call: Verification.h).
#pragma once

#include "aten/AllocationRedirect.h"
#include "aten/KernelArgs.h"
#include "aten/Launch.h"
#include "aten/MetaPass.h"
#include "aten/OpPlan.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <exception>
#include <optional>
#include <vector>

namespace torchneuron {

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
  c10::SmallVector<ArgSlot, 2> slots;
  TensorRefs outs;

  // Runs the kernel; false when it did not write into the layouts and
  // memory it was given (a kernel that resized or re-pointed an output wrote
  // somewhere else: its results are not on the device).
  // With `meta` (the call's Meta result), a functional kernel's results are
  // placed where that call's last run showed they come from (ResultPlacement).
  bool run(const MetaResult* meta = nullptr) const;
  // After a functional run: the fresh results that `placement` did not put
  // in their outputs copied there (and, with `meta`, where they came from
  // noted); false when one has another layout.
  bool copyResults(torch::jit::Stack& s, const ResultPlacement& placement,
                   const MetaResult* meta) const;

  // The number of elements a fusion pass may split this kernel over
  // (Fusion.h): its tensors are all 0-dim or contiguous of one shape, it has
  // at least one of those and no list arguments; else 0.
  int64_t fusibleNumel() const;

  // The kernel on elements [begin, end) of its full-size tensors (see
  // fusibleNumel), 0-dim ones whole.
  void runRange(int64_t begin, int64_t end) const;

  // The length of a foreach kernel's lists when every list argument
  // (tensors or scalars) has it and every listed tensor is on the device,
  // else 0; *small: every listed tensor is small enough that its own op runs
  // on one thread (GRAIN_SIZE elements).
  int64_t listLength(bool* small) const;

  // The kernel on elements [begin, end) of its lists.
  void runListRange(int64_t begin, int64_t end) const;
  // Whether, at every list index, the listed tensors are contiguous and of
  // one shape, and every other tensor argument is 0-dim: then an index's op
  // computes element i of its tensors from element i of the others, and
  // runListElements may split it.
  bool listsElementwise() const;
  // The kernel on list index `index` alone, on elements [begin, end) of its
  // tensors there (see listsElementwise).
  void runListElements(int64_t index, int64_t begin, int64_t end) const;

  // Whether CPU's functional kernel gives its fresh results the layouts the
  // Meta pass gave (a result's strides steer the kernels that read it: a
  // transposed Vh from svd sends a later mm down another BLAS route). Runs
  // the op again, into CPU memory, on copies of its arguments (some schemas
  // do not say what they write: native_batch_norm updates running stats).
  bool functionalLayoutsMatch(const c10::OperatorHandle& op,
                              std::vector<std::optional<TensorMeta>>* layouts = nullptr) const;

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

// The work item of a queued kernel: its op and the buffers it reads and
// writes.
WorkDesc describe(const Kernel& k);

// Whether `r` is contiguous (dimensions of length 1 aside).
bool denseRowMajor(const TensorRef& r);

// The device bytes a tensor reference spans.
nrtBufferRange spanOf(const TensorRef& r);

}  // namespace torchneuron
