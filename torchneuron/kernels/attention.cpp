// Tiled attention (FlashAttention-2 style), forward and backward, float32 or
// bfloat16 (all math in float, one rounding to bfloat16 at each store).
//
// q [B, H, Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv], any strides;
// scores s = scale * q k^T, causal masking keeps key j for query i when
// j <= i (top-left aligned, as scaled_dot_product_attention's is_causal).
//
// forward, per (batch*head, tile of BQ queries): the query tile stays in
//   cache while key/value tiles of BK keys stream past; each row keeps a
//   running max m, a running sum l of exp(s - m) and an unnormalized output
//   (online softmax: when m grows, l and the output are scaled by
//   exp(m_old - m_new)). out = acc / l, and lse = m + log(l) per row is saved
//   for the backward: O(seq) extra memory, the [Sq, Sk] matrix never exists.
// backward, with p = exp(s - lse) recomputed tile by tile:
//   delta_i = dout_i . out_i                       (pass 1, per row)
//   dv_j = sum_i p_ij dout_i,  ds_ij = p_ij (dout_i . v_j - delta_i),
//   dk_j = scale * sum_i ds_ij q_i                 (pass 2, per key tile)
//   dq_i = scale * sum_j ds_ij k_j                 (pass 3, per query tile)
// Pass 2 runs over (batch*head, key tiles) and pass 3 over (batch*head,
// query tiles), so every thread owns the rows it writes: no atomics, no
// partial sums to reduce, the same result for any thread count.
//
// Tiles are copied to float buffers (head dims padded with zeros to a
// multiple of 16) and multiplied by a small register-blocked matrix kernel
// (8 rows x 32 columns of accumulators, GCC vector types); _attention.py
// builds this file with -ffp-contract=fast, so its multiply-adds fuse, and
// with the loop vectorizer on for the `#pragma omp simd` loops of the
// softmax. exp is a vectorizable polynomial (below) within 1 ulp of exp
// (measured 0.94 over [-87, 1]).
#include <algorithm>
#include <cmath>
#include <vector>

