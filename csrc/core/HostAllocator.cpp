// Caching pinned host allocator.
//
// Blocks come from nrtHostAlloc, rounded up to a power of two, and are cached
// by size after use. A block used by an asynchronous copy is recorded on the
// copy's stream (record_event, as copy_ does for non_blocking transfers); its
// reuse waits for an event recorded on that stream when the block is freed.
#include "core/HostAllocator.h"

#include "core/Runtime.h"
#include "core/Stream.h"

#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>
#include <c10/util/llvmMathExtras.h>

#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

namespace torchneuron {
namespace {

struct HostBlock {
  void* ptr;
  size_t size;
  bool allocated = false;
  int event_count = 0;
  ska::flat_hash_set<nrtStream_t> streams;
};

void hostDelete(void* ctx);

class NeuronHostAllocator final : public at::HostAllocator {
 public:
  at::DataPtr allocate(size_t size) override {
    if (size == 0) {
      return {nullptr, nullptr, &hostDelete, at::Device(at::DeviceType::CPU)};
    }
    // Rounding to a power of two wraps to 0 above 2^63 (a negative size
    // seen as size_t): refuse such sizes as CPU's alloc_cpu does.
    TORCH_CHECK(static_cast<ptrdiff_t>(size) >= 0,
                "neuron pinned-memory allocator was called with a negative number of bytes: ",
                static_cast<ptrdiff_t>(size));
    TORCH_CHECK_WITH(OutOfMemoryError, size <= (size_t(1) << 62),
                     "neuron pinned-memory allocator: cannot allocate ", size, " bytes");
    const size_t rounded = c10::llvm::PowerOf2Ceil(std::max<size_t>(size, 512));
    std::lock_guard<std::mutex> lock(mutex_);
    processEvents();
    HostBlock* block = nullptr;
    auto& list = free_[rounded];
    if (!list.empty()) {
      block = list.back();
      list.pop_back();
    } else {
      void* ptr = nullptr;
      NEURON_CHECK(nrtHostAlloc(&ptr, rounded));
      block = new HostBlock{ptr, rounded};
      blocks_[ptr] = block;
      stats_.allocations.increase(1);
      stats_.allocated_bytes.increase(rounded);
      stats_.num_host_alloc += 1;
    }
    block->allocated = true;
    stats_.active_requests.increase(1);
    stats_.active_bytes.increase(block->size);
    return {block->ptr, block->ptr, &hostDelete, at::Device(at::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &hostDelete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  void free(void* ctx) {
    if (ctx == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ctx);
    TORCH_INTERNAL_ASSERT(it != blocks_.end(), "neuron host allocator: unknown block ", ctx);
    HostBlock* block = it->second;
    block->allocated = false;
    stats_.active_requests.decrease(1);
    stats_.active_bytes.decrease(block->size);
    if (block->streams.empty()) {
      free_[block->size].push_back(block);
      return;
    }
    for (nrtStream_t s : block->streams) {
      nrtEvent_t ev = 0;
      NEURON_CHECK(nrtEventCreate(&ev, NRT_EVENT_DISABLE_TIMING));
      NEURON_CHECK(nrtEventRecord(ev, s));
      ++block->event_count;
      pending_.emplace_back(ev, block);
    }
    block->streams.clear();
  }

  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    if (ctx == nullptr || stream.device_type() != c10::DeviceType::PrivateUse1) return false;
    const nrtStream_t handle = streamHandle(stream);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ctx);
    if (it == blocks_.end()) return false;
    it->second->streams.insert(handle);
    return true;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!pending_.empty()) {
      auto [ev, block] = pending_.front();
      pending_.pop_front();
      (void)nrtEventSynchronize(ev);
      completeEvent(ev, block);
    }
    for (auto& [size, list] : free_) {
      for (HostBlock* block : list) {
        NEURON_WARN_IF_ERROR(nrtHostFree(block->ptr));
        blocks_.erase(block->ptr);
        stats_.allocations.decrease(1);
        stats_.allocated_bytes.decrease(block->size);
        stats_.num_host_free += 1;
        delete block;
      }
      list.clear();
    }
  }

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.active_requests.reset_accumulated();
    stats_.active_bytes.reset_accumulated();
    stats_.allocations.reset_accumulated();
    stats_.allocated_bytes.reset_accumulated();
    stats_.num_host_alloc = 0;
    stats_.num_host_free = 0;
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.active_requests.reset_peak();
    stats_.active_bytes.reset_peak();
    stats_.allocations.reset_peak();
    stats_.allocated_bytes.reset_peak();
  }

 private:
  void completeEvent(nrtEvent_t ev, HostBlock* block) {
    (void)nrtEventDestroy(ev);
    if (--block->event_count == 0 && !block->allocated) {
      free_[block->size].push_back(block);
    }
  }

  void processEvents() {
    while (!pending_.empty()) {
      auto [ev, block] = pending_.front();
      if (nrtEventQuery(ev) == NRT_ERROR_NOT_READY) break;
      pending_.pop_front();
      completeEvent(ev, block);
    }
  }

  std::mutex mutex_;
  ska::flat_hash_map<void*, HostBlock*> blocks_;
  std::map<size_t, std::vector<HostBlock*>> free_;
  std::deque<std::pair<nrtEvent_t, HostBlock*>> pending_;
  at::HostStats stats_;
};

// Never destroyed, as the device allocator (pinned tensors can outlive it).
NeuronHostAllocator& g_host_allocator = *new NeuronHostAllocator();

void hostDelete(void* ctx) { g_host_allocator.free(ctx); }

}  // namespace

at::HostAllocator* getHostAllocator() { return &g_host_allocator; }

bool isPinnedPtr(const void* ptr) {
  if (ptr == nullptr) return false;
  nrtPointerAttributes attr{};
  if (nrtPointerGetAttributes(&attr, ptr) != NRT_SUCCESS) return false;
  return attr.type == nrtMemoryTypeHost;
}

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_host_allocator)

}  // namespace torchneuron
