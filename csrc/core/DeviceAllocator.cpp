// Caching device allocator.
//
// Blocks are carved out of segments obtained from nrtMalloc and cached after
// use, per device, in two pools (small: <= 1 MiB requests from 2 MiB segments;
// large: everything else). A cached block is reused only by the stream it was
// allocated on; recordStream() adds other streams that use the block, and its
// reuse is deferred until events recorded on those streams at free time have
// completed. When nrtMalloc reports out-of-memory, every cached (whole, free)
// segment is released and the allocation retried once; a second failure
// throws c10::OutOfMemoryError (torch.OutOfMemoryError) with the device's
// capacity and the allocator's allocated/reserved bytes.
// Statistics follow CUDA's DeviceStats so that torch.accelerator.memory_stats
// produces the same keys. While memory history is on (MemoryHistory.h), each
// device also keeps the allocation stack of every block and a trace of its
// actions, and snapshot() reports segments and blocks as CUDA's allocator does.
#include "core/DeviceAllocator.h"
#include "core/HostWait.h"

#include "core/MemoryHistory.h"
#include "core/Runtime.h"
#include "core/Stream.h"

#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <unordered_set>
#include <sstream>
#include <vector>

namespace torchneuron {
namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
using c10::CachingAllocator::StatTypes;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kMinBlockSize = 512;         // every size is a multiple of this
constexpr size_t kSmallSize = 1 << 20;        // largest "small" request
constexpr size_t kSmallBuffer = 2 << 20;      // small-pool segment size
constexpr size_t kMinLargeAlloc = 10 << 20;   // below: one kLargeBuffer segment
constexpr size_t kLargeBuffer = 20 << 20;     // large-pool segment for mid sizes
constexpr size_t kRoundLarge = 2 << 20;       // large segments round to this

struct BlockPool;

// ReuseBins on or off (an A/B switch for benchmarks; on by default).
std::atomic<bool> g_reuseBins{true};
bool reuseBinsEnabled() { return g_reuseBins.load(std::memory_order_relaxed); }

struct Block {
  c10::DeviceIndex device;
  nrtStream_t stream;  // allocation stream
  size_t size;         // block size in bytes
  size_t requested = 0;
  void* ptr;
  BlockPool* pool;
  bool allocated = false;
  bool binned = false;  // freed into a reuse bin (ReuseBins), not yet in its pool
  Block* prev = nullptr;  // neighbours within the same segment
  Block* next = nullptr;
  // Other streams that used it (recordStream); almost always none. A
  // std::unordered_set allocates nothing until its first insert, where
  // ska's flat set allocates a table as it is built: a malloc and a free
  // per Block, so per op, for a set that stays empty.
  std::unordered_set<nrtStream_t> stream_uses;
  int event_count = 0;  // outstanding events before reuse
  std::shared_ptr<c10::GatheredContext> context;  // allocation stack (history on)

  Block(c10::DeviceIndex d, nrtStream_t s, size_t sz, BlockPool* p, void* ptr_)
      : device(d), stream(s), size(sz), ptr(ptr_), pool(p) {}
  bool isSplit() const { return prev != nullptr || next != nullptr; }
};

struct BlockComparator {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};

using PoolSet = std::set<Block*, BlockComparator>;

struct BlockPool {
  explicit BlockPool(bool small_) : small(small_) {}
  PoolSet blocks;
  const bool small;
};

// One nrtMalloc'd range. Its blocks are reachable from `head` through next;
// only snapshots walk them.
struct Segment {
  Block* head;
  size_t size;
  nrtStream_t stream;
  BlockPool* pool;
  std::shared_ptr<c10::GatheredContext> context;  // stack of the allocation that made it
};

std::string formatBytes(size_t bytes) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  if (bytes < (1 << 10)) {
    os << bytes << " bytes";
  } else if (bytes < (1 << 20)) {
    os << bytes / 1024.0 << " KiB";
  } else if (bytes < (size_t(1) << 30)) {
    os << bytes / 1048576.0 << " MiB";
  } else {
    os << bytes / 1073741824.0 << " GiB";
  }
  return os.str();
}

