// TaskQueue.h — the tasks a stream's worker took from its inbox and put
// back (behind a parked wait), to run before the inbox's: a ring buffer that
// grows at the front and never shrinks.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "Task.h"

namespace nrt {

class TaskQueue {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }

  // Puts a task back in front (work behind a parked wait).
  void push_front(Task&& t) {
    grow();
    head_ = (head_ + ring_.size() - 1) & (ring_.size() - 1);
    ring_[head_] = std::move(t);
    ++size_;
  }

  Task take_front() {
    Task t = std::move(ring_[head_]);
    head_ = (head_ + 1) & (ring_.size() - 1);
    --size_;
    return t;
  }

  void clear() {
    while (!empty()) take_front();
    head_ = 0;
  }

 private:
  void grow() {
    if (size_ < ring_.size()) return;
    std::vector<Task> bigger(ring_.empty() ? 64 : ring_.size() * 2);  // powers of two
    for (size_t i = 0; i < size_; ++i) bigger[i] = take_at(i);
    ring_.swap(bigger);
    head_ = 0;
  }
  Task take_at(size_t i) { return std::move(ring_[(head_ + i) & (ring_.size() - 1)]); }

  std::vector<Task> ring_;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace nrt
