// _scaled_dot_product_flash_attention_for_cpu_backward on neuron
// (FlashBackward.cpp): bfloat16 calls run FlashBackwardBf16's kernel where a
// calibration showed it gives CPU's bits for the call's geometry; every
// other call takes the generic path with CPU's kernel.
#pragma once

#include <cstdint>

namespace torchneuron {

// Compiled in, and this CPU has AVX-512 with BF16 dot products and ATen runs
// its AVX-512 kernels.
bool flashBackwardBf16Available();

// TORCHNEURON_FLASH_BACKWARD=0 or this switch off: every call takes the
// generic path.
void setFlashBackwardBf16Enabled(bool on);
bool flashBackwardBf16Enabled();

struct FlashBackwardStats {
  int64_t run = 0;     // calls queued with the device's kernel
  int64_t tried = 0;   // geometries calibrated against CPU's kernel
  int64_t agreed = 0;  // of those, geometries whose bits agreed
};
FlashBackwardStats flashBackwardStats();

}  // namespace torchneuron
