#include "distributed/SharedMemoryTransport.h"

#include <ATen/ops/add.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_or.h>
#include <ATen/ops/bitwise_xor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/mul.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace torchneuron::distributed {

using RedOp = c10d::ReduceOp::RedOpType;

// Per rank: the last step it published (its buffer holds that step's data)
// and the last step it finished reading; each on its own cache line, since
// peers poll them while the owner writes its buffer.
struct SharedMemoryTransport::Control {
  alignas(64) std::atomic<uint64_t> published;
  alignas(64) std::atomic<uint64_t> consumed;
};

namespace {

size_t controlBytes(int size) {
  const size_t raw = 128 * static_cast<size_t>(size);
  return (raw + 4095) / 4096 * 4096;
}

at::Tensor viewOf(void* data, int64_t elements, at::ScalarType dtype) {
  return at::from_blob(data, {elements}, at::TensorOptions().dtype(dtype));
}

// out = a (op) b, with the CPU kernels Gloo's results are compared with.
void combine(RedOp op, at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  switch (op) {
    case RedOp::SUM: at::add_out(out, a, b); break;
    case RedOp::PRODUCT: at::mul_out(out, a, b); break;
    case RedOp::MIN: at::minimum_out(out, a, b); break;
    case RedOp::MAX: at::maximum_out(out, a, b); break;
    case RedOp::BAND: at::bitwise_and_out(out, a, b); break;
    case RedOp::BOR: at::bitwise_or_out(out, a, b); break;
    case RedOp::BXOR: at::bitwise_xor_out(out, a, b); break;
    default: TORCH_CHECK(false, "shared-memory transport: no reduction ", static_cast<int>(op));
  }
}

// The reduction of `parts` (one per rank, rank order) into `out`.
void reduceParts(RedOp op, at::Tensor out, const std::vector<at::Tensor>& parts) {
  combine(op, out, parts[0], parts[1]);
  for (size_t r = 2; r < parts.size(); ++r) combine(op, out, out, parts[r]);
}

char* bytesOf(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }
size_t byteSize(const at::Tensor& t) { return t.numel() * t.element_size(); }

}  // namespace

std::unique_ptr<SharedMemoryTransport> SharedMemoryTransport::open(c10d::Store& store, int rank,
                                                                   int size) {
  if (size < 2) return nullptr;  // nothing to move: the transport's own paths suffice
  const size_t bytes = controlBytes(size) + 2 * kChunkBytes * static_cast<size_t>(size);
  auto segment = SharedSegment::open(store, "data", rank, size, bytes);
  if (!segment) return nullptr;
  return std::unique_ptr<SharedMemoryTransport>(new SharedMemoryTransport(std::move(segment)));
}

SharedMemoryTransport::SharedMemoryTransport(std::unique_ptr<SharedSegment> segment)
    : segment_(std::move(segment)) {}

SharedMemoryTransport::~SharedMemoryTransport() = default;

SharedMemoryTransport::Control& SharedMemoryTransport::control(int rank) const {
  static_assert(sizeof(Control) == 128, "two cache lines per rank");
  return reinterpret_cast<Control*>(segment_->data())[rank];
}

char* SharedMemoryTransport::buffer(int rank, uint64_t step) const {
  const size_t index = static_cast<size_t>(rank) * 2 + (step & 1);
  return static_cast<char*>(segment_->data()) + controlBytes(segment_->size()) +
         index * kChunkBytes;
}

bool SharedMemoryTransport::reducesLikeTransport(RedOp op, at::ScalarType dtype) const {
  switch (dtype) {
    case at::kChar: case at::kByte: case at::kInt: case at::kLong:
      // Wrapping integer arithmetic, min, max and bitwise ops: any order, same bits.
      return op == RedOp::SUM || op == RedOp::PRODUCT || op == RedOp::MIN || op == RedOp::MAX ||
             op == RedOp::BAND || op == RedOp::BOR || op == RedOp::BXOR;
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
      // One rounded operation per element: a (op) b == b (op) a.
      return segment_->size() == 2 && (op == RedOp::SUM || op == RedOp::PRODUCT);
    default:
      return false;
  }
}

void SharedMemoryTransport::checkUsable(const char* name) const {
  TORCH_CHECK(!broken_, name,
              ": an earlier collective of this process group failed in the middle of a "
              "shared-memory transfer, so its ranks are out of step; destroy the process group "
              "(torch.distributed.destroy_process_group) and create a new one.");
}