namespace {

// exp(x) for x <= ~88: 2^n * e^r with n = round(x / ln 2) and |r| <= ln(2)/2,
// e^r by its Taylor polynomial of degree 7 (truncation below 5e-9 relative),
// ln 2 split in two for an exact-enough r. Below -87.3 (results under
// FLT_MIN, and -inf) it gives 0; NaN stays NaN. Branch-free, so loops over
// it vectorize.
inline float exp_poly(float x) {
  const float lo = -87.3f, hi = 88.0f;
  const float keep = x < lo ? 0.0f : 1.0f;
  x = std::min(std::max(x, lo), hi);
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + magic) - magic;
  float r = std::fma(n, -0.693145751953125f, x);     // ln 2, high part (exact product)
  r = std::fma(n, -1.428606765330187045e-06f, r);    // ln 2, low part
  float e = 1.0f / 5040.0f;
  e = std::fma(e, r, 1.0f / 720.0f);
  e = std::fma(e, r, 1.0f / 120.0f);
  e = std::fma(e, r, 1.0f / 24.0f);
  e = std::fma(e, r, 1.0f / 6.0f);
  e = std::fma(e, r, 0.5f);
  e = std::fma(e, r, 1.0f);
  e = std::fma(e, r, 1.0f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return e * scale * keep;
}

constexpr int64_t BQ = 64;   // queries per tile
constexpr int64_t BK = 64;   // keys per tile
constexpr int64_t W = 16;    // floats per vector


inline int64_t padded(int64_t n) { return (n + W - 1) / W * W; }

typedef float vfloat __attribute__((vector_size(W * sizeof(float))));
inline vfloat vload(const float* p) {
  vfloat v;
  memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, vfloat v) { memcpy(p, &v, sizeof v); }

// C[MR, NV*W] += A[MR, K] B[K, NV*W], A(i, k) = A[i * am + k * ak] (so A may
// be read transposed), B rows ldb apart, C rows ldc apart; the accumulators
// stay in registers over the K loop.
template <int MR, int NV>
void block(int64_t K, const float* A, int64_t am, int64_t ak, const float* B, int64_t ldb,
           float* C, int64_t ldc) {
  vfloat c[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) c[i][v] = vload(C + i * ldc + v * W);
  for (int64_t k = 0; k < K; ++k) {
    vfloat b[NV];
    for (int v = 0; v < NV; ++v) b[v] = vload(B + k * ldb + v * W);
    for (int i = 0; i < MR; ++i) {
      const float a = A[i * am + k * ak];
      for (int v = 0; v < NV; ++v) c[i][v] += a * b[v];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) vstore(C + i * ldc + v * W, c[i][v]);
}

// Blocks of MR = 8 rows by 2 vectors (16 accumulators; measured faster than
// 4 x 4 here, which reloads B four times per step), smaller at the edges.
constexpr int MR = 8, NV = 2;

template <int R>
void block_rows(int64_t mr, int64_t nv, int64_t K, const float* A, int64_t am, int64_t ak,
                const float* B, int64_t ldb, float* C, int64_t ldc) {
  if constexpr (R > 1) {
    if (mr < R) return block_rows<R - 1>(mr, nv, K, A, am, ak, B, ldb, C, ldc);
  }
  if (nv == 2) block<R, 2>(K, A, am, ak, B, ldb, C, ldc);
  else block<R, 1>(K, A, am, ak, B, ldb, C, ldc);
}

// C[M, N] += A[M, K] B[K, N] for N a multiple of W (see block).
void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t am, int64_t ak,
          const float* B, int64_t ldb, float* C, int64_t ldc) {
  for (int64_t m0 = 0; m0 < M; m0 += MR) {
    const int64_t mr = std::min<int64_t>(MR, M - m0);
    for (int64_t n0 = 0; n0 < N; n0 += NV * W) {
      const int64_t nv = std::min<int64_t>(NV, (N - n0) / W);
      block_rows<MR>(mr, nv, K, A + m0 * am, am, ak, B + n0, ldb, C + m0 * ldc + n0, ldc);
    }
  }
}

// dst[r * ld + d] = mul * t[b, h, i0 + r, d] for r < n, d < dim.
template <class T>
void load_rows(const tn_tensor& t, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t dim,
               float mul, float* dst, int64_t ld) {
  const T* base = static_cast<const T*>(t.data) + b * t.strides[0] + h * t.strides[1];
  const int64_t sd = t.strides[3];
  for (int64_t r = 0; r < n; ++r) {
    const T* src = base + (i0 + r) * t.strides[2];
    float* out = dst + r * ld;
    if (sd == 1) {
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) out[d] = tn_load(src, d) * mul;
    } else {
      for (int64_t d = 0; d < dim; ++d) out[d] = tn_load(src, d * sd) * mul;
    }
  }
}

// dst[d * ld + r] = mul * t[b, h, i0 + r, d] for r < n: a transposed tile
// (its columns are rows of t).
template <class T>
void load_cols(const tn_tensor& t, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t dim,
               float mul, float* dst, int64_t ld) {
  const T* base = static_cast<const T*>(t.data) + b * t.strides[0] + h * t.strides[1];
  const int64_t sd = t.strides[3];
  for (int64_t r = 0; r < n; ++r) {
    const T* src = base + (i0 + r) * t.strides[2];
    for (int64_t d = 0; d < dim; ++d) dst[d * ld + r] = tn_load(src, d * sd) * mul;
  }
}

// The number of keys of the tile [k0, k0 + nk) that query i sees.
inline int64_t visible(bool causal, int64_t i, int64_t k0, int64_t nk) {
  return causal ? std::max<int64_t>(0, std::min(nk, i + 1 - k0)) : nk;
}

struct Shape {
  int64_t batch, heads, sq, sk, d, dv, dp, dvp, qtiles, ktiles;
  float scale;
  bool causal;
};

