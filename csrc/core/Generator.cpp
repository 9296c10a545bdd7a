#include "core/Generator.h"

#include "core/Runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/PhiloxRNGEngine.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <deque>
#include <memory>
#include <vector>

namespace torchneuron {

namespace {
constexpr size_t kSeedBytes = sizeof(uint64_t);
constexpr size_t kOffsetBytes = sizeof(int64_t);
constexpr size_t kStateBytes = kSeedBytes + kOffsetBytes;
}  // namespace

NeuronGeneratorImpl::NeuronGeneratorImpl(c10::DeviceIndex device_index, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device_index),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void NeuronGeneratorImpl::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = 0;
}

void NeuronGeneratorImpl::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  offset_ = offset;
}

uint64_t NeuronGeneratorImpl::get_offset() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return offset_;
}

uint64_t NeuronGeneratorImpl::current_seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seed_;
}

uint64_t NeuronGeneratorImpl::seed() {
  const uint64_t s = c10::detail::getNonDeterministicRandom(/*is_cuda=*/true);
  set_current_seed(s);
  return s;
}

void NeuronGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
              "RNG state must be a torch.ByteTensor, got ", new_state.dtype());
  TORCH_CHECK(new_state.device().is_cpu(), "RNG state must be a CPU tensor");
  const size_t n = static_cast<size_t>(new_state.numel());
  TORCH_CHECK(n == kStateBytes, "neuron RNG state must have ", kStateBytes,
              " bytes (uint64 seed, int64 offset), got ", n);
  TORCH_CHECK(new_state.is_contiguous(), "RNG state must be contiguous");
  const auto* bytes = static_cast<const uint8_t*>(new_state.data());
  uint64_t seed = 0;
  int64_t offset = 0;
  std::memcpy(&seed, bytes, kSeedBytes);
  std::memcpy(&offset, bytes + kSeedBytes, kOffsetBytes);
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = static_cast<uint64_t>(offset);
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGeneratorImpl::get_state() const {
  auto state = at::empty({static_cast<int64_t>(kStateBytes)}, at::TensorOptions().dtype(at::kByte));
  auto* bytes = state.data_ptr<uint8_t>();
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t offset = static_cast<int64_t>(offset_);
  std::memcpy(bytes, &seed_, kSeedBytes);
  std::memcpy(bytes + kSeedBytes, &offset, kOffsetBytes);
  return state.getIntrusivePtr();
}

std::pair<uint64_t, uint64_t> NeuronGeneratorImpl::reserveOffset(uint64_t increment) {
  increment = ((increment + 3) / 4) * 4;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto result = std::make_pair(seed_, offset_);
  offset_ += increment;
  return result;
}

at::Generator NeuronGeneratorImpl::deriveCpuGenerator(uint64_t increment) {
  const auto [seed, offset] = reserveOffset(increment);
  // Two Philox outputs at (seed, offset) make the 64-bit seed of the CPU
  // generator: a deterministic function of this generator's state.
  at::Philox4_32 engine(seed, /*subsequence=*/0, /*offset=*/offset);
  const uint64_t hi = engine();
  const uint64_t lo = engine();
  return at::make_generator<at::CPUGeneratorImpl>((hi << 32) | lo);
}

NeuronGeneratorImpl* NeuronGeneratorImpl::clone_impl() const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto* gen = new NeuronGeneratorImpl(device().index(), seed_);
  gen->offset_ = offset_;
  return gen;
}

const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) {
  // Never destroyed: Python's torch.Generator objects for them may outlive
  // this library's statics at exit.
  static auto* generators = [] {
    auto* v = new std::vector<at::Generator>();
    for (c10::DeviceIndex i = 0; i < deviceCount(); ++i) {
      v->push_back(at::make_generator<NeuronGeneratorImpl>(i));
    }
    return v;
  }();
  const auto device = resolveDevice(device_index);
  return (*generators)[device];
}

at::Generator createGenerator(c10::DeviceIndex device_index) {
  return at::make_generator<NeuronGeneratorImpl>(resolveDevice(device_index));
}

}  // namespace torchneuron
