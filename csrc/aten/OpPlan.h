// The asynchronous generic path's plan of an operator (AsyncPath.cpp), from
// its schema alone, made once per operator: what it writes, what it
// returns, its out= overload.
#pragma once

#include "aten/OpTracking.h"
#include "aten/SerialKernels.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <optional>
#include <string>
#include <vector>

namespace torchneuron {

struct Plan {
  // Cleared (never set again) when the Meta pass shows the op cannot run here.
  std::atomic<bool> eligible{false};
  std::string name;  // "aten::foo.bar", names the kernel
  OpCounters* counters = nullptr;  // op tracking, looked up once
  // The out= overload when some result is fresh; without one, the CPU
  // kernel's fresh results are copied into the device outputs.
  std::optional<c10::OperatorHandle> outOp;
  std::vector<int> returnArg;            // per result: aliased written arg, -1 = fresh
  std::vector<bool> writtenArg;          // per argument
  std::vector<bool> outArg;              // per argument: a keyword-only out= tensor
  std::vector<bool> generatorArg;        // per argument
  std::vector<bool> hostValuesArg;       // per argument: readOnHost
  size_t numFresh = 0;
  // native_batch_norm, _native_batch_norm_legit, _batch_norm_with_update
  // (any overload): CPU's kernels need exceptions (AsyncPath.cpp).
  bool batchNorm = false;
  // On the list of ops a fusion pass may split (Fusion.h).
  bool fusible = false;
  // A foreach op over such an op: its lists may be shared among threads (Foreach.cpp).
  bool listSplit = false;
  // For a unary foreach op's .out form (_foreach_sqrt.out): the per-tensor
  // op's out= form (sqrt.out). CPU's foreach .out kernel computes fresh
  // results and copies them into place; one index of it is the per-tensor
  // kernel writing in place, with the same values and one pass less.
  std::optional<c10::OperatorHandle> perTensorOut;
  // When its calls may run on one thread (SerialKernels.h): the rule that
  // tells which.
  SerialRule serialRule = nullptr;
};

// Whether argument `i` of `schema` is a CPU tensor of values a kernel reads
// on the host, whatever its size: a foreach op's `Tensor scalars` (one value
// per list index, which CUDA takes from a CPU tensor too). Other CPU tensors
// mix with device ones only as 0-dim scalars.
bool readOnHost(const c10::FunctionSchema& schema, size_t i);

// The plan of `op`: made on first use, never freed (a thread-local map then
// finds it without a lock).
Plan* planFor(const c10::OperatorHandle& op);
// An operator whose Meta pass shows it cannot run on the path (no Meta
// kernel, a data-dependent result): never tried again.
void markIneligible(const c10::OperatorHandle& op);

}  // namespace torchneuron