Shape shape_of(const tn_tensor& q, const tn_tensor& k, const tn_tensor& v, const tn_args* a) {
  Shape s;
  s.batch = q.sizes[0];
  s.heads = q.sizes[1];
  s.sq = q.sizes[2];
  s.d = q.sizes[3];
  s.sk = k.sizes[2];
  s.dv = v.sizes[3];
  s.dp = padded(s.d);
  s.dvp = padded(s.dv);
  s.qtiles = (s.sq + BQ - 1) / BQ;
  s.ktiles = (s.sk + BK - 1) / BK;
  s.scale = static_cast<float>(a->scalars[0].f);
  s.causal = a->scalars[1].i != 0;
  return s;
}

// S = Qs Kt for an [nq, BK] tile, then P = exp(S - base_r) on the keys each
// row sees and 0 on the rest (base_r the row's logsumexp).
inline void probabilities(const Shape& s, int64_t i0, int64_t nq, int64_t k0, int64_t nk,
                          const float* qs, const float* kt, const float* lse, float* p) {
  std::fill(p, p + nq * BK, 0.0f);
  gemm(nq, BK, s.dp, qs, s.dp, 1, kt, BK, p, BK);
  for (int64_t r = 0; r < nq; ++r) {
    const int64_t lim = visible(s.causal, i0 + r, k0, nk);
    const float base = lse[r];
    float* pr = p + r * BK;
#pragma omp simd
    for (int64_t j = 0; j < BK; ++j) pr[j] = j < lim ? exp_poly(pr[j] - base) : 0.0f;
  }
}

// Forward and the dq pass keep the query tile fixed and stream key tiles, so
// they work on transposed score tiles st[j * BQ + r] = s(query i0 + r, key
// k0 + j): st = K Q^T needs the transposed query tile (copied once per task)
// and plain key rows, and the per-query softmax runs along vectors of queries.
inline bool sees(bool causal, int64_t i, int64_t j) { return !causal || j <= i; }

