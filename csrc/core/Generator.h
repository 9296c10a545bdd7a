// Philox-based random number generator for neuron devices.
//
// State layout matches CUDA's (what DTensor's OffsetBasedRNGTracker and
// activation checkpointing rely on): 16 bytes, uint64 seed then int64 offset.
// Random ops run PyTorch's CPU kernels on device memory: each one takes a CPU
// generator seeded with Philox(seed, offset) and advances the offset by 4
// (reserveOffset), so every draw is a pure function of (seed, offset) and
// set_offset/get_offset/set_state steer it. The values therefore differ from
// CUDA's Philox streams (and from CPU's); a native Philox kernel for the hot
// distributions is future work.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/util/Exception.h>

#include <mutex>

namespace torchneuron {

class NeuronGeneratorImpl : public c10::GeneratorImpl {
 public:
  explicit NeuronGeneratorImpl(c10::DeviceIndex device_index,
                               uint64_t seed = c10::default_rng_seed_val);
  ~NeuronGeneratorImpl() override = default;

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // Returns {seed, offset} and advances the offset by `increment` (rounded up
  // to a multiple of 4, like CUDA). Thread-safe.
  std::pair<uint64_t, uint64_t> reserveOffset(uint64_t increment);

  // A CPU generator whose stream is a pure function of (seed, offset) of this
  // generator; reserves `increment` offsets. Used to run CPU random kernels
  // on device memory reproducibly under this generator's seed.
  at::Generator deriveCpuGenerator(uint64_t increment = 4);

 private:
  NeuronGeneratorImpl* clone_impl() const override;

  uint64_t seed_;
  uint64_t offset_ = 0;
  mutable std::mutex mutex_;
};

// Default generator of a device (-1: current device).
const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index = -1);
// A fresh generator for a device (-1: current device).
at::Generator createGenerator(c10::DeviceIndex device_index = -1);

// An op on a neuron device draws from a neuron generator: a CPU (or other)
// generator is refused with CUDA's words for the same mistake, never
// silently consumed.
inline void checkNeuronGenerator(const at::Generator& gen) {
  TORCH_CHECK(gen.device().type() == c10::DeviceType::PrivateUse1, "Expected a '",
              c10::DeviceType::PrivateUse1, "' device type for generator but found '",
              gen.device().type(), "'");
}

}  // namespace torchneuron
