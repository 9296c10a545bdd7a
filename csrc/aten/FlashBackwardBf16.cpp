// Built with ATen's AVX-512 kernel flags plus AVX512-BF16 and without
// contraction of a*b+c into FMAs (CMakeLists.txt), so ATen's vector headers
// below compile to the arithmetic its own AVX-512 flash kernel runs. No
// at::Tensor here, only raw memory: little that this file emits is shared
// with the backend's portable code. See FlashBackwardBf16.h.
#include "aten/FlashBackwardBf16.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace torchneuron {
namespace {

using at::BFloat16;
using Vec = at::vec::Vectorized<float>;

constexpr int64_t kLanes = 16;

int64_t roundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// ---------------------------------------------------------------------------
// Products. Every product here is C[r][c] = sum over p of the dot product of
// two bfloat16 pairs: A's word (r, p) broadcast against B's word (p, c), one
// VDPBF16PS per pair, p ascending: the reduced index k = 2p, 2p + 1. A word is
// (element k, element k + 1), k + 1 = 0 past the end.

// A's words: word (r, p) at data[r * row + p * pair].
struct Words {
  const uint32_t* data;
  int64_t row, pair;
};

template <int R, int V>
void dpTile(Words a, const uint32_t* b, int64_t ldb, int64_t pairs, __m512 (&acc)[R][V]) {
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < V; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i bv[V];
    for (int j = 0; j < V; ++j) bv[j] = _mm512_loadu_si512(b + p * ldb + j * kLanes);
    for (int r = 0; r < R; ++r) {
      uint32_t word;
      std::memcpy(&word, a.data + r * a.row + p * a.pair, sizeof(word));
      const __m512i av = _mm512_set1_epi32(static_cast<int>(word));
      for (int j = 0; j < V; ++j)
        acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)av, (__m512bh)bv[j]);
    }
  }
}

// The words of bfloat16 rows of stride ld (even) starting at `rows`: word
// (r, p) is row r's elements 2p, 2p + 1.
Words rowWords(const uint16_t* rows, int64_t ld) {
  return {reinterpret_cast<const uint32_t*>(rows), ld / 2, 1};
}

__mmask16 laneMask(int64_t lanes) {
  return lanes >= kLanes ? __mmask16(0xffff) : __mmask16((1u << lanes) - 1u);
}

// The float result of CPU's MKL products (beta = 0): the sum times alpha.
struct StoreFloat {
  float* c;
  int64_t ldc;
  float alpha;
  void operator()(int64_t r, int64_t col, __m512 acc, __mmask16 m) const {
    _mm512_mask_storeu_ps(c + r * ldc + col, m, _mm512_mul_ps(acc, _mm512_set1_ps(alpha)));
  }
};

// oneDNN's bfloat16 result with beta = 1: alpha times the sum, plus the old
// value, in float, then VCVTNEPS2BF16 (round to nearest even, a denormal
// float read as zero of its sign).
struct AccumulateBf16 {
  uint16_t* c;
  int64_t ldc;
  float alpha;
  void operator()(int64_t r, int64_t col, __m512 acc, __mmask16 m) const {
    uint16_t* dst = c + r * ldc + col;
    __m512 old;
    at::vec::cvtbf16_fp32(_mm256_maskz_loadu_epi16(m, dst), old);
    // Two roundings, as oneDNN's JIT code makes them: the barrier keeps the
    // compiler from contracting them into one FMA (which differs in about
    // one gradient element in 30,000). Then oneDNN's conversion instruction,
    // which reads a denormal sum as zero.
    __m512 scaled = _mm512_mul_ps(acc, _mm512_set1_ps(alpha));
    asm("" : "+v"(scaled));
    const __m256i res = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(scaled, old));
    _mm256_mask_storeu_epi16(dst, m, res);
  }
};

template <int R, int V, class Store>
void dpBlock(Words a, const uint32_t* b, int64_t ldb, int64_t pairs, int64_t row, int64_t col,
             int64_t cols, const Store& store) {
  __m512 acc[R][V];
  dpTile<R, V>({a.data + row * a.row, a.row, a.pair}, b + col, ldb, pairs, acc);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < V; ++j) {
      const int64_t c = col + j * kLanes;
      if (c < cols) store(row + r, c, acc[r][j], laneMask(cols - c));
    }
}

