#include "aten/Gemm.h"

#include "aten/SerialGemm.h"
#include "core/SerialCompute.h"

#include <ATen/Context.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>

// BLAS's Fortran entry points, exported by libtorch_cpu (its bundled BLAS).
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b,
            const int* ldb, const double* beta, double* c, const int* ldc);
}

namespace torchneuron {
namespace {

// Whether CPU's gemm for this dtype is a plain BLAS call: always for double;
// for float unless oneDNN's matmul precision is bf16 or tf32 (then
// cpublas::gemm hands some float products to oneDNN; its test reads the same
// setting, which is unset by default).
bool blasDtype(at::ScalarType dtype) {
  if (dtype == at::kDouble) return true;
  if (dtype != at::kFloat) return false;
  const auto precision =
      at::globalContext().float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL);
  return precision != at::Float32Precision::BF16 && precision != at::Float32Precision::TF32;
}

// A matrix operand's data, sizes and strides, swappable as ATen swaps them.
struct Matrix {
  const void* data;
  int64_t size[2];
  int64_t stride[2];

  static Matrix of(const at::Tensor& t) {
    return {t.const_data_ptr(), {t.size(0), t.size(1)}, {t.stride(0), t.stride(1)}};
  }
};

// How an operand maps onto a BLAS matrix (addmm_impl_cpu_'s casts): as is,
// transposed, or (nullopt) not without a copy. `rows` and `cols` are the
// BLAS matrix's, `outer`/`inner` index the operand's dims in that order.
std::optional<bool> transposed(const Matrix& x, int outer, int inner, int64_t rows,
                               int64_t cols) {
  if (x.stride[outer] == 1 && x.stride[inner] >= std::max<int64_t>(1, rows)) return false;
  if (x.stride[inner] == 1 && x.stride[outer] >= std::max<int64_t>(1, cols)) return true;
  return std::nullopt;
}

// addmm's bias copy when beta != 0: `self`, expanded to the result's
// rows x cols, as whole rows of memory. False where it is laid out otherwise.
bool planBias(GemmCall& call, const at::Tensor& self, int64_t rows, int64_t cols) {
  const bool row = (self.dim() == 1 && self.size(0) == cols) ||
                   (self.dim() == 2 && self.size(0) == 1 && self.size(1) == cols);
  if (row && (cols == 1 || self.stride(-1) == 1)) {
    call.biasRows = 1;
  } else if (self.dim() == 2 && self.size(0) == rows && self.size(1) == cols &&
             self.is_contiguous()) {
    call.biasRows = rows;
  } else {
    return false;
  }
  call.bias = self.const_data_ptr();
  call.resultRows = rows;
  call.rowBytes = cols * static_cast<int64_t>(self.element_size());
  return true;
}

bool fitsInt(int64_t v) { return v <= INT_MAX; }

std::atomic<bool>& enabledFlag() {
  static std::atomic<bool> on{true};
  return on;
}

std::atomic<uint64_t> gPlansMade{0};

}  // namespace

bool gemmPlansEnabled() { return enabledFlag().load(std::memory_order_relaxed); }

void setGemmPlansEnabled(bool on) { enabledFlag().store(on); }

uint64_t gemmPlansMade() { return gPlansMade.load(std::memory_order_relaxed); }

