// ListLoopKernels.cpp: the arithmetic of list loops (ListLoop.h), in
// AVX-512. Compiled with -mavx512f -mfma -ffp-contract=off (CMakeLists.txt):
// every rounding is one written here, and a fused multiply-add is one only
// where ATen's float kernel computes one (ListLoop.h says which).
#include "aten/LoopStep.h"

#include <immintrin.h>

// MKL's vector square root, which libtorch_cpu exports when torch is built
// with MKL (weak: null otherwise).
extern "C" void vmsSqrt(int n, const float* a, float* r, long long mode) __attribute__((weak));

namespace torchneuron {
namespace {

// ATen's float sqrt is MKL's (ATen/cpu/vml.h: vmsSqrt with VML_HA |
// VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE), which is not IEEE's correctly rounded
// root (it differs in the last bit for some values, and its NaN is
// positive): a tile is handed to the same call. MKL computes each element
// alike wherever it lies in the call (the fusion pass relies on it too:
// Fusion.cpp's vml-style kernels); the first use checks it (ListLoop.cpp).
constexpr long long kAtenVmlMode = 0x2 | 0x140000 | 0x100;

constexpr int64_t kTile = 512;  // elements: a step's operands stay in L1
constexpr int64_t kLanes = 16;

// ATen's element for each kind, on 16 lanes: x is self, a the other operand
// (loaded or the scalar), b the second tensor.
template <LoopStep::Kind K>
inline __m512 compute(const LoopStep& s, __m512 x, __m512 a, __m512 b) {
  if constexpr (K == LoopStep::kMul) {
    return _mm512_mul_ps(x, a);
  } else if constexpr (K == LoopStep::kDiv) {
    return _mm512_div_ps(x, a);
  } else if constexpr (K == LoopStep::kAdd) {
    // self + alpha * other, one rounding (ATen: vec::fmadd(other, alpha, self))
    return _mm512_fmadd_ps(_mm512_set1_ps(s.alpha), a, x);
  } else if constexpr (K == LoopStep::kLerp) {
    // |w| < 0.5: self + w * (end - self); else end - (end - self) * (1 - w),
    // which ATen's vector form writes end + (w - 1) * (end - self): the same
    // single rounding, as w - 1 is exactly -(1 - w).
    const __m512 diff = _mm512_sub_ps(a, x);
    if (s.value < 0.5f && s.value > -0.5f) return _mm512_fmadd_ps(_mm512_set1_ps(s.value), diff, x);
    return _mm512_fmadd_ps(_mm512_set1_ps(s.value - 1.0f), diff, a);
  } else if constexpr (K == LoopStep::kAddcmul) {
    // self + value * t1 * t2: (value * t1) rounded, then fused with t2 and self
    return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(s.value), a), b, x);
  } else {
    // self + value * t1 / t2: three roundings
    return _mm512_add_ps(x, _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(s.value), a), b));
  }
}

// Kinds whose `a` may be the scalar `value` (mul/div/add); the others read
// `value` as a coefficient.
template <LoopStep::Kind K>
constexpr bool kScalarOperand = K == LoopStep::kMul || K == LoopStep::kDiv || K == LoopStep::kAdd;

// Step `s` on elements [begin, begin + len): full vectors, then the last
// < 16 elements in masked lanes (the lanes beyond are neither read nor
// written).
template <LoopStep::Kind K>
void runStep(const LoopStep& s, int64_t begin, int64_t len) {
  float* out = s.out + begin;
  const float* x = s.self + begin;
  const float* a = s.a != nullptr ? s.a + begin : nullptr;
  const float* b = s.b != nullptr ? s.b + begin : nullptr;
  const __m512 scalar = _mm512_set1_ps(s.value);
  auto lanes = [&](int64_t i, __mmask16 m) {
    const __m512 vx = _mm512_maskz_loadu_ps(m, x + i);
    __m512 va = scalar;
    if (!kScalarOperand<K> || a != nullptr) va = _mm512_maskz_loadu_ps(m, a + i);
    __m512 vb = _mm512_setzero_ps();
    if (K == LoopStep::kAddcmul || K == LoopStep::kAddcdiv) vb = _mm512_maskz_loadu_ps(m, b + i);
    _mm512_mask_storeu_ps(out + i, m, compute<K>(s, vx, va, vb));
  };
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) lanes(i, static_cast<__mmask16>(0xFFFF));
  if (i < len) lanes(i, static_cast<__mmask16>((1u << (len - i)) - 1));
}

void runStep(const LoopStep& s, int64_t begin, int64_t len) {
  switch (s.kind) {
    case LoopStep::kSqrt:
      vmsSqrt(static_cast<int>(len), s.self + begin, s.out + begin, kAtenVmlMode);
      return;
    case LoopStep::kMul: return runStep<LoopStep::kMul>(s, begin, len);
    case LoopStep::kDiv: return runStep<LoopStep::kDiv>(s, begin, len);
    case LoopStep::kAdd: return runStep<LoopStep::kAdd>(s, begin, len);
    case LoopStep::kLerp: return runStep<LoopStep::kLerp>(s, begin, len);
    case LoopStep::kAddcmul: return runStep<LoopStep::kAddcmul>(s, begin, len);
    case LoopStep::kAddcdiv: return runStep<LoopStep::kAddcdiv>(s, begin, len);
  }
}

}  // namespace

void runRepeatStep(const RepeatStep& r, int64_t begin, int64_t end) {
  const LoopStep& s = r.step;
  const float* repeated = r.repeatSelf ? s.self : s.a;
  const int64_t block = r.inner * r.rep;  // output elements per run of the repeated operand
  for (int64_t i = begin; i < end;) {
    const int64_t q = i / block, within = i % block;
    LoopStep t = s;
    t.out = s.out + i;
    int64_t len;
    if (r.inner == 1) {
      // One value for the rest of this row: the scalar form of the step.
      len = end - i < block - within ? end - i : block - within;
      t.self = s.self + i;
      t.a = nullptr;
      t.value = repeated[q];
    } else {
      // A contiguous stretch of the repeated operand, to the end of its block.
      const int64_t col = within % r.inner;
      len = end - i < r.inner - col ? end - i : r.inner - col;
      const float* rp = repeated + q * r.inner + col;
      if (r.repeatSelf) {
        t.self = rp;
        t.a = s.a + i;
      } else {
        t.self = s.self + i;
        t.a = rp;
      }
    }
    runStep(t, 0, len);
    i += len;
  }
}

bool sqrtStepAvailable() { return vmsSqrt != nullptr; }

void runLoopSteps(const LoopStep* steps, size_t n, int64_t count) {
  for (int64_t t = 0; t < count; t += kTile) {
    const int64_t len = count - t < kTile ? count - t : kTile;
    for (size_t k = 0; k < n; ++k) runStep(steps[k], t, len);
  }
}

}  // namespace torchneuron