template <class T>
void forward(const tn_args* a) {
  const tn_tensor &q = a->tensors[0], &k = a->tensors[1], &v = a->tensors[2];
  T* out = static_cast<T*>(a->tensors[3].data);        // [B, H, Sq, Dv] contiguous
  float* lse = static_cast<float*>(a->tensors[4].data);  // [B, H, Sq] contiguous
  const Shape s = shape_of(q, k, v, a);
  tn_parallel(a, 0, s.batch * s.heads * s.qtiles, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> buffer(s.dp * BQ + BK * s.dp + BK * s.dvp + BQ * s.dvp + BK * BQ + 4 * BQ,
                              0.0f);
    float* qt = buffer.data();          // [Dp, BQ], scaled
    float* ks = qt + s.dp * BQ;         // [BK, Dp]
    float* vs = ks + BK * s.dp;         // [BK, Dvp]
    float* acc = vs + BK * s.dvp;       // [BQ, Dvp]
    float* st = acc + BQ * s.dvp;       // [BK, BQ]
    float* m = st + BK * BQ;            // [BQ] running max
    float* l = m + BQ;                  // [BQ] running sum
    float* top = l + BQ;                // [BQ]
    float* rescale = top + BQ;          // [BQ]
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t bh = task / s.qtiles, b = bh / s.heads, h = bh % s.heads;
      const int64_t i0 = (task % s.qtiles) * BQ, nq = std::min(BQ, s.sq - i0);
      std::fill(qt, qt + s.dp * BQ, 0.0f);
      load_cols<T>(q, b, h, i0, nq, s.d, s.scale, qt, BQ);
      std::fill(acc, acc + BQ * s.dvp, 0.0f);
      std::fill(m, m + BQ, -INFINITY);
      std::fill(l, l + BQ, 0.0f);
      const int64_t kend = s.causal ? std::min(s.sk, i0 + nq) : s.sk;
      for (int64_t k0 = 0; k0 < kend; k0 += BK) {
        const int64_t nk = std::min(BK, kend - k0);
        load_rows<T>(k, b, h, k0, nk, s.d, 1.0f, ks, s.dp);
        load_rows<T>(v, b, h, k0, nk, s.dv, 1.0f, vs, s.dvp);
        std::fill(st, st + nk * BQ, 0.0f);
        gemm(nk, BQ, s.dp, ks, s.dp, 1, qt, BQ, st, BQ);
        // Every query of the tile sees key 0, so after the first tile each
        // m is finite and exp(-inf - m) = 0 masks.
        for (int64_t j = 0; j < nk; ++j) {
          float* sj = st + j * BQ;
#pragma omp simd
          for (int64_t r = 0; r < BQ; ++r)
            if (!sees(s.causal, i0 + r, k0 + j)) sj[r] = -INFINITY;
        }
        std::copy(m, m + BQ, top);
        for (int64_t j = 0; j < nk; ++j) {
          const float* sj = st + j * BQ;
#pragma omp simd
          for (int64_t r = 0; r < BQ; ++r) top[r] = sj[r] > top[r] ? sj[r] : top[r];
        }
#pragma omp simd
        for (int64_t r = 0; r < BQ; ++r) {
          rescale[r] = exp_poly(m[r] - top[r]);   // 0 on the first tile (m = -inf)
          l[r] *= rescale[r];
          m[r] = top[r];
        }
        for (int64_t j = 0; j < nk; ++j) {
          float* sj = st + j * BQ;
#pragma omp simd
          for (int64_t r = 0; r < BQ; ++r) {
            sj[r] = exp_poly(sj[r] - top[r]);
            l[r] += sj[r];
          }
        }
        for (int64_t r = 0; r < nq; ++r) {
          if (rescale[r] == 1.0f) continue;
          float* ar = acc + r * s.dvp;
#pragma omp simd
          for (int64_t d = 0; d < s.dvp; ++d) ar[d] *= rescale[r];
        }
        gemm(nq, s.dvp, nk, st, 1, BQ, vs, s.dvp, acc, s.dvp);   // acc += P V
      }
      for (int64_t r = 0; r < nq; ++r) {
        const int64_t row = bh * s.sq + i0 + r;
        const float inv = 1.0f / l[r];
        const float* ar = acc + r * s.dvp;
        T* o = out + row * s.dv;
        for (int64_t d = 0; d < s.dv; ++d) tn_store(o, d, ar[d] * inv);
        lse[row] = m[r] + std::log(l[r]);
      }
    }
  });
}

