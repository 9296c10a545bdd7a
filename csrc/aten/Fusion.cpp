// Fusion.cpp: see Fusion.h.
#include "aten/Fusion.h"

#include "aten/ListLoop.h"

#include "core/ComputeThreads.h"
#include "core/Config.h"
#include "core/SerialCompute.h"
#include "core/KernelWarnings.h"

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE, the split of its for_each
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <mutex>
#include <numeric>
#include <set>
#include <vector>

namespace torchneuron {
namespace {

// Elements per block: a multiple of every vector pair ATen's loops step by
// (2 x 64 one-byte lanes with AVX-512), so blocks never move a tail; small
// enough that a pass's operands stay in L2 between its ops.
constexpr int64_t kBlock = 65536;
static_assert(kBlock % 512 == 0, "blocks must not move a vector loop's tail");

// Ops whose CPU kernels split elements as at::parallel_for(GRAIN_SIZE) and
// walk a chunk with one vectorized loop (cpu_kernel_vec: binary, ternary and
// most unary ops), or compute every element with one form (the vml-style
// unary kernels: exp, log, tanh, sqrt, ...): base names, every overload and
// the in-place and out= forms. Not here: gelu (a grain of its own),
// reductions, anything that reads other elements. tests/test_fusion.py runs
// each of them fused on sizes with several chunks and ragged tails.
const std::set<std::string>& fusibleBases() {
  static const std::set<std::string> names = {
      "abs",     "add",      "addcdiv",   "addcmul", "clamp",   "clamp_max", "clamp_min",
      "cos",     "div",      "eq",        "exp",     "ge",      "gt",        "le",
      "lerp",    "log",      "lt",        "maximum", "minimum", "mul",       "ne",
      "neg",     "pow",      "reciprocal", "relu",   "rsqrt",   "sigmoid",   "sigmoid_backward",
      "sin",     "sqrt",     "sub",       "tanh",    "tanh_backward", "threshold_backward",
      "where",   "silu",     "sign",      "square"};
  return names;
}

std::atomic<bool>& enabledFlag() {
  static std::atomic<bool> on{backendConfig().fusion};
  return on;
}

struct Stats {
  std::mutex mu;
  FusionStats s;
};
Stats& stats() {
  static Stats* s = new Stats();  // used by executor threads until exit
  return *s;
}

// The closure a fusible item carries (Launch.h): the fuser finds the op in
// the item's argument block through it.
struct FusibleCall {
  std::unique_ptr<FusibleOp> op;
  void operator()() const;
};
using FusibleClosure = detail::Closure<FusibleCall>;

FusibleClosure* closureOf(void* args) { return *static_cast<FusibleClosure**>(args); }

bool sameRange(const nrtBufferRange& a, const nrtBufferRange& b) {
  return a.ptr == b.ptr && a.bytes == b.bytes;
}
// Whether ranges `mine` may be touched by a pass that writes `theirs`.
bool clear(c10::ArrayRef<nrtBufferRange> mine, c10::ArrayRef<nrtBufferRange> theirs) {
  for (const auto& a : mine)
    for (const auto& b : theirs)
      if (rangesOverlap(a, b) && !sameRange(a, b)) return false;
  return true;
}

// Whether no range of `a` overlaps one of `b`.
bool apart(c10::ArrayRef<nrtBufferRange> a, c10::ArrayRef<nrtBufferRange> b) {
  for (const auto& x : a)
    for (const auto& y : b)
      if (rangesOverlap(x, y)) return false;
  return true;
}

// Elements per block of a pass with row ops of `rowLength` elements: whole
// rows and whole vector pairs (kBlock's), as many as fit a block; 0 when a
// block cannot hold one such run.
int64_t rowBlock(int64_t rowLength) {
  const int64_t unit = std::lcm(rowLength, int64_t(512));
  return unit <= kBlock ? kBlock / unit * unit : 0;
}

// Whether a pass over `numel` elements with row ops of `rowLength` elements
// keeps rows whole: each thread's chunk (at::parallel_for's split over
// GRAIN_SIZE, with the executing thread's count: applyComputeThreads came
// first) is whole rows, and so are its blocks.
bool rowsStayWhole(int64_t numel, int64_t rowLength) {
  if (rowBlock(rowLength) == 0) return false;
  return parallelForChunk(numel, at::internal::GRAIN_SIZE, at::get_num_threads()) % rowLength == 0;
}

// The row length of a pass's row ops (0: it has none).
int64_t rowLengthOf(c10::ArrayRef<FusibleOp*> ops) {
  for (const FusibleOp* op : ops)
    if (op->rowLength != 0) return op->rowLength;
  return 0;
}

// Whether `next` may join a pass holding `ops`.
bool joins(c10::ArrayRef<FusibleOp*> ops, const FusibleOp& next) {
  if (next.listLength != 0 || next.numel != ops[0]->numel) return false;
  // A pass with row ops, of one length, keeps their rows whole.
  const int64_t have = rowLengthOf(ops);
  const int64_t rowLength = have != 0 ? have : next.rowLength;
  if (next.rowLength != 0 && next.rowLength != rowLength) return false;
  if (rowLength != 0 && !rowsStayWhole(next.numel, rowLength)) return false;
  for (const FusibleOp* op : ops) {
    if (!clear(next.reads, op->writes) || !clear(next.writes, op->writes) ||
        !clear(next.writes, op->reads) || !apart(next.acrossReads, op->writes) ||
        !apart(next.writes, op->acrossReads))
      return false;
  }
  return true;
}

void tally(c10::ArrayRef<FusibleOp*> ops, bool blockedLists, int64_t loopOps) {
  Stats& st = stats();
  std::lock_guard<std::mutex> lk(st.mu);
  st.s.passes++;
  st.s.blockedListPasses += blockedLists ? 1 : 0;
  st.s.loopOps += loopOps;
  st.s.ops += static_cast<int64_t>(ops.size());
  for (const FusibleOp* op : ops) st.s.byOp[op->name]++;
}

// The first failure of a pass: the op (its index) and the message.
struct Failure {
  std::mutex mu;
  std::atomic<bool> any{false};
  size_t index = SIZE_MAX;
  std::string message;
  void note(size_t k, const char* what) {
    std::lock_guard<std::mutex> lk(mu);
    if (k < index) {
      index = k;
      message = what;
    }
    any.store(true, std::memory_order_relaxed);
  }
  // f(), the pass's op k; false (its failure noted) when it raised.
  template <class F>
  bool attempt(size_t k, F&& f) {
    try {
      f();
      return true;
    } catch (const c10::Error& e) {
      note(k, e.what_without_backtrace());
    } catch (const std::exception& e) {
      note(k, e.what());
    }
    return false;
  }
};

// Every op of the pass on elements [begin, end), block by block; stops at a
// failure (its own or another thread's).
// (`first`: the pass's index of ops[0]; `block`: elements per block.)
void runChunk(c10::ArrayRef<FusibleOp*> ops, int64_t begin, int64_t end, Failure& failure,
              size_t first = 0, int64_t block = kBlock) {
  for (int64_t lo = begin; lo < end; lo += block) {
    if (failure.any.load(std::memory_order_relaxed)) return;
    const int64_t hi = std::min(end, lo + block);
    for (size_t k = 0; k < ops.size(); ++k)
      if (!failure.attempt(first + k, [&] { ops[k]->runRange(lo, hi); })) return;
  }
}

// Whether `next` touches nothing a pass holding `ops` touches (reads of the
// same bytes aside).
bool independent(c10::ArrayRef<FusibleOp*> ops, const FusibleOp& next) {
  if (next.listLength != 0 || next.numel > at::internal::GRAIN_SIZE) return false;
  for (const FusibleOp* op : ops) {
    if (!apart(next.writes, op->writes) || !apart(next.writes, op->reads) ||
        !apart(next.reads, op->writes))
      return false;
  }
  return true;
}

using SpanList = std::vector<const FusibleOp::IndexSpan*>;

bool byAddress(const FusibleOp::IndexSpan* a, const FusibleOp::IndexSpan* b) {
  return a->range.ptr < b->range.ptr;
}

// Whether no two overlapping spans of `sorted` (by address), one of them
// written, make `conflict(x, y)` true.
template <class Conflict>
bool noConflictingOverlap(const SpanList& sorted, Conflict conflict) {
  for (size_t a = 0; a < sorted.size(); ++a) {
    const char* endA = static_cast<const char*>(sorted[a]->range.ptr) + sorted[a]->range.bytes;
    for (size_t b = a + 1; b < sorted.size() && sorted[b]->range.ptr < endA; ++b) {
      const auto& x = *sorted[a];
      const auto& y = *sorted[b];
      if ((x.write || y.write) && conflict(x, y)) return false;
    }
  }
  return true;
}

// The non-empty index spans of `op`, appended to `out`.
void appendSpans(const FusibleOp& op, SpanList& out) {
  for (const auto& span : op.indexSpans)
    if (span.range.bytes != 0) out.push_back(&span);
}

// A list pass's rule for two overlapping spans, one of them written: written
// memory may be touched only by its own index (a span of every index, index
// -1, belongs to all of them).
bool otherIndex(const FusibleOp::IndexSpan& x, const FusibleOp::IndexSpan& y) {
  return x.index != y.index || x.index < 0;
}

// The index spans of a list pass being formed, sorted by address: a
// candidate op is checked against them in one merge and sweep. Checking the
// pass with the candidate from scratch sorted every span of the pass again
// for each op: with a default AdamW step (ten foreach calls over 64
// parameters, about 200 spans each) that was a quarter of the executor's
// time per step.
class ListPassSpans {
 public:
  // Adds `op`'s spans and returns true when no span of it conflicts with
  // another of its own or of the pass (indexwiseIndependent of the pass
  // with op, given the pass's own check); else changes nothing.
  bool admit(const FusibleOp& op) {
    SpanList fresh;
    appendSpans(op, fresh);
    std::sort(fresh.begin(), fresh.end(), byAddress);
    SpanList merged;
    merged.reserve(spans_.size() + fresh.size());
    std::merge(spans_.begin(), spans_.end(), fresh.begin(), fresh.end(),
               std::back_inserter(merged), byAddress);
    // Pairs within the pass were checked when their ops joined it.
    const auto* first = op.indexSpans.data();
    const auto* last = first + op.indexSpans.size();
    auto ofOp = [&](const FusibleOp::IndexSpan& x) { return &x >= first && &x < last; };
    if (!noConflictingOverlap(merged, [&](const auto& x, const auto& y) {
          return (ofOp(x) || ofOp(y)) && otherIndex(x, y);
        }))
      return false;
    spans_ = std::move(merged);
    return true;
  }