// C[rows][cols] over `pairs` pairs; B's rows hold at least roundUp(cols, 16)
// words (zero past cols).
template <class Store>
void dpProduct(int64_t rows, int64_t cols, int64_t pairs, Words a, const uint32_t* b, int64_t ldb,
               const Store& store) {
  int64_t col = 0;
  for (; col + 2 * kLanes <= roundUp(cols, kLanes); col += 2 * kLanes) {
    int64_t row = 0;
    for (; row + 4 <= rows; row += 4) dpBlock<4, 2>(a, b, ldb, pairs, row, col, cols, store);
    for (; row < rows; ++row) dpBlock<1, 2>(a, b, ldb, pairs, row, col, cols, store);
  }
  if (col < cols) {
    int64_t row = 0;
    for (; row + 4 <= rows; row += 4) dpBlock<4, 1>(a, b, ldb, pairs, row, col, cols, store);
    for (; row < rows; ++row) dpBlock<1, 1>(a, b, ldb, pairs, row, col, cols, store);
  }
}

// ---------------------------------------------------------------------------
// Packing into pair words.

// out[p][c] = (src row c's elements 2p, 2p + 1) for c < n, p < dim / 2; zero
// for n <= c < ldo: a 32-bit transpose of the rows' words. dim is even.
void packWordsTransposed(const uint16_t* src, int64_t ld, int64_t n, int64_t dim, uint32_t* out,
                         int64_t ldo) {
  for (int64_t p = 0; p < dim / 2; ++p) std::fill(out + p * ldo + n, out + (p + 1) * ldo, 0u);
  for (int64_t c = 0; c < n; ++c) {
    const uint16_t* row = src + c * ld;
    for (int64_t p = 0; p < dim / 2; ++p) {
      uint32_t word;
      std::memcpy(&word, row + 2 * p, sizeof(word));
      out[p * ldo + c] = word;
    }
  }
}