template <class T>
void backward(const tn_args* a) {
  const tn_tensor &dout = a->tensors[0], &q = a->tensors[1], &k = a->tensors[2],
                  &v = a->tensors[3];
  const T* out = static_cast<const T*>(a->tensors[4].data);    // [B, H, Sq, Dv] contiguous
  const float* lse = static_cast<const float*>(a->tensors[5].data);
  float* delta = static_cast<float*>(a->tensors[6].data);      // [B, H, Sq] scratch
  T* dq = static_cast<T*>(a->tensors[7].data);                 // contiguous, as q, k, v
  T* dk = static_cast<T*>(a->tensors[8].data);
  T* dv = static_cast<T*>(a->tensors[9].data);
  const Shape s = shape_of(q, k, v, a);
  const int64_t bhs = s.batch * s.heads;

  // Pass 1: delta_i = dout_i . out_i.
  tn_parallel(a, 0, bhs * s.sq, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, s.dv)),
              [&](int64_t lo, int64_t hi) {
    std::vector<float> g(s.dv);
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t bh = row / s.sq, i = row % s.sq;
      load_rows<T>(dout, bh / s.heads, bh % s.heads, i, 1, s.dv, 1.0f, g.data(), s.dv);
      const T* o = out + row * s.dv;
      float sum = 0.0f;
      for (int64_t d = 0; d < s.dv; ++d) sum = std::fma(g[d], tn_load(o, d), sum);
      delta[row] = sum;
    }
  });

  // dS = P * (dP - delta_r) on an [nq, BK] tile, in place of dP.
  auto scores_grad = [&](int64_t nq, const float* p, float* dp, const float* dl) {
    for (int64_t r = 0; r < nq; ++r) {
      const float dr = dl[r];
      const float* pr = p + r * BK;
      float* dr_ = dp + r * BK;
#pragma omp simd
      for (int64_t j = 0; j < BK; ++j) dr_[j] = pr[j] * (dr_[j] - dr);
    }
  };

  // Pass 2: dk and dv, one key tile per task.
  tn_parallel(a, 0, bhs * s.ktiles, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> buffer(s.dp * BK + s.dvp * BK + BK * s.dp + BK * s.dvp + BQ * s.dp +
                              BQ * s.dvp + 2 * BQ * BK, 0.0f);
    float* kt = buffer.data();         // [Dp, BK]
    float* vt = kt + s.dp * BK;        // [Dvp, BK]
    float* dks = vt + s.dvp * BK;      // [BK, Dp]
    float* dvs = dks + BK * s.dp;      // [BK, Dvp]
    float* qs = dvs + BK * s.dvp;      // [BQ, Dp], scaled
    float* gs = qs + BQ * s.dp;        // [BQ, Dvp]
    float* p = gs + BQ * s.dvp;        // [BQ, BK]
    float* dp = p + BQ * BK;           // [BQ, BK], then dS
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t bh = task / s.ktiles, b = bh / s.heads, h = bh % s.heads;
      const int64_t k0 = (task % s.ktiles) * BK, nk = std::min(BK, s.sk - k0);
      load_cols<T>(k, b, h, k0, nk, s.d, 1.0f, kt, BK);
      load_cols<T>(v, b, h, k0, nk, s.dv, 1.0f, vt, BK);
      std::fill(dks, dks + BK * s.dp, 0.0f);
      std::fill(dvs, dvs + BK * s.dvp, 0.0f);
      // Causal: queries before k0 see none of these keys.
      for (int64_t i0 = s.causal ? k0 / BQ * BQ : 0; i0 < s.sq; i0 += BQ) {
        const int64_t nq = std::min(BQ, s.sq - i0), row0 = bh * s.sq + i0;
        load_rows<T>(q, b, h, i0, nq, s.d, s.scale, qs, s.dp);
        load_rows<T>(dout, b, h, i0, nq, s.dv, 1.0f, gs, s.dvp);
        probabilities(s, i0, nq, k0, nk, qs, kt, lse + row0, p);
        std::fill(dp, dp + nq * BK, 0.0f);
        gemm(nq, BK, s.dvp, gs, s.dvp, 1, vt, BK, dp, BK);
        scores_grad(nq, p, dp, delta + row0);
        gemm(nk, s.dvp, nq, p, 1, BK, gs, s.dvp, dvs, s.dvp);    // dV += P^T dO
        gemm(nk, s.dp, nq, dp, 1, BK, qs, s.dp, dks, s.dp);      // dK += dS^T (scale Q)
      }
      for (int64_t j = 0; j < nk; ++j) {
        T* dkr = dk + (bh * s.sk + k0 + j) * s.d;
        T* dvr = dv + (bh * s.sk + k0 + j) * s.dv;
        for (int64_t d = 0; d < s.d; ++d) tn_store(dkr, d, dks[j * s.dp + d]);
        for (int64_t d = 0; d < s.dv; ++d) tn_store(dvr, d, dvs[j * s.dvp + d]);
      }
    }
  });

  // Pass 3: dq, one query tile per task, on transposed score tiles (see forward).
  tn_parallel(a, 0, bhs * s.qtiles, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> buffer(s.dp * BQ + s.dvp * BQ + BQ * s.dp + BK * s.dp + BK * s.dvp +
                              2 * BK * BQ + 2 * BQ, 0.0f);
    float* qt = buffer.data();         // [Dp, BQ], scaled
    float* gt = qt + s.dp * BQ;        // [Dvp, BQ]
    float* dqs = gt + s.dvp * BQ;      // [BQ, Dp]
    float* ks = dqs + BQ * s.dp;       // [BK, Dp]
    float* vs = ks + BK * s.dp;        // [BK, Dvp]
    float* st = vs + BK * s.dvp;       // [BK, BQ]: scores, then P
    float* dst = st + BK * BQ;         // [BK, BQ]: dP, then dS
    float* lq = dst + BK * BQ;         // [BQ]
    float* dl = lq + BQ;               // [BQ]
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t bh = task / s.qtiles, b = bh / s.heads, h = bh % s.heads;
      const int64_t i0 = (task % s.qtiles) * BQ, nq = std::min(BQ, s.sq - i0);
      const int64_t row0 = bh * s.sq + i0;
      std::fill(qt, qt + s.dp * BQ, 0.0f);
      std::fill(gt, gt + s.dvp * BQ, 0.0f);
      std::fill(lq, lq + BQ, 0.0f);
      std::fill(dl, dl + BQ, 0.0f);
      load_cols<T>(q, b, h, i0, nq, s.d, s.scale, qt, BQ);
      load_cols<T>(dout, b, h, i0, nq, s.dv, 1.0f, gt, BQ);
      std::copy(lse + row0, lse + row0 + nq, lq);
      std::copy(delta + row0, delta + row0 + nq, dl);
      std::fill(dqs, dqs + BQ * s.dp, 0.0f);
      const int64_t kend = s.causal ? std::min(s.sk, i0 + nq) : s.sk;
      for (int64_t k0 = 0; k0 < kend; k0 += BK) {
        const int64_t nk = std::min(BK, kend - k0);
        load_rows<T>(k, b, h, k0, nk, s.d, 1.0f, ks, s.dp);
        load_rows<T>(v, b, h, k0, nk, s.dv, 1.0f, vs, s.dvp);
        std::fill(st, st + nk * BQ, 0.0f);
        std::fill(dst, dst + nk * BQ, 0.0f);
        gemm(nk, BQ, s.dp, ks, s.dp, 1, qt, BQ, st, BQ);      // S^T = K (scale Q)^T
        gemm(nk, BQ, s.dvp, vs, s.dvp, 1, gt, BQ, dst, BQ);   // dP^T = V dO^T
        for (int64_t j = 0; j < nk; ++j) {
          const float* sj = st + j * BQ;
          float* dj = dst + j * BQ;
#pragma omp simd
          for (int64_t r = 0; r < BQ; ++r) {
            const float pr = sees(s.causal, i0 + r, k0 + j) ? exp_poly(sj[r] - lq[r]) : 0.0f;
            dj[r] = pr * (dj[r] - dl[r]);
          }
        }
        gemm(nq, s.dp, nk, dst, 1, BQ, ks, s.dp, dqs, s.dp);   // dQ += dS K
      }
      for (int64_t r = 0; r < nq; ++r) {
        T* dqr = dq + (row0 + r) * s.d;
        for (int64_t d = 0; d < s.d; ++d) tn_store(dqr, d, dqs[r * s.dp + d] * s.scale);
      }
    }
  });
}

}  // namespace

// tensors: q, k, v, out, lse; scalars: scale, is_causal.
extern "C" void attention_forward(const tn_args* a) {
  if (a->tensors[0].dtype == TN_BFLOAT16) forward<uint16_t>(a);
  else forward<float>(a);
}

// tensors: dout, q, k, v, out, lse, delta, dq, dk, dv; scalars: scale, is_causal.
extern "C" void attention_backward(const tn_args* a) {
  if (a->tensors[1].dtype == TN_BFLOAT16) backward<uint16_t>(a);
  else backward<float>(a);
}