 private:
  SpanList spans_;
};

// Whether no two overlapping index spans of `ops`, one of them written,
// make `conflict(x, y)` true (spans swept by address).
template <class Conflict>
bool noConflictingOverlap(c10::ArrayRef<const FusibleOp*> ops, Conflict conflict) {
  SpanList spans;
  for (const FusibleOp* op : ops) appendSpans(*op, spans);
  std::sort(spans.begin(), spans.end(), byAddress);
  return noConflictingOverlap(spans, conflict);
}

// A list pass's ops in order, as segments: a run of two or more ops that
// are list loops (ListLoop.h) and may interleave is one segment, computed
// tile by tile; any other op is a segment of its own, run by its kernel.
struct Segments {
  struct Segment {
    size_t first, last;  // ops [first, last)
    bool loop;
  };
  std::vector<Segment> list;
  std::vector<ListLoopOp> loops;  // by op; those of loop segments describe them
  int64_t loopOps = 0;
};

// Whether ops may be computed element by element together at each index:
// the same number of elements there, and memory one writes touched by
// another only as the very same range.
bool interleavable(c10::ArrayRef<const FusibleOp*> ops) {
  for (const FusibleOp* op : ops)
    if (op->indexNumel != ops[0]->indexNumel) return false;
  return noConflictingOverlap(
      ops, [](const auto& x, const auto& y) { return !sameRange(x.range, y.range); });
}

// `interleaved`: the caller has shown the whole pass interleavable, and so
// every run of its ops.
Segments segmentsOf(c10::ArrayRef<FusibleOp*> ops, bool interleaved) {
  Segments s;
  std::vector<char> loop(ops.size(), 0);
  if (listLoopsEnabled()) {
    s.loops.resize(ops.size());
    for (size_t k = 0; k < ops.size(); ++k) loop[k] = ops[k]->describeLoop(&s.loops[k]);
  }
  for (size_t k = 0; k < ops.size();) {
    size_t end = k;
    while (end < ops.size() && loop[end]) ++end;
    if (end - k >= 2 &&
        (interleaved || interleavable(c10::SmallVector<const FusibleOp*, NRT_MAX_FUSED>(
                            ops.begin() + k, ops.begin() + end)))) {
      s.list.push_back({k, end, true});
      s.loopOps += static_cast<int64_t>(end - k);
      k = end;
    } else {
      s.list.push_back({k, k + 1, false});
      ++k;
    }
  }
  return s;
}

// A pass whose ops each run by their own kernel.
Segments plainSegments(size_t n) {
  Segments s;
  for (size_t k = 0; k < n; ++k) s.list.push_back({k, k + 1, false});
  return s;
}

// A loop segment's ops on elements [begin, begin + count) of list index j.
void runLoop(const Segments& s, const Segments::Segment& seg, int64_t j, int64_t begin,
             int64_t count) {
  LoopStep steps[NRT_MAX_FUSED];
  for (size_t k = seg.first; k < seg.last; ++k) steps[k - seg.first] = s.loops[k].at(j, begin);
  runLoopSteps(steps, seg.last - seg.first, count);
}

// A list pass: every op on list index j, then index j + 1 (when every
// tensor is small, the indices shared among the threads); each op computes
// what it would alone, with the same per-tensor kernel or a list loop.
// (`elementwise`: indexwiseElementwise of the pass. Returns whether it
// walked the indices in blocks.)
bool runLists(c10::ArrayRef<FusibleOp*> ops, Failure& failure, int64_t* loopOps,
              bool elementwise) {
  const int64_t length = ops[0]->listLength;
  const bool small = ops[0]->smallLists;  // the same for every op of a pass (runPass)
  // A step takes consecutive indices up to a block's worth of elements, so
  // that its ops find their tensors in cache and small tensors do not each
  // pay a kernel call per op.
  const std::vector<int64_t>& sizes = ops[0]->indexNumel;
  auto runIndices = [&](const Segments& segs, int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end;) {
      int64_t next = j + 1, elements = sizes[j];
      while (next < end && elements + sizes[next] <= kBlock) elements += sizes[next++];
      for (const auto& seg : segs.list) {
        if (failure.any.load(std::memory_order_relaxed)) return;
        if (seg.loop) {
          // An index's tensors are under GRAIN_SIZE: its kernel computes
          // each whole, as a loop does.
          for (int64_t i = j; i < next; ++i) runLoop(segs, seg, i, 0, ops[seg.first]->indexNumel[i]);
        } else if (!failure.attempt(seg.first, [&] { ops[seg.first]->runList(j, next); })) {
          return;
        }
      }
      j = next;
    }
  };
  if (small) {
    const Segments segs = segmentsOf(ops, /*interleaved=*/false);
    *loopOps = segs.loopOps;
    referenceParallelFor(0, length, 1,
                         [&](int64_t begin, int64_t end) { runIndices(segs, begin, end); });
    return false;
  }
  if (elementwise) {
    const Segments segs = segmentsOf(ops, /*interleaved=*/true);
    *loopOps = segs.loopOps;
    // Large tensors: index by index, every op on a block of elements
    // before the next block, so an optimizer step's ops meet a parameter's
    // tensors in cache instead of streaming each from memory once per op.
    // The elements split among the threads as each op splits them alone
    // (runChunk's blocks).
    for (int64_t j = 0; j < length && !failure.any.load(); ++j) {
      referenceParallelFor(0, sizes[j], at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
        for (int64_t lo = begin; lo < end; lo += kBlock) {
          const int64_t hi = std::min(end, lo + kBlock);
          for (const auto& seg : segs.list) {
            if (failure.any.load(std::memory_order_relaxed)) return;
            if (seg.loop) {
              runLoop(segs, seg, j, lo, hi - lo);
            } else if (!failure.attempt(seg.first, [&] {
                         ops[seg.first]->runListElements(j, lo, hi);
                       })) {
              return;
            }
          }
        }
      });
    }
    return true;
  }
  // Each op splits its own large tensors: no loops.
  runIndices(plainSegments(ops.size()), 0, length);
  return false;
}