template <class Fill, class Consume>
void SharedMemoryTransport::step(const char* name, int from, std::chrono::milliseconds timeout,
                                 Fill&& fill, Consume&& consume) {
  const int me = segment_->rank();
  const int size = segment_->size();
  const uint64_t s = ++steps_;
  try {
    if (from < 0 || from == me) {
      // This buffer last held step s-2: every peer must be done reading it.
      if (s > 2) {
        for (int r = 0; r < size; ++r) {
          if (r != me) segment_->waitFor(control(r).consumed, s - 2, r, name, timeout);
        }
      }
      fill(buffer(me, s));
    }
    control(me).published.store(s, std::memory_order_release);
    for (int r = 0; r < size; ++r) {
      if (r != me && (from < 0 || r == from)) {
        segment_->waitFor(control(r).published, s, r, name, timeout);
      }
    }
    consume(s);
    control(me).consumed.store(s, std::memory_order_release);
  } catch (...) {
    broken_ = true;
    throw;
  }
}

void SharedMemoryTransport::allreduce(const char* name, const std::vector<at::Tensor>& tensors,
                                      RedOp op, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  checkUsable(name);
  carried_.fetch_add(1, std::memory_order_relaxed);
  for (const auto& t : tensors) {
    char* data = bytesOf(t);
    const size_t total = byteSize(t), element = t.element_size();
    for (size_t off = 0; off < total; off += kChunkBytes) {
      const size_t len = std::min(kChunkBytes, total - off);
      step(name, -1, timeout, [&](char* mine) { std::memcpy(mine, data + off, len); },
           [&](uint64_t s) {
             std::vector<at::Tensor> parts;
             for (int r = 0; r < segment_->size(); ++r) {
               parts.push_back(viewOf(buffer(r, s), len / element, t.scalar_type()));
             }
             reduceParts(op, viewOf(data + off, len / element, t.scalar_type()), parts);
           });
    }
  }
}

void SharedMemoryTransport::broadcast(const char* name, const std::vector<at::Tensor>& tensors,
                                      int root, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  checkUsable(name);
  carried_.fetch_add(1, std::memory_order_relaxed);
  const bool isRoot = segment_->rank() == root;
  for (const auto& t : tensors) {
    char* data = bytesOf(t);
    const size_t total = byteSize(t);
    for (size_t off = 0; off < total; off += kChunkBytes) {
      const size_t len = std::min(kChunkBytes, total - off);
      step(name, root, timeout, [&](char* mine) { std::memcpy(mine, data + off, len); },
           [&](uint64_t s) {
             if (!isRoot) std::memcpy(data + off, buffer(root, s), len);
           });
    }
  }
}

void SharedMemoryTransport::allgather(const char* name, const at::Tensor& input,
                                      const std::vector<at::Tensor>& outputs,
                                      std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  checkUsable(name);
  carried_.fetch_add(1, std::memory_order_relaxed);
  const char* in = bytesOf(input);
  const size_t total = byteSize(input);
  for (size_t off = 0; off < total; off += kChunkBytes) {
    const size_t len = std::min(kChunkBytes, total - off);
    step(name, -1, timeout, [&](char* mine) { std::memcpy(mine, in + off, len); },
         [&](uint64_t s) {
           for (int r = 0; r < segment_->size(); ++r) {
             std::memcpy(bytesOf(outputs[r]) + off, buffer(r, s), len);
           }
         });
  }
}

void SharedMemoryTransport::reduceScatter(const char* name, const std::vector<at::Tensor>& inputs,
                                          const at::Tensor& output, RedOp op,
                                          std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  checkUsable(name);
  carried_.fetch_add(1, std::memory_order_relaxed);
  const int size = segment_->size(), me = segment_->rank();
  const size_t element = output.element_size();
  // A chunk's buffer holds one part per destination rank.
  const size_t part = kChunkBytes / size / element * element;
  char* out = bytesOf(output);
  const size_t total = byteSize(output);
  for (size_t off = 0; off < total; off += part) {
    const size_t len = std::min(part, total - off);
    step(name, -1, timeout,
         [&](char* mine) {
           for (int d = 0; d < size; ++d) std::memcpy(mine + d * part, bytesOf(inputs[d]) + off, len);
         },
         [&](uint64_t s) {
           std::vector<at::Tensor> parts;
           for (int r = 0; r < size; ++r) {
             parts.push_back(viewOf(buffer(r, s) + me * part, len / element, output.scalar_type()));
           }
           reduceParts(op, viewOf(out + off, len / element, output.scalar_type()), parts);
         });
  }
}

}  // namespace torchneuron::distributed