// Requests are bounded (kMaxRequest, checked in allocate()) so that the
// roundings below cannot wrap: rounding SIZE_MAX - 510 and above up to
// 512 used to give 0, a block that aliased the next allocation.
constexpr size_t kMaxRequest = size_t(1) << 62;

size_t roundSize(size_t size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

size_t allocationSize(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
}

class DeviceCache {
 public:
  explicit DeviceCache(c10::DeviceIndex device) : device_(device) {}
  ~DeviceCache() {
    for (void* memory : spare_blocks_) ::operator delete(memory);
  }
  DeviceCache(const DeviceCache&) = delete;
  DeviceCache& operator=(const DeviceCache&) = delete;

  // context: the caller's stack when history records stacks, else null.
  // The block is entered in live_ under the same lock as the allocation.
  void* malloc(size_t orig_size, nrtStream_t stream,
               std::shared_ptr<c10::GatheredContext> context) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    processEvents();
    const size_t size = roundSize(orig_size);
    BlockPool& pool = size <= kSmallSize ? small_ : large_;
    Block* block = bins_.take(stream, size);
    if (block == nullptr) block = takeFreeBlock(pool, stream, size);
    if (block == nullptr && !bins_.empty()) {
      // Binned blocks may be what the request needs once merged: a new
      // segment only when the merged cache cannot serve it either.
      flushBins();
      block = takeFreeBlock(pool, stream, size);
    }
    if (block == nullptr) {
      block = allocateSegment(pool, stream, size, orig_size, context);
    }
    // Split off the unused tail so it can serve other requests.
    const size_t remaining = block->size - size;
    const bool split = pool.small ? remaining >= kMinBlockSize : remaining > kSmallSize;
    StatTypes types = statTypes(pool);
    if (split) {
      Block* rest = newBlock(stream, remaining, &pool, static_cast<char*>(block->ptr) + size);
      rest->prev = block;
      rest->next = block->next;
      if (rest->next) rest->next->prev = rest;
      block->next = rest;
      block->size = size;
      poolInsert(pool, rest);
      forEach(types, [&](size_t t) {
        stats_.inactive_split[t].increase(1);
        stats_.inactive_split_bytes[t].increase(remaining);
      });
    }
    block->allocated = true;
    block->requested = orig_size;
    if (trace_.recording()) {
      trace_.record(TraceEntry::kAlloc, addr(block->ptr), orig_size, stream, context);
    }
    block->context = std::move(context);
    forEach(types, [&](size_t t) {
      stats_.allocation[t].increase(1);
      stats_.allocated_bytes[t].increase(block->size);
      stats_.active[t].increase(1);
      stats_.active_bytes[t].increase(block->size);
      stats_.requested_bytes[t].increase(orig_size);
    });
    live_[block->ptr] = block;
    return block->ptr;
  }

  // Frees the block at `ptr` when this device allocated it; false when it
  // did not (the pointer is another device's). context: the caller's stack
  // when history records stacks of frees.
  bool free(void* ptr, std::shared_ptr<c10::GatheredContext>& context) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return false;
    Block* block = it->second;
    live_.erase(it);
    if (trace_.recording()) {
      trace_.record(TraceEntry::kFreeRequested, addr(block->ptr), block->requested,
                    block->stream, context);
    }
    block->allocated = false;
    StatTypes types = statTypes(*block->pool);
    forEach(types, [&](size_t t) {
      stats_.allocation[t].decrease(1);
      stats_.allocated_bytes[t].decrease(block->size);
      stats_.requested_bytes[t].decrease(block->requested);
    });
    if (!block->stream_uses.empty()) {
      // Defer reuse until the other streams that used the block are done.
      auto uses = std::move(block->stream_uses);
      block->stream_uses.clear();
      for (nrtStream_t s : uses) {
        nrtEvent_t ev = takeEvent();
        NEURON_CHECK(nrtEventRecord(ev, s));
        ++block->event_count;
        pending_.emplace_back(ev, block);
      }
    } else if (!binBlock(block)) {
      freeBlock(block, std::move(context));
    }
    return true;
  }

  // False when `ptr` is not a live block of this device.
  bool recordStream(void* ptr, nrtStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return false;
    Block* block = it->second;
    if (stream != block->stream) block->stream_uses.insert(stream);
    return true;
  }

  void emptyCache() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    releaseCachedBlocks();
  }

  DeviceStats stats() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    flushBins();  // the split counts are those of eagerly merged blocks
    return stats_;
  }

  void resetAccumulated() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    auto reset = [](StatArray& a) {
      for (auto& s : a) s.reset_accumulated();
    };
    for (StatArray* a : allArrays()) reset(*a);
    stats_.num_alloc_retries = 0;
    stats_.num_ooms = 0;
    stats_.num_sync_all_streams = 0;
    stats_.num_device_alloc = 0;
    stats_.num_device_free = 0;
    stats_.oversize_allocations.reset_accumulated();
    stats_.oversize_segments.reset_accumulated();
  }

  void resetPeak() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    for (StatArray* a : allArrays()) {
      for (auto& s : *a) s.reset_peak();
    }
    stats_.oversize_allocations.reset_peak();
    stats_.oversize_segments.reset_peak();
  }

  void configureHistory(const HistorySettings& settings) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    flushBins();  // the trace starts from merged blocks (no bins while it records)
    trace_.configure(settings);
  }

  // Appends this device's segments to `segments` and returns its trace, both
  // taken under the device lock so that replaying the trace backwards from
  // the segments (what memory_viz does) is consistent.
  std::vector<TraceEntry> snapshot(std::vector<SegmentSnapshot>& segments) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    processEvents();
    flushBins();
    // Like CUDA, streams are reported with the default stream as 0.
    nrtStream_t default_stream = 0;
    if (isInitialized()) NEURON_CHECK(nrtStreamGetDefault(&default_stream, device_));
    auto streamId = [&](nrtStream_t s) -> uint64_t { return s == default_stream ? 0 : s; };
    size_t total_active = 0;
    for (const auto& [address, seg] : segments_) {
      SegmentSnapshot out{device_, address, seg.size, 0, 0, 0, streamId(seg.stream),
                          seg.pool->small, seg.context, {}};
      for (Block* b = seg.head; b != nullptr; b = b->next) {
        BlockSnapshot::State state = b->allocated          ? BlockSnapshot::kActiveAllocated
                                     : b->event_count > 0 ? BlockSnapshot::kActivePendingFree
                                                          : BlockSnapshot::kInactive;
        const bool active = state != BlockSnapshot::kInactive;
        if (b->allocated) out.allocatedSize += b->size;
        if (active) {
          out.activeSize += b->size;
          out.requestedSize += b->requested;
        }
        out.blocks.push_back({b->size, active ? b->requested : 0, state, b->context});
      }
      total_active += out.activeSize;
      segments.push_back(std::move(out));
    }
    if (trace_.recording()) trace_.record(TraceEntry::kSnapshot, 0, total_active, 0, nullptr);
    std::vector<TraceEntry> entries = trace_.entries();
    for (TraceEntry& e : entries) e.stream = streamId(e.stream);
    return entries;
  }

 private:
  static uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

  template <typename F>
  static void forEach(const StatTypes& types, F f) {
    for (size_t t = 0; t < types.size(); ++t) {
      if (types[t]) f(t);
    }
  }

  static StatTypes statTypes(const BlockPool& pool) {
    StatTypes types{};
    types[static_cast<size_t>(StatType::AGGREGATE)] = true;
    types[static_cast<size_t>(pool.small ? StatType::SMALL_POOL : StatType::LARGE_POOL)] = true;
    return types;
  }

  std::vector<StatArray*> allArrays() {
    return {&stats_.allocation,     &stats_.segment,         &stats_.active,
            &stats_.inactive_split, &stats_.allocated_bytes, &stats_.reserved_bytes,
            &stats_.active_bytes,   &stats_.inactive_split_bytes, &stats_.requested_bytes};
  }

  Block* takeFreeBlock(BlockPool& pool, nrtStream_t stream, size_t size) {
    Block key(device_, stream, size, &pool, nullptr);
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
    // Do not let a small request fragment a much larger cached segment.
    if (!pool.small && (*it)->size >= size + kLargeBuffer) return nullptr;
    Block* block = *it;
    poolErase(pool, it);
    if (block->isSplit()) {
      forEach(statTypes(pool), [&](size_t t) {
        stats_.inactive_split[t].decrease(1);
        stats_.inactive_split_bytes[t].decrease(block->size);
      });
    }
    return block;
  }

  Block* allocateSegment(BlockPool& pool, nrtStream_t stream, size_t size, size_t orig_size,
                         const std::shared_ptr<c10::GatheredContext>& context) {
    const size_t alloc_size = allocationSize(size);
    void* ptr = nullptr;
    nrtStatus st = nrtMalloc(&ptr, alloc_size, device_);
    if (st == NRT_ERROR_OUT_OF_MEMORY) {
      // Free the cache and retry once.
      stats_.num_alloc_retries += 1;
      releaseCachedBlocks();
      st = nrtMalloc(&ptr, alloc_size, device_);
    }
    if (st == NRT_ERROR_OUT_OF_MEMORY) {
      stats_.num_ooms += 1;
      size_t free_bytes = 0, total_bytes = 0, largest_free = 0;
      NEURON_WARN_IF_ERROR(nrtMemGetInfo(device_, &free_bytes, &total_bytes));
      NEURON_WARN_IF_ERROR(nrtMemGetLargestFreeRange(device_, &largest_free));
      if (trace_.recording()) trace_.record(TraceEntry::kOom, free_bytes, size, stream, context);
      throwOutOfMemory(orig_size, alloc_size, free_bytes, total_bytes, largest_free);
    }
    NEURON_CHECK(st);
    stats_.num_device_alloc += 1;
    forEach(statTypes(pool), [&](size_t t) {
      stats_.segment[t].increase(1);
      stats_.reserved_bytes[t].increase(alloc_size);
    });
    Block* block = newBlock(stream, alloc_size, &pool, ptr);
    segments_.emplace(addr(ptr), Segment{block, alloc_size, stream, &pool, context});
    if (trace_.recording()) {
      trace_.record(TraceEntry::kSegmentAlloc, addr(ptr), alloc_size, stream, context);
    }
    return block;
  }

  [[noreturn]] void throwOutOfMemory(size_t orig_size, size_t alloc_size, size_t free_bytes,
                                     size_t total_bytes, size_t largest_free) {
    const size_t agg = static_cast<size_t>(StatType::AGGREGATE);
    const size_t allocated = stats_.allocated_bytes[agg].current;
    const size_t reserved = stats_.reserved_bytes[agg].current;
    std::ostringstream free_part;
    free_part << formatBytes(free_bytes) << " is free";
    if (free_bytes >= alloc_size && largest_free < alloc_size) {
      // Enough bytes, no range: the arena's free memory is in pieces.
      free_part << ", but its largest free range is " << formatBytes(largest_free)
                << ": the device memory is fragmented";
    }
    // The retry released every cached segment it could: what is reserved but
    // unallocated now sits in segments that also hold live tensors.
    TORCH_CHECK_WITH(
        OutOfMemoryError, false, "Neuron out of memory. Tried to allocate ",
        formatBytes(orig_size), " (a segment of ", formatBytes(alloc_size), "). Device neuron:",
        static_cast<int>(device_), " has a total capacity of ", formatBytes(total_bytes),
        " of which ", free_part.str(), ". ", formatBytes(allocated),
        " is allocated by PyTorch, and ", formatBytes(reserved), " is reserved by PyTorch (",
        formatBytes(reserved - std::min(reserved, allocated)),
        " reserved but unallocated, in segments that also hold live tensors). Free tensors, "
        "call torch.neuron.empty_cache(), or raise NEURON_RT_MEMORY_PER_CORE. To see what "
        "holds the memory, call torch.neuron.memory._record_memory_history() before the "
        "allocations and torch.neuron.memory._dump_snapshot('snapshot.pickle') after this "
        "error, and open the file at https://pytorch.org/memory_viz.");
  }

  // Returns a block whose events have completed to its pool, merging it with
  // free neighbours.
  // context: the stack of the free, when history records it.
  void freeBlock(Block* block, std::shared_ptr<c10::GatheredContext> context) {
    if (trace_.recording()) {
      trace_.record(TraceEntry::kFreeCompleted, addr(block->ptr), block->requested, block->stream,
                    std::move(context));
    }
    deactivate(block);
    returnToPool(block);
  }

  // A freed block's use ends: its stack and request go, and it no longer
  // counts as active (before any merge changes its size).
  void deactivate(Block* block) {
    block->context.reset();
    block->requested = 0;
    forEach(statTypes(*block->pool), [&](size_t t) {
      stats_.active[t].decrease(1);
      stats_.active_bytes[t].decrease(block->size);
    });
  }

  // Puts a free block in its pool, merged with its free neighbours (those in
  // the pool: a binned neighbour merges when it is flushed).
  void returnToPool(Block* block) {
    BlockPool& pool = *block->pool;
    StatTypes types = statTypes(pool);
    for (Block* neighbour : {block->prev, block->next}) {
      if (neighbour == nullptr || neighbour->allocated || neighbour->binned ||
          neighbour->event_count > 0)
        continue;
      // The neighbour is a free, split block in the pool: absorb it.
      forEach(types, [&](size_t t) {
        stats_.inactive_split[t].decrease(1);
        stats_.inactive_split_bytes[t].decrease(neighbour->size);
      });
      if (auto it = pool.blocks.find(neighbour); it != pool.blocks.end()) poolErase(pool, it);
      if (neighbour == block->prev) {
        block->ptr = neighbour->ptr;
        block->prev = neighbour->prev;
        if (block->prev) {
          block->prev->next = block;
        } else {
          segments_.at(addr(block->ptr)).head = block;  // it now starts the segment
        }
      } else {
        block->next = neighbour->next;
        if (block->next) block->next->prev = block;
      }
      block->size += neighbour->size;
      deleteBlock(neighbour);
    }
    poolInsert(pool, block);
    if (block->isSplit()) {
      forEach(types, [&](size_t t) {
        stats_.inactive_split[t].increase(1);
        stats_.inactive_split_bytes[t].increase(block->size);
      });
    }
  }

  // A free of a small block with no other stream's use keeps it whole in a
  // bin (its stats as freeBlock's, the pool's merge deferred); false: the
  // caller frees it the usual way.
  bool binBlock(Block* block) {
    if (trace_.recording() || !bins_.put(block)) return false;
    deactivate(block);
    return true;
  }

  // Returns every binned block to its pool, merged as freeBlock merges.
  void flushBins() {
    bins_.drain([&](Block* block) { returnToPool(block); });
  }

  nrtEvent_t takeEvent() {
    if (!free_events_.empty()) {
      nrtEvent_t ev = free_events_.back();
      free_events_.pop_back();
      return ev;
    }
    nrtEvent_t ev = 0;
    NEURON_CHECK(nrtEventCreate(&ev, NRT_EVENT_DISABLE_TIMING));
    return ev;
  }

  void completeEvent(nrtEvent_t ev, Block* block) {
    free_events_.push_back(ev);
    if (--block->event_count == 0) freeBlock(block, nullptr);
  }

  // Returns blocks whose deferred-reuse events have completed.
  void processEvents() {
    while (!pending_.empty()) {
      auto [ev, block] = pending_.front();
      const nrtStatus st = nrtEventQuery(ev);
      if (st == NRT_ERROR_NOT_READY) break;
      // Any other status (a kernel failure is reported elsewhere) means the
      // recorded work is finished.
      pending_.pop_front();
      completeEvent(ev, block);
    }
  }

  void synchronizeAndFreeEvents() {
    if (pending_.empty()) return;
    stats_.num_sync_all_streams += 1;
    while (!pending_.empty()) {
      auto [ev, block] = pending_.front();
      pending_.pop_front();
      (void)nrtEventSynchronize(ev);
      completeEvent(ev, block);
    }
  }

  void releaseCachedBlocks() {
    synchronizeAndFreeEvents();
    flushBins();
    // A free block may still be read or written by kernels queued before its
    // tensor died (stream-ordered reuse makes that safe for the cache, but
    // not for returning memory to the runtime): drain the device first, as
    // cudaFree does.
    bool any_whole_segment = false;
    for (BlockPool* pool : {&small_, &large_}) {
      for (Block* block : pool->blocks) any_whole_segment |= !block->isSplit();
    }
    if (!any_whole_segment) return;
    noteHostWait(WaitCause::Allocator, "release cached memory (empty_cache / OOM retry)",
                 /*withStack=*/false);  // (under the device's lock)
    NEURON_WARN_IF_ERROR(nrtDeviceSynchronize(device_));
    for (BlockPool* pool : {&small_, &large_}) {
      for (auto it = pool->blocks.begin(); it != pool->blocks.end();) {
        Block* block = *it;
        if (block->isSplit()) {
          ++it;
          continue;
        }
        it = poolErase(*pool, it);
        NEURON_WARN_IF_ERROR(nrtFree(block->ptr));
        stats_.num_device_free += 1;
        segments_.erase(addr(block->ptr));
        if (trace_.recording()) {
          trace_.record(TraceEntry::kSegmentFree, addr(block->ptr), block->size, block->stream,
                        nullptr);
        }
        forEach(statTypes(*pool), [&](size_t t) {
          stats_.segment[t].decrease(1);
          stats_.reserved_bytes[t].decrease(block->size);
        });
        deleteBlock(block);
      }
    }
  }

  // Every small op splits a block when it allocates and merges it back when
  // it frees: the Block of the split-off rest and the pool's set nodes are
  // recycled here, as three mallocs and three frees per op were a tenth of
  // a small op's host cost. Both are used under mutex_.
  static constexpr size_t kSpares = 64;

  Block* newBlock(nrtStream_t stream, size_t size, BlockPool* pool, void* ptr) {
    void* memory = nullptr;
    if (spare_blocks_.empty()) {
      memory = ::operator new(sizeof(Block));
    } else {
      memory = spare_blocks_.back();
      spare_blocks_.pop_back();
    }
    return new (memory) Block(device_, stream, size, pool, ptr);
  }
  void deleteBlock(Block* block) {
    block->~Block();
    if (spare_blocks_.size() < kSpares) {
      spare_blocks_.push_back(block);
    } else {
      ::operator delete(block);
    }
  }
  void poolInsert(BlockPool& pool, Block* block) {
    if (spare_nodes_.empty()) {
      pool.blocks.insert(block);
      return;
    }
    PoolSet::node_type node = std::move(spare_nodes_.back());
    spare_nodes_.pop_back();
    node.value() = block;
    pool.blocks.insert(std::move(node));
  }
  PoolSet::iterator poolErase(BlockPool& pool, PoolSet::iterator it) {
    auto next = std::next(it);
    PoolSet::node_type node = pool.blocks.extract(it);
    if (spare_nodes_.size() < kSpares) spare_nodes_.push_back(std::move(node));
    return next;
  }

  // Small blocks freed whole for the next request of their size on their
  // stream. Nearly every small op frees a block of the size the next one
  // asks for; the pool's path splits a block from a cached range at each
  // allocation and merges it back at each free (two ordered-set updates, a
  // Block made and unmade), which cost more than CPU's whole allocation.
  // A binned block is free but outside its pool: everything that looks at
  // the pool (a request the bins cannot serve before it takes a new segment,
  // stats, snapshots, empty_cache, history) flushes the bins first, so what
  // it sees is the eagerly merged pool, and peak figures are those of merged
  // blocks too. Not used while history records (its trace has every merge).
  class ReuseBins {
   public:
    static constexpr size_t kMaxSize = 256 << 10;  // largest block kept
    static constexpr size_t kDepth = 8;            // blocks kept per size

    Block* take(nrtStream_t stream, size_t size) {
      if (size > kMaxSize || count_ == 0) return nullptr;
      std::vector<Block*>& bin = bins_[size / kMinBlockSize];
      for (size_t i = bin.size(); i-- > 0;) {
        Block* b = bin[i];
        if (b->stream != stream) continue;
        bin[i] = bin.back();
        bin.pop_back();
        --count_;
        b->binned = false;
        return b;
      }
      return nullptr;
    }
    bool put(Block* b) {
      if (b->size > kMaxSize || !reuseBinsEnabled()) return false;
      std::vector<Block*>& bin = bins_[b->size / kMinBlockSize];
      if (bin.size() >= kDepth) return false;
      if (bin.capacity() == 0) bin.reserve(kDepth);
      bin.push_back(b);
      ++count_;
      b->binned = true;
      return true;
    }
    bool empty() const { return count_ == 0; }
    // Empties the bins: f(block) for each, its binned mark cleared just
    // before (a neighbour still binned is not merged into it: that
    // neighbour's own turn merges the two).
    template <class F>
    void drain(F f) {
      if (count_ == 0) return;
      for (auto& bin : bins_) {
        for (Block* b : bin) {
          b->binned = false;
          f(b);
        }
        count_ -= bin.size();
        bin.clear();
      }
    }

   private:
    std::vector<Block*> bins_[kMaxSize / kMinBlockSize + 1];
    size_t count_ = 0;
  };

  const c10::DeviceIndex device_;
  std::recursive_mutex mutex_;
  ReuseBins bins_;
  std::vector<void*> spare_blocks_;  // raw memory for a Block
  std::vector<PoolSet::node_type> spare_nodes_;
  DeviceStats stats_;
  BlockPool small_{true};
  BlockPool large_{false};
  std::deque<std::pair<nrtEvent_t, Block*>> pending_;
  std::vector<nrtEvent_t> free_events_;
  std::map<uintptr_t, Segment> segments_;  // by address: snapshots list them in order
  // Allocated blocks by address, what a DataPtr's deleter gets. Kept per
  // device, under the device's lock: one lock per allocation and per free
  // (a second, global table and its mutex were two more per op).
  ska::flat_hash_map<void*, Block*> live_;
  DeviceTrace trace_;
};