// A pass's work in element operations (SerialCompute.h's kSerialWork).
int64_t passWork(c10::ArrayRef<FusibleOp*> ops) {
  int64_t elements = ops[0]->numel;
  if (ops[0]->listLength > 0)
    elements = std::accumulate(ops[0]->indexNumel.begin(), ops[0]->indexNumel.end(), int64_t(0));
  return elements * static_cast<int64_t>(ops.size());
}

// An op alone, as its closure: on one thread where small and where that
// computes what its kernel computes on the reference count. An elementwise
// op's chunks are its kernel's split (referenceParallelFor) with its range
// kernel on each; a row op's rows are independent, and so are the indices
// of small lists (each tensor under GRAIN_SIZE runs whole); a foreach op
// over larger tensors splits them inside ATen's kernel, so it keeps every
// thread.
void FusibleCall::operator()() const {
  FusibleOp& o = *op;
  const bool lists = o.listLength > 0;
  FusibleOp* self = &o;
  // (An op alone over GRAIN_SIZE elements or fewer does not split.)
  const bool splits = lists || o.numel > at::internal::GRAIN_SIZE;
  SerialScope serial(splits && (!lists || o.smallLists) && serialWorthy(passWork({&self, 1})));
  if (!serial.active() || lists || o.rowLength != 0) return o.run();
  referenceParallelFor(0, o.numel, at::internal::GRAIN_SIZE,
                       [&](int64_t begin, int64_t end) { o.runRange(begin, end); });
}