std::optional<GemmCall> planGemm(const at::Tensor& out, const at::Tensor& self,
                                 const at::Tensor& mat1, const at::Tensor& mat2,
                                 const at::Scalar& beta, const at::Scalar& alpha) {
  if (!gemmPlansEnabled() || !blasDtype(out.scalar_type())) return std::nullopt;
  GemmCall call;
  call.isDouble = out.scalar_type() == at::kDouble;
  try {  // CPU converts the scalars to the matrices' type, raising on overflow
    call.alpha = call.isDouble ? alpha.to<double>() : alpha.to<float>();
    call.beta = call.isDouble ? beta.to<double>() : beta.to<float>();
  } catch (const c10::Error&) {
    return std::nullopt;  // ATen's kernel raises it
  }
  const int64_t rows = out.size(0), cols = out.size(1);
  if (self.defined() && beta.toComplexDouble() != 0.0 && !planBias(call, self, rows, cols))
    return std::nullopt;

  // The result as BLAS's column-major C: as is, or transposed with the
  // operands swapped (C^T = B^T A^T).
  Matrix m1 = Matrix::of(mat1), m2 = Matrix::of(mat2);
  const int64_t rs0 = out.stride(0), rs1 = out.stride(1);
  bool tc;
  if (rs0 == 1 && (cols == 1 || rs1 >= std::max<int64_t>(1, rows))) {
    tc = false;
  } else if (rs1 == 1 && (rows == 1 || rs0 >= std::max<int64_t>(1, cols))) {
    tc = true;
    std::swap(m1, m2);
  } else {
    return std::nullopt;
  }
  const int64_t m = tc ? cols : rows, n = tc ? rows : cols, k = m1.size[tc ? 0 : 1];
  const int outer = tc ? 1 : 0, inner = tc ? 0 : 1;
  const auto ta = transposed(m1, outer, inner, m, k);
  const auto tb = transposed(m2, outer, inner, k, n);
  if (!ta || !tb) return std::nullopt;
  int64_t lda = m1.stride[*ta == tc ? 1 : 0];
  int64_t ldb = m2.stride[*tb == tc ? 1 : 0];
  int64_t ldc = tc ? rs0 : rs1;

  // cpublas::gemm's normalization of leading dims of size-1 dims...
  if (n == 1) ldc = m;
  if (*ta) {
    if (m == 1) lda = k;
  } else if (k == 1) {
    lda = m;
  }
  if (*tb) {
    if (k == 1) ldb = n;
  } else if (n == 1) {
    ldb = k;
  }
  // ... and its test for handing the call to BLAS.
  if (!fitsInt(m) || !fitsInt(n) || !fitsInt(k) || !fitsInt(lda) || !fitsInt(ldb) ||
      !fitsInt(ldc) || lda < std::max<int64_t>(1, *ta ? k : m) ||
      ldb < std::max<int64_t>(1, *tb ? n : k) || ldc < std::max<int64_t>(1, m))
    return std::nullopt;

  call.transa = *ta ? 'T' : 'N';
  call.transb = *tb ? 'T' : 'N';
  call.m = static_cast<int>(m);
  call.n = static_cast<int>(n);
  call.k = static_cast<int>(k);
  call.lda = static_cast<int>(lda);
  call.ldb = static_cast<int>(ldb);
  call.ldc = static_cast<int>(ldc);
  call.a = m1.data;
  call.b = m2.data;
  call.c = out.mutable_data_ptr();
  gPlansMade.fetch_add(1, std::memory_order_relaxed);
  return call;
}

void callBlas(const GemmCall& call, const void* a, const void* b, void* c) {
  if (call.isDouble) {
    const double alpha = call.alpha, beta = call.beta;
    dgemm_(&call.transa, &call.transb, &call.m, &call.n, &call.k, &alpha,
           static_cast<const double*>(a), &call.lda, static_cast<const double*>(b), &call.ldb,
           &beta, static_cast<double*>(c), &call.ldc);
  } else {
    const float alpha = static_cast<float>(call.alpha), beta = static_cast<float>(call.beta);
    sgemm_(&call.transa, &call.transb, &call.m, &call.n, &call.k, &alpha,
           static_cast<const float*>(a), &call.lda, static_cast<const float*>(b), &call.ldb,
           &beta, static_cast<float*>(c), &call.ldc);
  }
}

void runGemm(const GemmCall& call) {
  if (call.bias) {
    auto* dst = static_cast<char*>(call.c);
    const auto* src = static_cast<const char*>(call.bias);
    if (call.biasRows == call.resultRows) {
      std::memcpy(dst, src, call.resultRows * call.rowBytes);
    } else {
      for (int64_t r = 0; r < call.resultRows; ++r)
        std::memcpy(dst + r * call.rowBytes, src, call.rowBytes);
    }
  }
  const int64_t macs = int64_t(call.m) * call.n * call.k;
  SerialScope serial(serialWorthy(macs) && serialGemmAgrees(call));
  callBlas(call, call.a, call.b, call.c);
}

}  // namespace torchneuron
