// Fused RMSNorm, forward and backward, over the last dimension of a
// contiguous [rows, cols] tensor (float32 or bfloat16; accumulation in float).
//
//   forward:  rstd = 1 / sqrt(mean(x^2) + eps);  y = x * rstd * w
//   backward: xhat = x * rstd;  g = dy * w
//             dx = rstd * (g - xhat * mean(g * xhat));  dw = sum_rows(dy * xhat)
//
// One pass over each row (the eager composition makes four: pow, mean, rsqrt
// and two multiplies, each a trip through memory). Sums are over eight
// partial lanes, so the compiler vectorizes them; the order differs from
// ATen's reduction, hence the results agree with the composition to a few
// ulp, not bit for bit (the tests bound it).
#include <cmath>

namespace {


template <class T>
float sum_squares(const T* x, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) {
      const float v = tn_load(x, i + l);
      lanes[l] += v * v;
    }
  float total = 0;
  for (; i < n; ++i) total += tn_load(x, i) * tn_load(x, i);
  for (int l = 0; l < 8; ++l) total += lanes[l];
  return total;
}

template <class T>
void forward(const tn_args* a) {
  const T* x = static_cast<const T*>(a->tensors[0].data);
  const T* w = static_cast<const T*>(a->tensors[1].data);
  T* y = static_cast<T*>(a->tensors[2].data);
  float* rstd = static_cast<float*>(a->tensors[3].data);
  const int64_t rows = a->tensors[0].sizes[0], cols = a->tensors[0].sizes[1];
  const float eps = static_cast<float>(a->scalars[0].f);
  tn_parallel(a, 0, rows, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      const float s = 1.0f / std::sqrt(sum_squares(xr, cols) / static_cast<float>(cols) + eps);
      rstd[r] = s;
      for (int64_t c = 0; c < cols; ++c) tn_store(yr, c, tn_load(xr, c) * s * tn_load(w, c));
    }
  });
}

template <class T>
void backward(const tn_args* a) {
  const T* dy = static_cast<const T*>(a->tensors[0].data);
  const T* x = static_cast<const T*>(a->tensors[1].data);
  const T* w = static_cast<const T*>(a->tensors[2].data);
  const float* rstd = static_cast<const float*>(a->tensors[3].data);
  T* dx = static_cast<T*>(a->tensors[4].data);
  float* dw = static_cast<float*>(a->tensors[5].data);
  const int64_t rows = a->tensors[1].sizes[0], cols = a->tensors[1].sizes[1];
  tn_parallel(a, 0, rows, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * cols;
      const T* dyr = dy + r * cols;
      const float s = rstd[r];
      float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      float dot = 0;
      int64_t c = 0;
      for (; c + 8 <= cols; c += 8)
        for (int l = 0; l < 8; ++l)
          lanes[l] += tn_load(dyr, c + l) * tn_load(w, c + l) * tn_load(xr, c + l) * s;
      for (; c < cols; ++c) dot += tn_load(dyr, c) * tn_load(w, c) * tn_load(xr, c) * s;
      for (int l = 0; l < 8; ++l) dot += lanes[l];
      const float mean = dot / static_cast<float>(cols);
      T* dxr = dx + r * cols;
      for (c = 0; c < cols; ++c) {
        const float xhat = tn_load(xr, c) * s;
        tn_store(dxr, c, s * (tn_load(dyr, c) * tn_load(w, c) - xhat * mean));
      }
    }
  });
  // dw: columns in blocks, each summing over every row.
  tn_parallel(a, 0, cols, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) dw[c] = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float s = rstd[r];
      for (int64_t c = lo; c < hi; ++c)
        dw[c] += tn_load(dy, r * cols + c) * tn_load(x, r * cols + c) * s;
    }
  });
}

}  // namespace

extern "C" void rms_norm_forward(const tn_args* a) {
  if (a->tensors[0].dtype == TN_BFLOAT16) forward<uint16_t>(a);
  else forward<float>(a);
}

extern "C" void rms_norm_backward(const tn_args* a) {
  if (a->tensors[1].dtype == TN_BFLOAT16) backward<uint16_t>(a);
  else backward<float>(a);
}
