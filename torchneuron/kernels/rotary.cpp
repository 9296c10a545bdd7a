// Rotary position embedding, Hugging Face Llama convention (rotate_half),
// forward and backward, float32 or bfloat16 (math in float, one rounding to
// bfloat16 at the store).
//
// With h = head_dim / 2, x1 = x[..., :h], x2 = x[..., h:] and c, s the cos
// and sin rows of the position:
//
//   forward:  y[:h] = x1 * c[:h] - x2 * s[:h]      (x*cos + rotate_half(x)*sin)
//             y[h:] = x2 * c[h:] + x1 * s[h:]
//   backward: dx[:h] = g1 * c[:h] + g2 * s[h:]      (the transpose of the rotation)
//             dx[h:] = g2 * c[h:] - g1 * s[:h]
//
// Each element is two rounded products and one rounded sum, as ATen's
// composition computes it op by op (negation is exact), so float32 results
// are bit for bit the composition's. That needs the products not contracted
// into fused multiply-adds: _rotary.py builds this file with
// -ffp-contract=off after Inductor's flags (Inductor's own default, pinned
// here against a changed config; the loop vectorizer, which Inductor turns
// off and which `#pragma omp simd` needs, is turned back on).
//
// All four tensors are 4-D [batch, heads, seq, head_dim] views with strides
// (cos and sin are expanded over heads, and over batch when it is 1, by
// stride 0), so transposed q/k are read in place. One row of head_dim per
// work item; rows whose last dimension is contiguous in every tensor take a
// vectorized loop.

namespace {


template <class T>
struct Rows {
  T* data;
  const int64_t* strides;
  T* row(int64_t b, int64_t h, int64_t s) const {
    return data + b * strides[0] + h * strides[1] + s * strides[2];
  }
};

template <class T>
Rows<T> rows_of(const tn_tensor& t) {
  return Rows<T>{static_cast<T*>(t.data), t.strides};
}

// out = in1 * c1 + sign * (in2 * s2) on the first half, and
// out = in2 * c2 - sign * (in1 * s1) on the second half, where (c1, s1) and
// (c2, s2) are taken from the halves the direction needs:
//   forward  (sign -1): y1 = x1*c[:h] - x2*s[:h],  y2 = x2*c[h:] + x1*s[h:]
//   backward (sign +1): d1 = g1*c[:h] + g2*s[h:],  d2 = g2*c[h:] - g1*s[:h]
template <class T, bool Backward>
void rotate(const tn_args* a) {
  const tn_tensor& xt = a->tensors[0];
  const Rows<const T> x = rows_of<const T>(xt);
  const Rows<const T> c = rows_of<const T>(a->tensors[1]);
  const Rows<const T> s = rows_of<const T>(a->tensors[2]);
  const Rows<T> y = rows_of<T>(a->tensors[3]);
  const int64_t heads = xt.sizes[1], seq = xt.sizes[2], dim = xt.sizes[3], half = dim / 2;
  const int64_t rows = xt.sizes[0] * heads * seq;
  const int64_t xd = xt.strides[3], cd = a->tensors[1].strides[3], sd = a->tensors[2].strides[3],
                yd = a->tensors[3].strides[3];
  const bool unit = xd == 1 && cd == 1 && sd == 1 && yd == 1;
  const int64_t grain = dim >= 4096 ? 1 : 4096 / (dim > 0 ? dim : 1);
  tn_parallel(a, 0, rows, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t p = r % seq, h = (r / seq) % heads, b = r / (seq * heads);
      const T* xr = x.row(b, h, p);
      const T* cr = c.row(b, h, p);
      const T* sr = s.row(b, h, p);
      T* yr = y.row(b, h, p);
      if (unit) {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = tn_load(xr, i), x2 = tn_load(xr, i + half);
          float first, second;
          if (Backward) {
            const float p1 = x1 * tn_load(cr, i), p2 = x2 * tn_load(sr, i + half);
            const float q1 = x2 * tn_load(cr, i + half), q2 = x1 * tn_load(sr, i);
            first = p1 + p2;
            second = q1 - q2;
          } else {
            const float p1 = x1 * tn_load(cr, i), p2 = x2 * tn_load(sr, i);
            const float q1 = x2 * tn_load(cr, i + half), q2 = x1 * tn_load(sr, i + half);
            first = p1 - p2;
            second = q1 + q2;
          }
          tn_store(yr, i, first);
          tn_store(yr, i + half, second);
        }
      } else {
        for (int64_t i = 0; i < half; ++i) {
          const int64_t j = i + half;
          const float x1 = tn_load(xr, i * xd), x2 = tn_load(xr, j * xd);
          float first, second;
          if (Backward) {
            const float p1 = x1 * tn_load(cr, i * cd), p2 = x2 * tn_load(sr, j * sd);
            const float q1 = x2 * tn_load(cr, j * cd), q2 = x1 * tn_load(sr, i * sd);
            first = p1 + p2;
            second = q1 - q2;
          } else {
            const float p1 = x1 * tn_load(cr, i * cd), p2 = x2 * tn_load(sr, i * sd);
            const float q1 = x2 * tn_load(cr, j * cd), q2 = x1 * tn_load(sr, j * sd);
            first = p1 - p2;
            second = q1 + q2;
          }
          tn_store(yr, i * yd, first);
          tn_store(yr, j * yd, second);
        }
      }
    }
  });
}

}  // namespace

// tensors: x (or grad), cos, sin, out; all [batch, heads, seq, head_dim].
extern "C" void rotary_embedding_forward(const tn_args* a) {
  if (a->tensors[0].dtype == TN_BFLOAT16) rotate<uint16_t, false>(a);
  else rotate<float, false>(a);
}

extern "C" void rotary_embedding_backward(const tn_args* a) {
  if (a->tensors[0].dtype == TN_BFLOAT16) rotate<uint16_t, true>(a);
  else rotate<float, true>(a);
}
