// Streams: c10::Stream <-> nrtStream_t.
//
// Stream ids (c10::StreamId) are packed like CUDA's: 0 is the device's default
// stream; other ids name a slot in a lazily created round-robin pool, one pool
// of kStreamsPerPool streams per priority level:
//   id = 1 + level * kStreamsPerPool + slot
// where level 0 is the lowest priority (the runtime's streamPriorityLeast) and
// higher levels are numerically smaller (greater) priorities. Any integer
// priority is accepted and clamped, as the runtime and CUDA do.
// The current stream is thread-local, per device.
#pragma once

#include "core/Runtime.h"

#include <c10/core/Stream.h>

namespace torchneuron {

constexpr int kStreamsPerPool = 32;
constexpr int kMaxPriorityLevels = 8;

class NeuronStream {
 public:
  // Wraps a c10::Stream of device type PrivateUse1 (checked).
  explicit NeuronStream(c10::Stream stream);
  // As above, with the stream's runtime handle already resolved (what
  // getCurrentStream hands out: every launch asks for the handle).
  NeuronStream(c10::Stream stream, nrtStream_t handle);

  nrtStream_t handle() const;
  c10::Stream unwrap() const { return stream_; }
  operator c10::Stream() const { return stream_; }
  c10::DeviceIndex device_index() const { return stream_.device_index(); }
  c10::Device device() const { return stream_.device(); }
  c10::StreamId id() const { return stream_.id(); }
  int priority() const;

  bool query() const;
  void synchronize() const;

  bool operator==(const NeuronStream& other) const { return stream_ == other.stream_; }
  bool operator!=(const NeuronStream& other) const { return !(*this == other); }

 private:
  c10::Stream stream_;
  nrtStream_t handle_ = 0;  // 0: resolved by handle() on each call
};

// The stream handle behind a c10::Stream of this backend.
nrtStream_t streamHandle(const c10::Stream& stream);

NeuronStream getDefaultStream(c10::DeviceIndex device = -1);
NeuronStream getCurrentStream(c10::DeviceIndex device = -1);
// Makes `stream` current on its device for the calling thread.
void setCurrentStream(const NeuronStream& stream);
// A stream from the pool of the level matching `priority` (round-robin).
NeuronStream getStreamFromPool(int priority, c10::DeviceIndex device = -1);
// Range of priorities a device accepts: {least (e.g. 0), greatest (e.g. -1)}.
std::pair<int, int> priorityRange(c10::DeviceIndex device);
// The c10 stream id behind a runtime stream handle this backend made (a
// default or pool stream), or -1 for any other handle. Tools that read the
// runtime's records (the profiler) use it to name lanes as torch names streams.
c10::StreamId streamIdOfHandle(nrtStream_t handle);

}  // namespace torchneuron
