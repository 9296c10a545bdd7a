// A matrix product as one BLAS call, planned on the host exactly as ATen's
// CPU addmm/mm plans it, and run on the executor over raw device pointers.
//
// CPU's mm and addmm (addmm_impl_cpu_ in ATen's LinearAlgebra.cpp) decide
// how the result and the operands map onto a column-major gemm (which
// operand goes first, which are transposed, the leading dimensions), then
// cpublas::gemm normalizes the leading dimensions of size-1 dims and, for
// float and double matrices, calls BLAS's sgemm_/dgemm_ (float only while
// oneDNN's matmul precision is not bf16 or tf32, which may send it to
// oneDNN). planGemm makes the same decisions from sizes and strides, so the
// executor makes the same BLAS call with the same arguments, and the result
// has CPU's bits. What it does not plan (half and bf16, which go through
// oneDNN; operands ATen would copy first; a bias that is not a plain row or
// matrix; a scalar that does not convert) it declines, and the caller keeps
// ATen's kernel.
//
// Why not just call ATen's kernel: for small products its per-call cost
// (three CPU tensors over device memory, the structured op's checks, a
// dispatched resolve_conj per operand) is several times the BLAS call, and
// it runs on the executor, which then limits how fast small products go.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace torchneuron {

struct GemmCall {
  // BLAS arguments (column-major), as cpublas::gemm passes them.
  char transa = 'n';
  char transb = 'n';
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  bool isDouble = false;
  double alpha = 1, beta = 0;  // already rounded to float for float matrices

  // addmm with beta != 0 first copies its bias into the result: `biasRows`
  // rows (1: one row broadcast to every result row) of `rowBytes` bytes.
  const void* bias = nullptr;
  int64_t biasRows = 0;
  int64_t resultRows = 0;
  int64_t rowBytes = 0;
};

// The BLAS call of CPU's addmm(self, mat1, mat2, beta, alpha) into `out`, a
// fresh contiguous mat1.size(0) x mat2.size(1) matrix; `self` undefined
// for mm. Inputs: plain, non-empty matrices of one dtype on the device.
std::optional<GemmCall> planGemm(const at::Tensor& out, const at::Tensor& self,
                                 const at::Tensor& mat1, const at::Tensor& mat2,
                                 const at::Scalar& beta, const at::Scalar& alpha);

// Runs a planned call (on the executor): on one thread where that is small
// and gives the bits of the thread's count (SerialGemm.h).
void runGemm(const GemmCall& call);

// The call's BLAS product alone, on operands `a`, `b` and result `c` laid
// out as the call's (no bias copy).
void callBlas(const GemmCall& call, const void* a, const void* b, void* c);

// The A/B switch: off, planGemm declines every call (ATen's kernel runs).
bool gemmPlansEnabled();
void setGemmPlansEnabled(bool on);

// How many calls planGemm has planned (tests: that the plan is taken).
uint64_t gemmPlansMade();

}  // namespace torchneuron
