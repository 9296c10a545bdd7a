// HandleTable.h — 64-bit handles (slot index + generation) for streams and
// events, so that a destroyed handle is recognised instead of dereferenced.
//
// Objects live in slots that are never freed; a destroyed object's slot is
// reused under a new generation. Lookup is lock-free: it compares the handle
// with the slot's current handle.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace nrt {

template <class T>
class HandleTable {
 public:
  static constexpr uint32_t kChunk = 4096;
  static constexpr uint32_t kMaxChunks = 256;  // 1M live objects

  HandleTable() {
    for (auto& c : chunks_) c.store(nullptr, std::memory_order_relaxed);
  }
  HandleTable(const HandleTable&) = delete;
  HandleTable& operator=(const HandleTable&) = delete;

  // Takes a free slot. Calls init(obj, handle) on its object before the
  // handle is published. Returns 0 when the table is full.
  template <class Init>
  uint64_t create(Init&& init) {
    std::lock_guard<std::mutex> lk(mu_);
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = next_;
      if (index / kChunk >= kMaxChunks) return 0;
      Slot* chunk = chunks_[index / kChunk].load(std::memory_order_relaxed);
      if (!chunk) {
        chunk = new Slot[kChunk];
        chunks_[index / kChunk].store(chunk, std::memory_order_release);
      }
      ++next_;
    }
    Slot& s = slot(index);
    if (!s.obj) s.obj.reset(new T());
    s.generation += 1;
    uint64_t handle = (uint64_t(s.generation) << 32) | (uint64_t(index) + 1);
    init(*s.obj, handle);
    s.handle.store(handle, std::memory_order_release);
    return handle;
  }

  // The object of a live handle, or nullptr.
  T* lookup(uint64_t handle) const {
    uint32_t low = static_cast<uint32_t>(handle);
    if (low == 0) return nullptr;
    uint32_t index = low - 1;
    if (index / kChunk >= kMaxChunks) return nullptr;
    Slot* chunk = chunks_[index / kChunk].load(std::memory_order_acquire);
    if (!chunk) return nullptr;
    Slot& s = chunk[index % kChunk];
    if (s.handle.load(std::memory_order_acquire) != handle) return nullptr;
    return s.obj.get();
  }

  // Retires a live handle: lookups fail from now on, but the slot is not
  // reused until release(). Returns the object, or nullptr if not live.
  T* retire(uint64_t handle, uint32_t* index) {
    std::lock_guard<std::mutex> lk(mu_);
    T* obj = lookup(handle);
    if (!obj) return nullptr;
    *index = static_cast<uint32_t>(handle) - 1;
    slot(*index).handle.store(0, std::memory_order_release);
    return obj;
  }

  // Makes a retired slot reusable.
  void release(uint32_t index) {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(index);
  }

 private:
  struct Slot {
    std::atomic<uint64_t> handle{0};
    uint32_t generation = 0;
    std::unique_ptr<T> obj;
  };
  Slot& slot(uint32_t index) const {
    return chunks_[index / kChunk].load(std::memory_order_acquire)[index % kChunk];
  }

  std::mutex mu_;
  std::atomic<Slot*> chunks_[kMaxChunks];
  uint32_t next_ = 0;
  std::vector<uint32_t> free_;
};

}  // namespace nrt