void rawDelete(void* ptr);

class NeuronCachingAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = currentDevice();
    lazyInit();
    // A negative size (UntypedStorage(-1), storage.resize_(-1)) arrives as a
    // huge size_t: refuse it as CPU's alloc_cpu does.
    TORCH_CHECK(static_cast<ptrdiff_t>(nbytes) >= 0,
                "neuron allocator was called with a negative number of bytes: ",
                static_cast<ptrdiff_t>(nbytes), " (", nbytes,
                " as an unsigned size); a storage size must be >= 0");
    if (nbytes > kMaxRequest) {
      size_t free_bytes = 0, total_bytes = 0;
      NEURON_CHECK(nrtMemGetInfo(device, &free_bytes, &total_bytes));
      TORCH_CHECK_WITH(OutOfMemoryError, false, "Neuron out of memory. Tried to allocate ",
                       nbytes, " bytes; device neuron:", static_cast<int>(device),
                       " has a total capacity of ", formatBytes(total_bytes), ".");
    }
    if (nbytes == 0) {
      return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::PrivateUse1, device));
    }
    nrtStream_t stream = getCurrentStream(device).handle();
    std::shared_ptr<c10::GatheredContext> context;
    if (C10_UNLIKELY(memoryHistoryEnabled())) context = gatherContext(RecordContext::kState);
    void* ptr = cache(device).malloc(nbytes, stream, std::move(context));
    return c10::DataPtr(ptr, ptr, &rawDelete, c10::Device(c10::DeviceType::PrivateUse1, device));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &rawDelete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    noteHostWait(WaitCause::Other, "allocator copy_data");
    NEURON_CHECK(nrtMemcpy(dest, src, count, nrtMemcpyDeviceToDevice));
  }

  void free(void* ptr) {
    if (ptr == nullptr) return;
    // In a child forked after initialisation the runtime refuses every call
    // and the memory is the child's private copy: a tensor inherited from
    // the parent is dropped without touching the cache (a deleter must not
    // throw).
    if (isInBadFork()) return;
    std::shared_ptr<c10::GatheredContext> context;
    if (C10_UNLIKELY(memoryHistoryEnabled())) context = gatherContext(RecordContext::kAll);
    // The device that allocated it: with one device, the only one; with
    // several, the one whose table holds the pointer.
    bool freed = false;
    for (auto& c : caches()) {
      if ((freed = c->free(ptr, context))) break;
    }
    TORCH_INTERNAL_ASSERT(freed, "neuron allocator: freeing unknown pointer ", ptr);
  }

  bool initialized() override { return isInitialized(); }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    if (!isInitialized() || isInBadFork()) return;
    for (auto& c : caches()) c->emptyCache();
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (!ptr.get() || ptr.get_deleter() != &rawDelete) return;
    const nrtStream_t handle = streamHandle(stream);
    for (auto& c : caches()) {
      if (c->recordStream(ptr.get(), handle)) return;
    }
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return cache(resolveDevice(device)).stats();
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    cache(resolveDevice(device)).resetAccumulated();
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    cache(resolveDevice(device)).resetPeak();
  }
  void recordHistory(const HistorySettings& settings) {
    setHistoryContext(settings);
    for (auto& c : caches()) c->configureHistory(settings);
  }

  MemorySnapshot snapshot() {
    MemorySnapshot out;
    for (auto& c : caches()) out.deviceTraces.push_back(c->snapshot(out.segments));
    return out;
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    size_t free_bytes = 0, total_bytes = 0;
    NEURON_CHECK(nrtMemGetInfo(resolveDevice(device), &free_bytes, &total_bytes));
    return {free_bytes, total_bytes};
  }

 private:
  std::vector<std::unique_ptr<DeviceCache>>& caches() {
    // Never destroyed: tensors may be freed during interpreter teardown.
    static auto* all = [] {
      auto* v = new std::vector<std::unique_ptr<DeviceCache>>();
      for (c10::DeviceIndex i = 0; i < deviceCount(); ++i) {
        v->push_back(std::make_unique<DeviceCache>(i));
      }
      return v;
    }();
    return *all;
  }
  DeviceCache& cache(c10::DeviceIndex device) {
    checkDeviceIndex(device);
    return *caches()[device];
  }
};

// Never destroyed: a tensor can be freed after this library's static
// destructors ran (by another library's static object, or a thread that
// outlives main) and must still find its allocator and block table.
NeuronCachingAllocator& g_allocator = *new NeuronCachingAllocator();

void rawDelete(void* ptr) { g_allocator.free(ptr); }

}  // namespace

c10::DeviceAllocator* getDeviceAllocator() { return &g_allocator; }

void setAllocatorReuseBins(bool on) { g_reuseBins.store(on, std::memory_order_relaxed); }

void recordMemoryHistory(const HistorySettings& settings) { g_allocator.recordHistory(settings); }

MemorySnapshot memorySnapshot() { return g_allocator.snapshot(); }

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator)

}  // namespace torchneuron
