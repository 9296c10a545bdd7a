// Adaptive eager fusion: queued pointwise ops over the same number of
// elements run as one cache-blocked pass over memory instead of one pass
// each, with no user change and the same bits.
//
// The host queues each op as usual, marked fusible (launchFusible). When the
// executor reaches it, the runtime offers the fusible items queued right
// behind it on the stream (runtime.h, "Fusion"); the pass takes the longest
// prefix that may fuse and runs it block by block: every op on elements
// [lo, hi) of its operands, then the next block. What is queued is what
// fuses: a host that runs ahead of the device (the usual case for large
// tensors) gives long passes; a synchronizing call, an event, a wait, an op
// that cannot fuse and the executor's batch end a pass.
//
// Why the bits stay CPU's: ATen's CPU loops split an op's elements into one
// chunk per thread (at::parallel_for over GRAIN_SIZE) and compute a chunk's
// elements with the vectorized form of the op, except a tail shorter than
// two vectors, which takes the scalar form; the two forms may differ in the
// last bit (Sleef vs libm, FMA contraction). A pass splits the elements
// exactly so and walks each chunk in blocks that are whole multiples of any
// vector pair, so every element is computed by the form that computed it
// unfused. Ops whose own split differs (GELU picks its own grain, serial
// kernels) are not on the list of fusible ops (Fusion.cpp).
//
// What may fuse: ops on the list whose tensors are all either 0-dim (read as
// scalars) or contiguous with the output's sizes, with the same number of
// elements as the pass, and float32 repeat steps (LoopStep.h: an operand
// broadcast along one run of dims); a memory range one op of the pass writes
// may be touched by another only as the very same range (element i of it is
// then element i for both), and a broadcast operand not at all. Anything
// else ends the pass.
//
// Row reductions fuse too: sum and mean over the rows of a contiguous tensor
// (RowSum.h; their sums do not depend on where rows are split) when every
// thread's chunk of the pass is whole rows. The pass's blocks are then whole
// rows as well (and still whole vector pairs), so an op after a row op may
// read its result per row (x - mean[..., None], a repeat step that lists a
// value per row among its plain reads, not its acrossReads): the rows of a
// block are summed before the block's later ops run. Nothing else in a pass
// can write that range whole (its other ops write all the pass's elements),
// so the same-range rule above admits exactly this. A LayerNorm's mean,
// x - mean, its square and their mean then make one pass over memory.
//
// TORCHNEURON_FUSION=0 (or torchneuron.neuron.set_fusion_enabled(False))
// queues every op unfused.
#pragma once

#include "aten/Launch.h"

#include <c10/util/SmallVector.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace torchneuron {

struct ListLoopOp;

// A queued op that computes element i of its full-size operands from
// element i of the others (and its scalars): it can run on any range.
class FusibleOp {
 public:
  virtual ~FusibleOp() = default;
  // The whole op, as when it runs alone.
  virtual void run() = 0;
  // Elements [begin, end) of every full-size operand, on this thread.
  virtual void runRange(int64_t begin, int64_t end) = 0;

  const char* name = "<unnamed kernel>";  // lives as long as the process
  int64_t numel = 0;
  c10::SmallVector<nrtBufferRange, 4> reads, writes;  // device bytes
  // Of `reads`, those read at elements other than the one computed (a
  // broadcast operand): nothing the pass writes may touch them at all.
  c10::SmallVector<nrtBufferRange, 1> acrossReads;

  // Row ops (reductions): a row op computes value r of its output (its one
  // write) from elements [r * rowLength, (r + 1) * rowLength) of its input
  // (a read), and runs on ranges of whole rows. 0: not a row op.
  int64_t rowLength = 0;

  // A foreach op instead: the length of its lists (0 for an elementwise op),
  // whether every tensor is under GRAIN_SIZE elements (its op then runs on
  // one thread), and the bytes each list index touches (index -1: a tensor
  // every index reads, like a foreach op's scalar tensor).
  int64_t listLength = 0;
  bool smallLists = false;
  struct IndexSpan {
    nrtBufferRange range;
    int64_t index;
    bool write;
  };
  std::vector<IndexSpan> indexSpans;
  std::vector<int64_t> indexNumel;  // elements of the first list's tensor at each index
  // List indices [begin, end) of every list, on this thread. Only foreach
  // ops (listLength > 0) are given list ranges.
  virtual void runList(int64_t /*begin*/, int64_t /*end*/) {
    TORCH_INTERNAL_ASSERT(false, name, " is elementwise: it has no list range");
  }
  // A foreach op whose tensors at each index are contiguous and of one
  // shape (its other tensors 0-dim): it may run on elements [begin, end) of
  // one index's tensors (runListElements), so a pass can walk a large
  // parameter in cache-sized blocks with every op of an optimizer step.
  bool elementwiseLists = false;
  virtual void runListElements(int64_t /*index*/, int64_t /*begin*/, int64_t /*end*/) {
    TORCH_INTERNAL_ASSERT(false, name, " has no element ranges of its list indices");
  }
  // A foreach op a list pass may compute in a loop of its own instead of
  // calling its kernel (ListLoop.h): false when it is not one.
  virtual bool describeLoop(ListLoopOp* /*out*/) const { return false; }
};

// Whether list ops `ops` (indexwiseIndependent) may run each index block by
// block: every op is elementwiseLists over the same number of elements at
// each index, and memory one op writes at an index is touched at that index
// only as the very same range (element i is then element i for every op).
bool indexwiseElementwise(c10::ArrayRef<const FusibleOp*> ops);

// Whether list ops `ops` may run index by index in any order of the indices
// (and the ops of one index in their order): nothing one index writes is
// touched by another index of any of them.
bool indexwiseIndependent(c10::ArrayRef<const FusibleOp*> ops);

// Whether an op of this name ("aten::mul.out") is on the list of ops whose
// CPU kernels split their elements as a pass does (see above).
bool fusibleOpName(const std::string& name);
// Whether a foreach op ("aten::_foreach_mul_.Scalar") applies an op on that
// list (Foreach.cpp).
bool fusibleForeachName(const std::string& name);

// Elementwise ops below this many elements are queued to run alone: a pass
// would not make them faster, and describing one costs the host about
// 0.2 us per op (bench_small_ops).
constexpr int64_t kMinFusibleElements = 4096;

// Whether fusion is on (TORCHNEURON_FUSION, set_fusion_enabled).
bool fusionEnabled();
void setFusionEnabled(bool on);

// Queues `op` on `stream`: one work item, described by `work`, that may run
// fused with the fusible items queued right behind it.
void launchFusible(const NeuronStream& stream, const WorkDesc& work, std::unique_ptr<FusibleOp> op);

// What ran fused since the last clear: passes, the ops they held, per op.
struct FusionStats {
  int64_t passes = 0;
  int64_t ops = 0;
  int64_t blockedListPasses = 0;  // list passes that walked each index in blocks
  int64_t loopOps = 0;            // ops of list passes computed in list loops (ListLoop.h)
  int64_t flatLoopOps = 0;        // add/sub/mul/div queued as a list loop's step (Pointwise.cpp)
  int64_t broadcastLoopOps = 0;   // ... with a broadcast operand, as a repeat step (LoopStep.h)
  std::map<std::string, int64_t> byOp;
};
FusionStats fusionStats();
void clearFusionStats();
// Counts an op queued to run as a list loop's step (a relaxed atomic).
void countFlatLoopOp();
void countBroadcastLoopOp();

}  // namespace torchneuron