// out[p][d] = (src[2p][d], src[2p + 1][d]) for p < ceil(n / 2), d < dim
// (rows of stride ld; a missing row 2p + 1 reads as zero): rows interleaved
// in pairs, 32 elements at a time.
void packRowPairs(const uint16_t* src, int64_t ld, int64_t n, int64_t dim, uint32_t* out) {
  alignas(64) static constexpr uint16_t kLow[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                    37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                    11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHigh[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                     53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                     27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i low = _mm512_load_si512(kLow), high = _mm512_load_si512(kHigh);
  for (int64_t p = 0; p < (n + 1) / 2; ++p) {
    const uint16_t* lo = src + 2 * p * ld;
    const bool hasHi = 2 * p + 1 < n;
    uint32_t* o = out + p * dim;
    for (int64_t d = 0; d < dim; d += 32) {
      const int64_t left = std::min<int64_t>(32, dim - d);
      const __mmask32 m = left == 32 ? ~__mmask32(0) : (__mmask32(1) << left) - 1;
      const __m512i x = _mm512_maskz_loadu_epi16(m, lo + d);
      const __m512i y = hasHi ? _mm512_maskz_loadu_epi16(m, lo + ld + d) : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(o + d, laneMask(left),
                               _mm512_permutex2var_epi16(x, low, y));
      if (left > 16)
        _mm512_mask_storeu_epi32(o + d + 16, laneMask(left - 16),
                                 _mm512_permutex2var_epi16(x, high, y));
    }
  }
}

// ---------------------------------------------------------------------------
// One thread's scratch, carved from the caller's buffer.

struct Scratch {
  float *attn, *gradAttn, *dsum;
  uint16_t *attnRed, *gradAttnRed;
  uint32_t *kT, *vT, *kPairs, *goPairs, *qPairs, *attnPairs, *gradAttnPairs;
};

struct Sizes {
  int64_t qB, kvB, kvPad, kvEven, qHalf, kvHalf, halfDim;
  explicit Sizes(const FlashBwdGeometry& g)
      : qB(g.qSplit),
        kvB(g.kvSplit),
        kvPad(roundUp(g.kvSplit, kLanes)),
        kvEven(roundUp(g.kvSplit, 2)),
        qHalf((g.qSplit + 1) / 2),
        kvHalf((g.kvSplit + 1) / 2),
        halfDim(g.headDim / 2) {}
};

template <class T>
T* carve(uintptr_t& cursor, int64_t count) {
  T* p = reinterpret_cast<T*>(cursor);
  cursor += static_cast<uintptr_t>(roundUp(count * static_cast<int64_t>(sizeof(T)), 64));
  return p;
}

// One thread's buffers from `base` on; *end: the address past the last (with
// base 0, the bytes needed: flashBwdScratchBytes).
Scratch carveScratch(const FlashBwdGeometry& g, uintptr_t base, uintptr_t* end = nullptr) {
  const Sizes s(g);
  const int64_t d = g.headDim;
  uintptr_t cur = base;
  Scratch sc{};
  sc.attn = carve<float>(cur, s.qB * s.kvB);
  sc.gradAttn = carve<float>(cur, s.qB * s.kvB);
  sc.dsum = carve<float>(cur, s.qB);
  sc.attnRed = carve<uint16_t>(cur, s.qB * s.kvB);
  sc.gradAttnRed = carve<uint16_t>(cur, s.qB * s.kvEven);
  sc.kT = carve<uint32_t>(cur, s.halfDim * s.kvPad);
  sc.vT = carve<uint32_t>(cur, s.halfDim * s.kvPad);
  sc.kPairs = carve<uint32_t>(cur, s.kvHalf * d);
  sc.goPairs = carve<uint32_t>(cur, s.qHalf * d);
  sc.qPairs = carve<uint32_t>(cur, s.qHalf * d);
  sc.attnPairs = carve<uint32_t>(cur, s.kvB * s.qHalf);
  sc.gradAttnPairs = carve<uint32_t>(cur, s.kvB * s.qHalf);
  if (end != nullptr) *end = cur;
  return sc;
}

// ---------------------------------------------------------------------------
// One (batch, head) unit, block by block in CPU's order: query blocks outer,
// key blocks inner, so each gradient block accumulates its terms in CPU's
// order.

struct Unit {
  const FlashBwdGeometry& g;
  const Scratch& sc;
  const uint16_t *go, *q, *k, *v, *out;
  const float* lse;
  uint16_t *gq, *gk, *gv;

  static const uint16_t* at(const uint16_t* base, const FlashBwdStrides& s, int64_t b,
                            int64_t h) {
    return base + b * s.b + h * s.h;
  }

  void queryBlock(int64_t m) const;
  void keyBlock(int64_t m, int64_t qB, int64_t n, int64_t kvB, int64_t numKeys) const;
};

void Unit::queryBlock(int64_t m) const {
  const int64_t d = g.headDim;
  const int64_t qB = std::min(g.qSplit, g.qLen - m);
  // The row sums of grad_out * out (CPU's map2_reduce_all).
  for (int64_t r = 0; r < qB; ++r) {
    sc.dsum[r] = at::vec::map2_reduce_all<BFloat16>(
        [](Vec x, Vec y) { return x * y; }, [](Vec x, Vec y) { return x + y; },
        reinterpret_cast<const BFloat16*>(go + (m + r) * g.gradOut.s),
        reinterpret_cast<const BFloat16*>(out + (m + r) * g.out.s), d);
  }
  packRowPairs(go + m * g.gradOut.s, g.gradOut.s, qB, d, sc.goPairs);
  packRowPairs(q + m * g.q.s, g.q.s, qB, d, sc.qPairs);
  const int64_t numKeys = g.causal ? std::min(m + qB, g.kvLen) : g.kvLen;
  for (int64_t n = 0; n < numKeys; n += g.kvSplit)
    keyBlock(m, qB, n, std::min(g.kvSplit, g.kvLen - n), numKeys);
}

void Unit::keyBlock(int64_t m, int64_t qB, int64_t n, int64_t kvB, int64_t numKeys) const {
  const int64_t d = g.headDim;
  const int64_t halfDim = d / 2;
  const int64_t kvPad = roundUp(kvB, kLanes);
  const int64_t kvEven = roundUp(kvB, 2);
  const int64_t qHalf = (qB + 1) / 2;
  const uint16_t* kBlock = k + n * g.k.s;
  const uint16_t* vBlock = v + n * g.v.s;

  // attn = scale * q k^T (float), then exp(attn - logsumexp) per row.
  packWordsTransposed(kBlock, g.k.s, kvB, d, sc.kT, kvPad);
  dpProduct(qB, kvB, halfDim, rowWords(q + m * g.q.s, g.q.s), sc.kT, kvPad,
            StoreFloat{sc.attn, kvB, g.scale});
  for (int64_t r = 0; r < qB; ++r) {
    const float normalizer = lse[(m + r) * g.lse.s];
    at::vec::map<float>([normalizer](Vec x) { return (x - Vec(normalizer)).exp(); },
                        sc.attn + r * kvB, sc.attn + r * kvB, kvB);
  }
  if (g.causal && numKeys - n <= g.kvSplit) {
    for (int64_t r = 0; r < qB; ++r) {
      const int64_t lastCol = m + r - n;
      for (int64_t c = std::max<int64_t>(lastCol + 1, 0); c < kvB; ++c) sc.attn[r * kvB + c] = 0.f;
    }
  }
  for (int64_t r = 0; r < qB; ++r)
    at::vec::convert<float, BFloat16>(sc.attn + r * kvB,
                                      reinterpret_cast<BFloat16*>(sc.attnRed + r * kvB), kvB);

  // grad_v += attn^T grad_out (bfloat16, beta = 1).
  packRowPairs(sc.attnRed, kvB, qB, kvB, sc.attnPairs);
  dpProduct(kvB, d, qHalf, Words{sc.attnPairs, 1, kvB}, sc.goPairs, d,
            AccumulateBf16{gv + n * g.gradV.s, g.gradV.s, 1.f});

  // grad_attn = attn * (grad_out v^T - dsum).
  packWordsTransposed(vBlock, g.v.s, kvB, d, sc.vT, kvPad);
  dpProduct(qB, kvB, halfDim, rowWords(go + m * g.gradOut.s, g.gradOut.s), sc.vT, kvPad,
            StoreFloat{sc.gradAttn, kvB, 1.f});
  for (int64_t r = 0; r < qB; ++r) {
    const float dr = sc.dsum[r];
    at::vec::map2<float>([dr](Vec a, Vec ga) { return a * (ga - Vec(dr)); },
                         sc.gradAttn + r * kvB, sc.attn + r * kvB, sc.gradAttn + r * kvB, kvB);
  }
  for (int64_t r = 0; r < qB; ++r) {
    uint16_t* row = sc.gradAttnRed + r * kvEven;
    at::vec::convert<float, BFloat16>(sc.gradAttn + r * kvB, reinterpret_cast<BFloat16*>(row),
                                      kvB);
    if (kvEven != kvB) row[kvB] = 0;
  }

  // grad_q += scale * grad_attn k; grad_k += scale * grad_attn^T q.
  packRowPairs(kBlock, g.k.s, kvB, d, sc.kPairs);
  dpProduct(qB, d, kvEven / 2, rowWords(sc.gradAttnRed, kvEven), sc.kPairs, d,
            AccumulateBf16{gq + m * g.gradQ.s, g.gradQ.s, g.scale});
  packRowPairs(sc.gradAttnRed, kvEven, qB, kvB, sc.gradAttnPairs);
  dpProduct(kvB, d, qHalf, Words{sc.gradAttnPairs, 1, kvB}, sc.qPairs, d,
            AccumulateBf16{gk + n * g.gradK.s, g.gradK.s, g.scale});
}

}  // namespace

void flashBwdBlocks(int64_t qLen, int64_t kvLen, int64_t* qSplit, int64_t* kvSplit) {
  const int64_t q = qLen >= 768 ? 256 : qLen >= 192 ? 64 : 32;
  *qSplit = std::min(q, qLen);
  *kvSplit = std::min<int64_t>(512, kvLen);
}

size_t flashBwdScratchBytes(const FlashBwdGeometry& g) {
  uintptr_t bytes = 0;
  carveScratch(g, 0, &bytes);
  return static_cast<size_t>(bytes);
}

void flashBwdUnits(const FlashBwdGeometry& g, const FlashBwdData& data, int64_t begin, int64_t end,
                   void* scratch) {
  const Scratch sc = carveScratch(g, reinterpret_cast<uintptr_t>(scratch));
  const int64_t group = g.heads / g.kvHeads;
  for (int64_t u = begin; u < end; ++u) {
    const int64_t b = u / g.kvHeads, kvh = u % g.kvHeads;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      Unit unit{g,
                sc,
                Unit::at(data.gradOut, g.gradOut, b, h),
                Unit::at(data.q, g.q, b, h),
                Unit::at(data.k, g.k, b, kvh),
                Unit::at(data.v, g.v, b, kvh),
                Unit::at(data.out, g.out, b, h),
                data.lse + b * g.lse.b + h * g.lse.h,
                data.gradQ + b * g.gradQ.b + h * g.gradQ.h,
                data.gradK + b * g.gradK.b + kvh * g.gradK.h,
                data.gradV + b * g.gradV.b + kvh * g.gradV.h};
      for (int64_t m = 0; m < g.qLen; m += g.qSplit) unit.queryBlock(m);
    }
  }
}

}  // namespace torchneuron
