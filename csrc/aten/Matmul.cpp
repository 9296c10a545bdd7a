// The direct paths of mm and addmm (DirectOp.h) for floating matrices of one
// dtype, into the contiguous result CPU's functional ops allocate: the BLAS
// call CPU's kernel would make (Gemm.h) where it is one, else CPU's
// mm.out / addmm.out. nn.Linear on 2-D inputs is addmm.
#include "aten/DirectOp.h"
#include "aten/Gemm.h"

#include <ATen/ExpandUtils.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

// Whether mat1 @ mat2 may take the direct path: plain, non-empty floating
// matrices of one dtype on one device whose inner sizes agree.
bool directMatmul(const at::Tensor& mat1, const at::Tensor& mat2) {
  if (!isNeuron(mat1) || !plainOn(mat1, mat1.device()) || !plainOn(mat2, mat1.device()))
    return false;
  if (mat1.dim() != 2 || mat2.dim() != 2 || mat1.size(1) != mat2.size(0)) return false;
  if (!floatingDtype(mat1.scalar_type()) || mat2.scalar_type() != mat1.scalar_type()) return false;
  return mat1.numel() > 0 && mat2.numel() > 0;
}

// A scalar CPU's addmm takes for a floating result without error.
bool realScalar(const at::Scalar& s) {
  return s.isFloatingPoint() || s.isIntegral(/*includeBool=*/false);
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2) {
  NEURON_DIRECT_OP("aten::mm");
  if (directMatmul(self, mat2)) {
    OnDevice onDevice(self.device());
    at::Tensor out = emptyDevice({self.size(0), mat2.size(1)}, self.scalar_type());
    if (const auto call = planGemm(out, at::Tensor(), self, mat2, 0, 1)) {
      launchDirect(kName, out, {&self, &mat2}, [call = *call] { runGemm(call); });
    } else {
      launchDirect(
          kName, out, {&self, &mat2},
          [o = Operand::of(out, /*written=*/true), a = Operand::of(self), b = Operand::of(mat2)] {
            at::Tensor result = o.cpu();
            at::cpu::mm_out(result, a.cpu(), b.cpu());
          });
    }
    recordOp(counters, OpPath::Async);
    return out;
  }
  static const auto& op = genericOp("aten::mm", "");
  return viaGeneric(op, {self, mat2});
}

at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                 const at::Scalar& beta, const at::Scalar& alpha) {
  NEURON_DIRECT_OP("aten::addmm");
  if (directMatmul(mat1, mat2) && plainOn(self, mat1.device()) &&
      self.scalar_type() == mat1.scalar_type() && realScalar(beta) && realScalar(alpha) &&
      at::is_expandable_to(self.sizes(), {mat1.size(0), mat2.size(1)})) {
    OnDevice onDevice(mat1.device());
    at::Tensor out = emptyDevice({mat1.size(0), mat2.size(1)}, mat1.scalar_type());
    if (const auto call = planGemm(out, self, mat1, mat2, beta, alpha)) {
      launchDirect(kName, out, {&self, &mat1, &mat2}, [call = *call] { runGemm(call); });
    } else {
      launchDirect(kName, out, {&self, &mat1, &mat2},
                   [o = Operand::of(out, /*written=*/true), s = Operand::of(self),
                    a = Operand::of(mat1), b = Operand::of(mat2), beta, alpha] {
                     at::Tensor result = o.cpu();
                     at::cpu::addmm_out(result, s.cpu(), a.cpu(), b.cpu(), beta, alpha);
                   });
    }
    recordOp(counters, OpPath::Async);
    return out;
  }
  static const auto& op = genericOp("aten::addmm", "");
  return viaGeneric(op, {self, mat1, mat2, beta, alpha});
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mm", TORCH_FN(mm));
  m.impl("addmm", TORCH_FN(addmm));
}

}  // namespace torchneuron