nrtStatus runPass(nrtFuser*, void* const* args, size_t count, size_t* ran, size_t* failed) {
  auto opAt = [&](size_t k) { return closureOf(args[k])->fn.op.get(); };
  c10::SmallVector<FusibleOp*, NRT_MAX_FUSED> ops{opAt(0)};
  const bool lists = ops[0]->listLength > 0;
  bool spread = false;
  // The thread count the pass runs with, and that joins() splits rows by.
  applyComputeThreads();
  if (lists) {
    // Foreach ops over lists of one length, index by index: an optimizer's
    // ops on one parameter run while its tensors are in cache. Lists of small
    // tensors join only lists of small tensors: those step through groups of
    // indices shared among the threads, the others through the indices in
    // order (runLists). Default AdamW over 64 x 16K parameters: 1.42x CPU
    // eager with small lists fused, 1.21x with each call alone (mean of four
    // runs each, A/B; an earlier executor measured the opposite).
    // An op whose own indices conflict (a tensor listed twice) runs alone.
    ListPassSpans spans;
    const bool joinable = spans.admit(*ops[0]);
    while (joinable && ops.size() < count &&
           opAt(ops.size())->listLength == ops[0]->listLength &&
           opAt(ops.size())->smallLists == ops[0]->smallLists) {
      if (!spans.admit(*opAt(ops.size()))) break;
      ops.push_back(opAt(ops.size()));
    }
  } else {
    // Small ops over memory of their own (the per-parameter ops of a
    // functional foreach): each runs whole on one thread, as it does unfused
    // (under GRAIN_SIZE elements its kernel does not split), and the threads
    // share the ops. Else a chain over the same elements, split as one op.
    spread = ops[0]->numel <= at::internal::GRAIN_SIZE;
    while (spread && ops.size() < count && independent(ops, *opAt(ops.size())))
      ops.push_back(opAt(ops.size()));
    spread = ops.size() > 1;
    while (!spread && ops.size() < count && joins(ops, *opAt(ops.size())))
      ops.push_back(opAt(ops.size()));
  }
  *ran = ops.size();
  *failed = 0;
  if (ops.size() == 1) return detail::runClosure<FusibleCall>(args[0]);
  const bool elementwise =
      lists && !ops[0]->smallLists &&
      indexwiseElementwise(c10::SmallVector<const FusibleOp*, NRT_MAX_FUSED>(ops.begin(), ops.end()));
  // On one thread when small and when every split below is one that
  // referenceParallelFor reproduces (SerialCompute.h): not where the ops'
  // own kernels split tensors over GRAIN_SIZE (a list pass that is not
  // elementwise, over lists of such tensors).
  SerialScope serial((!lists || ops[0]->smallLists || elementwise) &&
                     serialWorthy(passWork(ops)));

  TeamWatch watch;
  detail::CollectWarnings collected;
  Failure failure;
  bool blockedLists = false;
  int64_t loopOps = 0;
  {
    c10::WarningUtils::WarningHandlerGuard warningGuard(&collected);
    const bool outer = inQueuedWork();
    setInQueuedWork(true);
    if (lists) {
      blockedLists = runLists(ops, failure, &loopOps, elementwise);
    } else if (spread) {
      referenceParallelFor(0, static_cast<int64_t>(ops.size()), 1, [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) runChunk({ops[k]}, 0, ops[k]->numel, failure, k);
      });
    } else {
      // The op's own split: one chunk per thread, as its kernel makes them
      // (and whole rows for row ops: joins).
      const int64_t rowLength = rowLengthOf(ops);
      const int64_t block = rowLength != 0 ? rowBlock(rowLength) : kBlock;
      referenceParallelFor(0, ops[0]->numel, at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
        runChunk(ops, begin, end, failure, 0, block);
      });
    }
    setInQueuedWork(outer);
  }
  tally(ops, blockedLists, loopOps);
  const char* first = ops[0]->name;  // interned: outlives the op
  // Buried closures are freed by the host's next launch: no op is touched after this.
  for (size_t k = 0; k < ops.size(); ++k) detail::buryClosure(closureOf(args[k]));
  if (!collected.warnings.empty()) stashKernelWarnings(first, std::move(collected.warnings));
  if (!failure.any.load()) return NRT_SUCCESS;
  *failed = failure.index;
  nrtKernelSetError(failure.message.c_str());
  return NRT_ERROR_KERNEL_FAILED;
}

