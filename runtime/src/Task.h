// Task.h — one unit of queued stream work: a kernel (copies and memsets are
// kernels too), an event record, or a wait for an event.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "neuron/runtime.h"

namespace nrt {

struct Event;

struct Task {
  enum Kind : uint8_t { kKernel, kRecord, kWait };
  static constexpr size_t kInlineArgs = 64;
  static constexpr size_t kNameLen = 96;

  Kind kind = kKernel;
  nrtKernelFn fn = nullptr;
  void* heapArgs = nullptr;  // used when args exceed kInlineArgs
  Event* event = nullptr;    // kRecord / kWait
  uint64_t generation = 0;   // the event record this task makes / awaits
  uint64_t workId = 0;       // kKernel: the work item's sequence number
  nrtActivityRecord* record = nullptr;  // kKernel, while activity recording is on
  nrtFuser* fuser = nullptr;            // kKernel: may run fused with its neighbours
  alignas(16) unsigned char inlineArgs[kInlineArgs];
  char name[kNameLen];

  Task() { name[0] = '\0'; }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  Task(Task&& o) noexcept { *this = std::move(o); }
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      relocateFrom(&o);
      o.disown();
    }
    return *this;
  }
  ~Task() {
    std::free(heapArgs);
    delete record;  // the item never ran
  }

  // Moves this task's bytes into raw storage `slot`; this task is left
  // empty (it owns nothing). The slot holds no object: only relocateFrom
  // reads it back, once.
  void relocateTo(void* slot) {
    std::memcpy(slot, static_cast<const void*>(this), sizeof(Task));
    disown();
  }
  // Takes the task out of `slot` (what relocateTo put there), releasing
  // what this task held; the slot is only read.
  void relocateFrom(const void* slot) {
    std::free(heapArgs);
    delete record;
    std::memcpy(static_cast<void*>(this), slot, sizeof(Task));
  }

  // Forgets what this task owns: its bytes were copied to where it lives now.
  void disown() {
    heapArgs = nullptr;
    record = nullptr;
  }

  // Copies the kernel's arguments; false if the host is out of memory.
  bool setArgs(const void* args, size_t size) {
    if (size <= kInlineArgs) {
      if (size) std::memcpy(inlineArgs, args, size);
      return true;
    }
    // malloc'd storage is aligned for any fundamental type.
    heapArgs = std::malloc(size);
    if (!heapArgs) return false;
    std::memcpy(heapArgs, args, size);
    return true;
  }
  void* args() { return heapArgs ? heapArgs : static_cast<void*>(inlineArgs); }

  void setName(const char* n) {
    if (!n) n = "<unnamed kernel>";
    size_t len = strnlen(n, kNameLen - 1);
    std::memcpy(name, n, len);
    name[len] = '\0';
  }
};

}  // namespace nrt
