// Task.h — one unit of queued stream work: a kernel (copies and memsets are
// kernels too), an event record, or a wait for an event.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "neuron/runtime.h"

namespace nrt {

struct Event;

// Two cache lines: every launch moves its task to the executor's core, so
// each line counts (the name used to be a 96-byte copy inside the task, four
// lines in all). A name the launcher guarantees for the process's lifetime
// is kept as a pointer; any other is copied, behind the arguments when both
// fit the inline buffer (short names of C callers), else to the heap.
struct Task {
  enum Kind : uint8_t { kKernel, kRecord, kWait };
  enum NameAt : uint8_t { kNamePointer, kNameHeap, kNameInline };
  static constexpr size_t kInlineArgs = 48;
  static constexpr size_t kNameLen = 96;  // longest name kept (copies are cut there)

  Kind kind = kKernel;
  NameAt nameAt = kNamePointer;
  uint8_t nameOffset = 0;    // kNameInline: where in inlineArgs
  uint8_t argsUsed = 0;      // bytes of inlineArgs the arguments take
  nrtKernelFn fn = nullptr;
  void* heapArgs = nullptr;  // used when args exceed kInlineArgs
  Event* event = nullptr;    // kRecord / kWait
  uint64_t generation = 0;   // the event record this task makes / awaits
  uint64_t workId = 0;       // kKernel: the work item's sequence number
  nrtActivityRecord* record = nullptr;  // kKernel, while activity recording is on
  nrtFuser* fuser = nullptr;            // kKernel: may run fused with its neighbours
  const char* name = kUnnamed;  // read through nameOf()
  alignas(16) unsigned char inlineArgs[kInlineArgs];

  static constexpr const char* kUnnamed = "<unnamed kernel>";

  Task() = default;
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
    dropName();
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
    dropName();
    std::memcpy(static_cast<void*>(this), slot, sizeof(Task));
  }

  // Forgets what this task owns: its bytes were copied to where it lives now.
  void disown() {
    heapArgs = nullptr;
    record = nullptr;
    if (nameAt == kNameHeap) nameAt = kNamePointer;
  }

  // Copies the kernel's arguments; false if the host is out of memory.
  bool setArgs(const void* args, size_t size) {
    if (size <= kInlineArgs) {
      if (size) std::memcpy(inlineArgs, args, size);
      argsUsed = static_cast<uint8_t>(size);
      return true;
    }
    // malloc'd storage is aligned for any fundamental type.
    heapArgs = std::malloc(size);
    if (!heapArgs) return false;
    std::memcpy(heapArgs, args, size);
    return true;
  }
  void* args() { return heapArgs ? heapArgs : static_cast<void*>(inlineArgs); }

  // `lasting`: n outlives the process's work (a literal, an interned name),
  // so the task keeps the pointer; else a copy of up to kNameLen - 1
  // characters (after setArgs: it may go behind the inline arguments).
  // False if the host is out of memory for the copy.
  bool setName(const char* n, bool lasting = true) {
    dropName();
    if (!n) n = kUnnamed;
    if (lasting) {
      name = n;
      return true;
    }
    const size_t len = strnlen(n, kNameLen - 1);
    char* copy = nullptr;
    if (!heapArgs && argsUsed + len < kInlineArgs) {
      nameOffset = argsUsed;
      copy = reinterpret_cast<char*>(inlineArgs) + nameOffset;
      nameAt = kNameInline;
    } else {
      copy = static_cast<char*>(std::malloc(len + 1));
      if (!copy) return false;
      name = copy;
      nameAt = kNameHeap;
    }
    std::memcpy(copy, n, len);
    copy[len] = '\0';
    return true;
  }
  const char* nameOf() const {
    return nameAt == kNameInline ? reinterpret_cast<const char*>(inlineArgs) + nameOffset : name;
  }

 private:
  void dropName() {
    if (nameAt == kNameHeap) std::free(const_cast<char*>(name));
    nameAt = kNamePointer;
    name = kUnnamed;
  }
};
static_assert(sizeof(Task) == 128, "a task is two cache lines (see above)");

}  // namespace nrt