nrtFuser gFuser{&runPass};

}  // namespace


bool indexwiseIndependent(c10::ArrayRef<const FusibleOp*> ops) {
  return noConflictingOverlap(ops, otherIndex);
}

bool indexwiseElementwise(c10::ArrayRef<const FusibleOp*> ops) {
  for (const FusibleOp* op : ops)
    if (!op->elementwiseLists) return false;
  return interleavable(ops);
}

bool fusibleOpName(const std::string& name) {
  std::string base = name.rfind("aten::", 0) == 0 ? name.substr(6) : name;
  base = base.substr(0, base.find('.'));
  if (!base.empty() && base.back() == '_') base.pop_back();
  return fusibleBases().count(base) > 0;
}

bool fusibleForeachName(const std::string& name) {
  const std::string prefix = "aten::_foreach_";
  if (name.rfind(prefix, 0) != 0) return false;
  return fusibleOpName(name.substr(prefix.size()));
}

bool fusionEnabled() { return enabledFlag().load(std::memory_order_relaxed); }
void setFusionEnabled(bool on) { enabledFlag().store(on); }

void launchFusible(const NeuronStream& stream, const WorkDesc& work,
                   std::unique_ptr<FusibleOp> op) {
  op->name = work.name;
  op->reads = work.reads;
  op->writes = work.writes;
  WorkDesc desc = work;
  desc.fuser = &gFuser;
  launchWork(stream, desc, FusibleCall{std::move(op)});
}

// Counted per op on the host: an atomic rather than the stats' mutex.
std::atomic<int64_t> gFlatLoopOps{0};
std::atomic<int64_t> gBroadcastLoopOps{0};

void countFlatLoopOp() { gFlatLoopOps.fetch_add(1, std::memory_order_relaxed); }
void countBroadcastLoopOp() { gBroadcastLoopOps.fetch_add(1, std::memory_order_relaxed); }

FusionStats fusionStats() {
  Stats& st = stats();
  std::lock_guard<std::mutex> lk(st.mu);
  FusionStats s = st.s;
  s.flatLoopOps = gFlatLoopOps.load(std::memory_order_relaxed);
  s.broadcastLoopOps = gBroadcastLoopOps.load(std::memory_order_relaxed);
  return s;
}

void clearFusionStats() {
  Stats& st = stats();
  std::lock_guard<std::mutex> lk(st.mu);
  st.s = FusionStats();
  gFlatLoopOps.store(0, std::memory_order_relaxed);
  gBroadcastLoopOps.store(0, std::memory_order_relaxed);
}

}  // namespace torchneuron
