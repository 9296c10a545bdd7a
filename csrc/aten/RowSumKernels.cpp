// The loops of RowSum.h. Plain C++ compiled for AVX2 (CMakeLists.txt), which
// only runs where the CPU has it (rowSumLanes* checks): nothing here may
// instantiate inline code shared with the rest of the library, since the
// linker could keep this file's AVX2 copy for everyone, so no standard
// library templates. The unit vectors need AVX2 to stay in registers.
#include "aten/RowSum.h"

namespace torchneuron {
namespace {

int64_t maxOf(int64_t a, int64_t b) { return a < b ? b : a; }

// ATen's utils::CeilLog2: 1 for x <= 2.
int64_t ceilLog2(int64_t x) {
  if (x <= 2) return 1;
  return 64 - __builtin_clzll(static_cast<uint64_t>(x - 1));
}

// A unit the cascade adds: W consecutive elements as one vector (GCC's
// vector extension: lane-wise adds, whatever instructions the build picks),
// or an element for W == 1.
template <typename T, int W>
struct Unit {
  typedef T type __attribute__((vector_size(W * sizeof(T))));
};
template <typename T>
struct Unit<T, 1> {
  using type = T;
};

template <typename V, typename T>
V loadUnit(const T* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof(V));
  return v;
}

// The cascade of ATen's row_sum over `units` units of W consecutive
// elements (a vector; W == 1: an element): unit 4i + k goes to partial sum
// k (multi_row_sum over i with four rows), leftover units to partial 0,
// then partials 1..3 into 0; the result's W elements go to `out`. Level 0
// lives in four locals so that the hot loop keeps it in registers.
template <int W, typename T>
void cascade(const T* p, int64_t units, T* out) {
  using V = typename Unit<T, W>::type;
  constexpr int kLevels = 4;
  constexpr int kIlp = 4;
  const int64_t steps = units / kIlp;
  const int64_t levelPower = maxOf(4, ceilLog2(steps) / kLevels);
  const int64_t levelStep = int64_t(1) << levelPower;
  const int64_t levelMask = levelStep - 1;

  V a0{}, a1{}, a2{}, a3{};             // level 0
  V up[kLevels - 1][kIlp] = {};         // levels 1..3
  auto addSteps = [&](int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) {
      const T* base = p + i * kIlp * W;
      a0 += loadUnit<V>(base);
      a1 += loadUnit<V>(base + W);
      a2 += loadUnit<V>(base + 2 * W);
      a3 += loadUnit<V>(base + 3 * W);
    }
  };
  int64_t i = 0;
  while (i + levelStep <= steps) {
    addSteps(i, i + levelStep);
    i += levelStep;
    up[0][0] += a0;
    up[0][1] += a1;
    up[0][2] += a2;
    up[0][3] += a3;
    a0 = a1 = a2 = a3 = V{};
    if ((i & (levelMask << levelPower)) != 0) continue;
    for (int lv = 2; lv < kLevels; ++lv) {
      for (int k = 0; k < kIlp; ++k) {
        up[lv - 1][k] += up[lv - 2][k];
        up[lv - 2][k] = V{};
      }
      if ((i & (levelMask << (lv * levelPower))) != 0) break;
    }
  }
  addSteps(i, steps);
  for (int lv = 0; lv < kLevels - 1; ++lv) {
    a0 += up[lv][0];
    a1 += up[lv][1];
    a2 += up[lv][2];
    a3 += up[lv][3];
  }
  for (int64_t u = steps * kIlp; u < units; ++u) a0 += loadUnit<V>(p + u * W);
  a0 += a1;
  a0 += a2;
  a0 += a3;
  __builtin_memcpy(out, &a0, sizeof(V));
}

// One row as ATen sums it with vectors of W elements (vectorized_inner_sum,
// or row_sum over elements for a row shorter than a vector), stored as
// ATen stores it: added to an output it filled with zero.
template <int W, typename T>
T rowSum(const T* row, int64_t len) {
  T total;
  if (len < W) {
    cascade<1>(row, len, &total);
  } else {
    const int64_t vectors = len / W;
    T lanes[W];
    cascade<W>(row, vectors, lanes);
    total = T(0);
    for (int64_t k = vectors * W; k < len; ++k) total += row[k];
    for (int l = 0; l < W; ++l) total += lanes[l];
  }
  return T(0) + total;
}

template <int W, typename T>
void rowsOf(const T* in, T* out, int64_t len, int64_t begin, int64_t end, T divisor) {
  for (int64_t r = begin; r < end; ++r) {
    const T sum = rowSum<W>(in + r * len, len);
    out[r] = divisor == T(1) ? sum : sum / divisor;
  }
}

// Rows with `lanes` elements per vector, of the widths ATen builds
// (32 or 64 bytes).
template <typename T>
void rowsAt(const T* in, T* out, int64_t len, int64_t begin, int64_t end, int lanes,
            T divisor) {
  constexpr int kNarrow = 32 / sizeof(T);
  constexpr int kWide = 64 / sizeof(T);
  if (lanes == kWide) rowsOf<kWide>(in, out, len, begin, end, divisor);
  else rowsOf<kNarrow>(in, out, len, begin, end, divisor);
}

}  // namespace

void rowSums(const float* in, float* out, int64_t len, int64_t begin, int64_t end, int lanes,
             float divisor) {
  rowsAt<float>(in, out, len, begin, end, lanes, divisor);
}

void rowSums(const double* in, double* out, int64_t len, int64_t begin, int64_t end, int lanes,
             double divisor) {
  rowsAt<double>(in, out, len, begin, end, lanes, divisor);
}

}  // namespace torchneuron
