#include "aten/RowSum.h"

#include <ATen/ATen.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

namespace torchneuron {
namespace {

// Values whose sum depends on the order of every addition: magnitudes over
// 2^-20..2^20, both signs, from a fixed generator.
template <typename T>
std::vector<T> probeValues(int64_t n) {
  std::vector<T> v(n);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double unit = static_cast<double>(s >> 11) / 9007199254740992.0;  // [0, 1)
    const double scale = std::ldexp(1.0, static_cast<int>((s >> 3) % 41) - 20);
    x = static_cast<T>((unit - 0.5) * scale);
  }
  return v;
}

// Whether rows of `lanes` elements per vector give ATen's sums: whole
// tensors of lengths around every boundary of the cascade, and rows.
template <typename T>
bool lanesMatchAten(int lanes) {
  const auto dtype = std::is_same_v<T, float> ? at::kFloat : at::kDouble;
  const int64_t lengths[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129,
                             255, 257, 511, 513, 1000, 1024, 1031, 2047, 4099, 8191, 20011};
  for (int64_t n : lengths) {
    std::vector<T> v = probeValues<T>(n);
    at::Tensor t = at::from_blob(v.data(), {n}, at::TensorOptions().dtype(dtype));
    const T want = at::sum(t).template item<T>();
    T got;
    rowSums(v.data(), &got, n, 0, 1, lanes, T(1));
    if (std::memcmp(&want, &got, sizeof(T)) != 0) return false;
  }
  const int64_t rows = 5, len = 203;
  std::vector<T> v = probeValues<T>(rows * len);
  at::Tensor t = at::from_blob(v.data(), {rows, len}, at::TensorOptions().dtype(dtype));
  at::Tensor want = at::sum(t, {-1}).contiguous();
  std::vector<T> got(rows);
  rowSums(v.data(), got.data(), len, 0, rows, lanes, T(1));
  return std::memcmp(want.const_data_ptr(), got.data(), rows * sizeof(T)) == 0;
}

template <typename T>
int calibrate() {
  if (!__builtin_cpu_supports("avx2")) return 0;  // RowSumKernels.cpp's build
  try {
    for (int bytes : {32, 64})
      if (lanesMatchAten<T>(bytes / static_cast<int>(sizeof(T)))) return bytes / sizeof(T);
  } catch (const std::exception&) {
    // no host memory for the probe: the paths stay off
  }
  return 0;
}

std::atomic<bool>& enabledFlag() {
  static std::atomic<bool> on{true};
  return on;
}

}  // namespace

bool rowSumsEnabled() { return enabledFlag().load(std::memory_order_relaxed); }

void setRowSumsEnabled(bool on) { enabledFlag().store(on); }

int rowSumLanesFloat() {
  static const int lanes = calibrate<float>();
  return lanes;
}

int rowSumLanesDouble() {
  static const int lanes = calibrate<double>();
  return lanes;
}

}  // namespace torchneuron
