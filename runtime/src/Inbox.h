// Inbox.h — where host threads hand a stream its new tasks without the
// executor's lock.
//
// Every launch used to take the executor's mutex, and the worker that ran
// the stream took it again to collect the task: with a worker faster than
// the host (small ops), the two met on that mutex once per op, and its
// cache line moved between the cores each time. The inbox is a queue of
// fixed blocks: producers (host threads, serialized by their own mutex,
// which no worker takes) append; the stream's owner (the one worker that
// runs it, handed over under the executor's lock) takes from the front.
// A spent block is kept as a spare for the producer, so a steady stream of
// launches allocates nothing. Neither side writes what the other wrote last,
// except the two counters: each launch moves as few cache lines between the
// cores as a queue can, and a launch waits for none of them (no locked
// instruction follows its writes: see ProducerLock and Fence.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>

#include "CpuRelax.h"
#include "Task.h"

namespace nrt {

class Inbox {
 public:
  Inbox() = default;
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;
  ~Inbox() {
    clear();
    delete head_;
    delete spare_.load();
  }

  // Producer side (any thread). The count is a release store: the
  // executor's idle hand-off, which reads it after publishing that the
  // stream is unscheduled while the producer reads that flag after this,
  // pairs the two with an asymmetric fence (Executor::enqueue).
  void push(Task&& t) {
    std::lock_guard<ProducerLock> lk(pushMu_);
    if (!tail_) tail_ = head_ = freshBlock();
    if (tailIndex_ == kBlock) {
      Block* b = freshBlock();
      tail_->next = b;  // published with the count below
      tail_ = b;
      tailIndex_ = 0;
    }
    t.relocateTo(tail_->slot(tailIndex_++));
    // The count comes from the producers' own copy: reading pushed_ back
    // missed in the cache on every launch (the polling owner's reads take
    // the line away; on AMD's cores a line written by one core and read by
    // another migrates to the reader), which was half of a launch's
    // enqueue time on a 2-core EPYC.
    pushed_.store(++pushedCopy_, std::memory_order_release);
  }

  // Owner side: whether a task is waiting (also safe from any thread under
  // the executor's lock, as a hint).
  bool empty() const {
    return popped_.load(std::memory_order_relaxed) == pushed_.load(std::memory_order_seq_cst);
  }

  // Owner side: takes the front task; false when there is none.
  bool pop(Task& out) {
    const uint64_t n = popped_.load(std::memory_order_relaxed);
    if (n == pushed_.load(std::memory_order_acquire)) return false;
    if (headIndex_ == kBlock) {
      Block* spent = head_;
      head_ = spent->next;  // written before the count we read
      headIndex_ = 0;
      spent->next = nullptr;
      delete spare_.exchange(spent, std::memory_order_acq_rel);
    }
    out.relocateFrom(head_->slot(headIndex_++));
    popped_.store(n + 1, std::memory_order_relaxed);
    return true;
  }

  // Drops what is queued (a stream being reset; no producer or owner runs).
  void clear() {
    Task t;
    while (pop(t)) {
    }
  }

 private:
  static constexpr size_t kBlock = 128;  // tasks per block (32 KB)
  // A slot is a whole number of cache lines: with slots of sizeof(Task)
  // (224 bytes) two neighbours shared a line, and the producer writing task
  // n+1 took that line from the owner reading task n, once per launch.
  static constexpr size_t kLine = 64;
  static constexpr size_t kSlot = (sizeof(Task) + kLine - 1) / kLine * kLine;
  static_assert(alignof(Task) <= kLine, "a slot must be aligned for a Task");
  // Slots are raw storage that a task is moved into and out of bytewise
  // (Task::relocateTo / relocateFrom): the owner only reads a slot, so the
  // producer that reuses it next finds no line the owner has written.
  struct Block {
    alignas(kLine) unsigned char bytes[kBlock][kSlot];
    Block* next = nullptr;
    void* slot(size_t i) { return bytes[i]; }
  };

  // Serializes producers. A std::mutex unlocks with a locked instruction,
  // which waits until the task's slot and the count have reached this
  // core's cache: lines the worker took by reading them, so each launch
  // waited for them to come back (a cross-core round trip). Unlocking with
  // a release store lets them drain while the host goes on. Producers
  // rarely meet here (host threads launching on one stream at once).
  class ProducerLock {
   public:
    void lock() {
      for (int spins = 0; held_.exchange(true, std::memory_order_acquire);) {
        while (held_.load(std::memory_order_relaxed)) {
          if (++spins < 64) {
            cpuRelax();
          } else {
            std::this_thread::yield();  // the holder may have lost its core
          }
        }
      }
    }
    void unlock() { held_.store(false, std::memory_order_release); }

   private:
    std::atomic<bool> held_{false};
  };

  Block* freshBlock() {
    Block* b = spare_.exchange(nullptr, std::memory_order_acq_rel);
    return b ? b : new Block;
  }

  // Producer state, under pushMu_.
  ProducerLock pushMu_;
  Block* tail_ = nullptr;
  size_t tailIndex_ = 0;
  uint64_t pushedCopy_ = 0;  // what pushed_ holds, read by producers only
  alignas(64) std::atomic<uint64_t> pushed_{0};
  // Owner state. head_ is set by the first push (under pushMu_) before the
  // count that lets the owner read it.
  alignas(64) std::atomic<uint64_t> popped_{0};
  Block* head_ = nullptr;
  size_t headIndex_ = 0;
  std::atomic<Block*> spare_{nullptr};
};

}  // namespace nrt
