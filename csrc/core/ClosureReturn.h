// How finished work closures go back to the thread that launched them.
//
// A closure (Launch.h) is allocated by the launching (host) thread and would
// be freed by the executor thread that ran it; freeing across threads makes
// the two contend in the C allocator. So the thread that ran closures
// collects them in a batch of its own and hands a full batch back on a
// lock-free list, which the next launch empties, on the host side. Per
// closure, neither side writes memory the other reads: a list node per
// closure (an atomic exchange per launch and a chain of cache misses to
// walk) cost the host about 0.2 us per small op. A worker about to sleep
// hands back its partial batch too (onWorkerIdle, ComputeThreads.cpp), so
// what a closure holds is released within an idle spell.
//
// Batches free closures 64 at a time, more than the C allocator's per-thread
// cache keeps, so its slow paths would run for most launches. The thread
// that frees closures keeps their memory instead, by size class, and gives
// it to its next closures, last freed first (ClosureMemory).
#pragma once

#include <atomic>
#include <cstddef>
#include <new>

namespace torchneuron {
namespace detail {

// Closure memory in classes of 64 bytes up to 1 KiB; larger closures and
// blocks past a class's keep limit go to the C allocator.
class ClosureMemory {
 public:
  static void* allocate(size_t bytes) {
    const size_t c = classOf(bytes);
    if (c < kClasses && !binsGone()) {
      Bin& bin = bins().bin[c];
      if (bin.head != nullptr) {
        Free* f = bin.head;
        bin.head = f->next;
        --bin.count;
        return f;
      }
      return ::operator new((c + 1) * kGrain);
    }
    return ::operator new(bytes);
  }
  static void release(void* p, size_t bytes) {
    const size_t c = classOf(bytes);
    if (c < kClasses && !binsGone()) {
      Bin& bin = bins().bin[c];
      if (bin.count < kKeep) {
        bin.head = new (p) Free{bin.head};
        ++bin.count;
        return;
      }
    }
    ::operator delete(p);
  }

 private:
  static constexpr size_t kGrain = 64;
  static constexpr size_t kClasses = 16;
  static constexpr int kKeep = 256;
  struct Free {
    Free* next;
  };
  struct Bin {
    Free* head = nullptr;
    int count = 0;
  };
  struct Bins {
    Bin bin[kClasses];
    ~Bins() {  // the thread ends
      binsGone() = true;
      for (Bin& b : bin) {
        while (b.head) {
          Free* f = b.head;
          b.head = f->next;
          ::operator delete(f);
        }
      }
    }
  };
  static size_t classOf(size_t bytes) { return bytes == 0 ? 0 : (bytes - 1) / kGrain; }
  static Bins& bins() {
    thread_local Bins b;
    return b;
  }
  // Whether this thread's bins were destroyed (its exit under way): a
  // closure freed after that goes to the C allocator. Trivially
  // destructible, so it stays readable to the thread's very end.
  static bool& binsGone() {
    thread_local bool gone = false;
    return gone;
  }
};

struct DeadClosure {
  void (*destroy)(DeadClosure*) = nullptr;
  const char* name = "<unnamed kernel>";  // the work item's (static) name, for its warnings
};

struct DeadBatch {
  static constexpr int kSize = 64;
  DeadBatch* next = nullptr;
  int count = 0;
  DeadClosure* items[kSize];
};

inline std::atomic<DeadBatch*>& deadBatches() {
  static std::atomic<DeadBatch*> head{nullptr};
  return head;
}

// The batch this thread is filling. A thread that ends with a partial batch
// (a host thread that ran closures under NEURON_LAUNCH_BLOCKING=1; workers
// live as long as the process) leaves its at most 63 closures unfreed.
inline DeadBatch*& fillingBatch() {
  thread_local DeadBatch* batch = nullptr;
  return batch;
}

// Hands this thread's batch, full or not, to the launching side.
inline void handBackClosures() {
  DeadBatch*& b = fillingBatch();
  if (b == nullptr) return;
  auto& head = deadBatches();
  b->next = head.load(std::memory_order_relaxed);
  while (!head.compare_exchange_weak(b->next, b, std::memory_order_release,
                                     std::memory_order_relaxed)) {
  }
  b = nullptr;
}

// A closure that ran; destroyed later by a launch.
inline void buryClosure(DeadClosure* c) {
  DeadBatch*& b = fillingBatch();
  if (b == nullptr) b = new DeadBatch;
  b->items[b->count++] = c;
  if (b->count == DeadBatch::kSize) handBackClosures();
}

// Launch side: destroys what was handed back.
inline void freeDeadClosures() {
  auto& head = deadBatches();
  if (head.load(std::memory_order_relaxed) == nullptr) return;  // usual: no atomic write
  DeadBatch* b = head.exchange(nullptr, std::memory_order_acquire);
  while (b != nullptr) {
    for (int i = 0; i < b->count; ++i) b->items[i]->destroy(b->items[i]);
    DeadBatch* next = b->next;
    delete b;
    b = next;
  }
}

}  // namespace detail
}  // namespace torchneuron
