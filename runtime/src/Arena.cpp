// Arena.cpp — reservation and best-fit sub-allocation of device memory.
#include "Arena.h"

#include <sys/mman.h>
#include <unistd.h>

namespace nrt {
namespace {

constexpr size_t kReleaseThreshold = size_t(4) << 20;

size_t roundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Gives the physical pages of a large freed range back to the OS, so a
// device's resident memory follows what is allocated. Pages come back
// zero-filled on next touch; device memory is uninitialised by contract.
void releasePages(uintptr_t addr, size_t size) {
  if (size < kReleaseThreshold) return;
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  uintptr_t start = roundUp(addr, page);
  uintptr_t end = (addr + size) / page * page;
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED);
}

}  // namespace

Arena::Arena(size_t capacity) : capacity_(roundUp(capacity, kAlignment)) {
  // MAP_NORESERVE: the range costs no memory until touched.
  void* p = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    capacity_ = 0;
    return;
  }
  base_ = static_cast<char*>(p);
  insertFree(reinterpret_cast<uintptr_t>(base_), capacity_);
}

Arena::~Arena() {
  if (base_) munmap(base_, capacity_);
}

size_t Arena::used() const {
  std::lock_guard<std::mutex> lk(mu_);
  return used_;
}

size_t Arena::largestFree() const {
  std::lock_guard<std::mutex> lk(mu_);
  return freeBySize_.empty() ? 0 : freeBySize_.rbegin()->first;
}

void Arena::insertFree(uintptr_t addr, size_t size) {
  freeByAddr_.emplace(addr, size);
  freeBySize_.emplace(size, addr);
}

void Arena::eraseFree(std::map<uintptr_t, size_t>::iterator it) {
  freeBySize_.erase({it->second, it->first});
  freeByAddr_.erase(it);
}

void* Arena::allocate(size_t size) {
  if (size == 0 || size > capacity_) return nullptr;
  size = roundUp(size, kAlignment);
  std::lock_guard<std::mutex> lk(mu_);
  auto fit = freeBySize_.lower_bound({size, 0});
  if (fit == freeBySize_.end()) return nullptr;
  uintptr_t addr = fit->second;
  size_t have = fit->first;
  eraseFree(freeByAddr_.find(addr));
  if (have > size) insertFree(addr + size, have - size);
  live_.emplace(addr, size);
  used_ += size;
  return reinterpret_cast<void*>(addr);
}

bool Arena::release(void* p) {
  auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(addr);
  if (it == live_.end()) return false;
  size_t size = it->second;
  live_.erase(it);
  used_ -= size;
  releasePages(addr, size);
  // Coalesce with the free neighbours on both sides.
  auto next = freeByAddr_.lower_bound(addr);
  if (next != freeByAddr_.end() && next->first == addr + size) {
    size += next->second;
    eraseFree(next);
  }
  auto prev = freeByAddr_.lower_bound(addr);
  if (prev != freeByAddr_.begin()) {
    --prev;
    if (prev->first + prev->second == addr) {
      addr = prev->first;
      size += prev->second;
      eraseFree(prev);
    }
  }
  insertFree(addr, size);
  return true;
}

bool Arena::find(const void* p, void** base, size_t* size) const {
  auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.upper_bound(addr);
  if (it == live_.begin()) return false;
  --it;
  if (addr >= it->first + it->second) return false;
  *base = reinterpret_cast<void*>(it->first);
  *size = it->second;
  return true;
}

}  // namespace nrt
