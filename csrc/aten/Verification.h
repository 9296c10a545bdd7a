// Whether CPU's kernel writes what the Meta pass said, per kind of call
// (CallKey.h's kindKey), for the asynchronous generic path (AsyncPath.cpp):
// the verdict cache, the first call's verification (on zero-filled scratch
// memory without waiting for the device, else inline on the real data), and
// the layouts learned where CPU's kernel picks other strides.
#pragma once

#include "aten/MetaPass.h"
#include "aten/QueuedKernel.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchneuron {

// The verdict recorded for a kind (MetaResult::Verdict), kUnverified if none.
int cachedVerdict(const std::string& kind);
void recordVerdict(const std::string& kind, int verdict);

// The first call of a kind, run inline on the real data: the verdict for
// later calls (see Verification.cpp).
int verifyInline(const c10::OperatorHandle& op, Kernel& kernel, bool onlyFresh);

// The verdict for `real`'s kind from a run on scratch memory, or kUnverified
// when the scratch run cannot tell. With `cpuLayouts`, a kDisagrees of an op
// writing only fresh results also gives the layouts CPU's functional kernel
// gave them (one entry per fresh result), if it ran.
int verifyOnScratch(const c10::OperatorHandle& op, const Kernel& real, bool onlyFresh,
                    std::vector<std::optional<TensorMeta>>* cpuLayouts = nullptr);

// A MetaResult with CPU's strides for the fresh results, or null when CPU's
// results differ in more than strides (see Verification.cpp).
std::shared_ptr<MetaResult> learnedLayouts(const MetaResult& meta,
                                           const std::vector<std::optional<TensorMeta>>& cpu);

}  // namespace torchneuron
