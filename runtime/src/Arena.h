// Arena.h — one device's memory: a fixed address range reserved up front
// (committed lazily by the OS) and a best-fit sub-allocator inside it.
//
// Reserving the whole capacity makes "is this a device pointer, and of which
// device" a range check, and makes the capacity a hard limit: an allocation
// that does not fit fails; it never spills into ordinary host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <utility>

namespace nrt {

class Arena {
 public:
  static constexpr size_t kAlignment = 256;

  // Reserves capacity bytes of address space. ok() is false if the host
  // refused the reservation.
  explicit Arena(size_t capacity);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  bool ok() const { return base_ != nullptr; }
  size_t capacity() const { return capacity_; }
  size_t used() const;
  size_t largestFree() const;

  bool contains(const void* p) const {
    auto a = reinterpret_cast<uintptr_t>(p);
    return a >= reinterpret_cast<uintptr_t>(base_) &&
           a < reinterpret_cast<uintptr_t>(base_) + capacity_;
  }

  // Whether [p, p+size) shares a byte with the reserved range (size > 0, no wrap).
  bool overlaps(const void* p, size_t size) const {
    auto a = reinterpret_cast<uintptr_t>(p);
    auto lo = reinterpret_cast<uintptr_t>(base_);
    return size > 0 && a < lo + capacity_ && a + size > lo;
  }

  // Returns nullptr when no free range of size bytes exists.
  void* allocate(size_t size);
  // Frees a live allocation's base pointer; false if p is not one.
  bool release(void* p);
  // Finds the live allocation containing p (any interior pointer).
  bool find(const void* p, void** base, size_t* size) const;

 private:
  void insertFree(uintptr_t addr, size_t size);
  void eraseFree(std::map<uintptr_t, size_t>::iterator it);

  char* base_ = nullptr;
  size_t capacity_ = 0;
  mutable std::mutex mu_;
  size_t used_ = 0;
  std::map<uintptr_t, size_t> live_;               // base -> size
  std::map<uintptr_t, size_t> freeByAddr_;         // base -> size
  std::set<std::pair<size_t, uintptr_t>> freeBySize_;  // (size, base), best fit
};

}  // namespace nrt
