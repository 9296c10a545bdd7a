// The direct paths of sum and mean over dims (sum.dim_IntList and
// mean.dim, which a.sum() and a.mean() also call) for floating tensors
// (DirectOp.h).
//
// A float or double tensor that is contiguous, reduced over trailing dims,
// is a set of rows: the queued kernel sums them in ATen's order (RowSum.h),
// and mean divides each stored sum by the count, as ATen's CPU mean does.
// Other sums queue CPU's sum.out with the contiguous output CPU's functional
// sum allocates; other means take the generic path.
#include "aten/DirectOp.h"
#include "aten/Fusion.h"
#include "aten/RowSum.h"
#include "aten/SerialKernels.h"
#include "core/SerialCompute.h"

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <ATen/ops/sum_cpu_dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <bitset>

namespace torchneuron {
namespace {

struct Reduction {
  at::DimVector shape;      // the result's
  std::bitset<64> reduced;  // the dims reduced
};

// The result of reducing `dim`, or nothing when the dims are not plainly
// valid (out of range, repeated): the generic path then raises CPU's error.
std::optional<Reduction> reductionOf(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                     bool keepdim) {
  const int64_t ndim = self.dim();
  Reduction r;
  if (!dim.has_value() || dim->empty()) {
    r.reduced.set();  // all dims
  } else {
    for (int64_t d : *dim) {
      if (d < -ndim || d >= ndim) return std::nullopt;
      const int64_t w = d < 0 ? d + ndim : d;
      if (r.reduced.test(w)) return std::nullopt;
      r.reduced.set(w);
    }
  }
  for (int64_t d = 0; d < ndim; ++d) {
    if (!r.reduced.test(d)) r.shape.push_back(self.size(d));
    else if (keepdim) r.shape.push_back(1);
  }
  return r;
}

// Floating inputs keep their dtype; integer ones promote (generic path).
bool directEligible(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  return isNeuron(self) && plainOn(self, self.device()) && floatingDtype(self.scalar_type()) &&
         self.dim() > 0 && self.dim() <= 64 && self.numel() > 0 &&
         (!dtype.has_value() || *dtype == self.scalar_type());
}

// ATen splits one row between threads from this many elements on.
constexpr int64_t kGrainSize = at::internal::GRAIN_SIZE;

// The rows of a reduction RowSum.h can take: a float or double contiguous
// tensor whose reduced dims come after every kept dim of more than one
// element, with rows of at least two elements (ATen reduces a single
// element along another path) and several rows or one short enough that
// ATen sums it on one thread.
struct Rows {
  int64_t count = 0, len = 0;
  int lanes = 0;
};
std::optional<Rows> rowsOf(const at::Tensor& self, const Reduction& r) {
  const auto type = self.scalar_type();
  if ((type != at::kFloat && type != at::kDouble) || !self.is_contiguous() || !rowSumsEnabled())
    return std::nullopt;
  Rows rows;
  rows.len = 1;
  bool inRows = false;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (r.reduced.test(d)) {
      inRows = true;
      rows.len *= self.size(d);
    } else if (inRows && self.size(d) != 1) {
      return std::nullopt;
    }
  }
  rows.count = self.numel() / rows.len;
  if (rows.len < 2 || (rows.count == 1 && rows.len >= kGrainSize)) return std::nullopt;
  rows.lanes = type == at::kFloat ? rowSumLanesFloat() : rowSumLanesDouble();
  if (rows.lanes == 0) return std::nullopt;
  return rows;
}

// The row kernel of one reduction: out = the row sums of `in`, each divided
// by the row length for a mean.
struct RowKernel {
  const void* in;
  void* out;
  at::ScalarType type;
  Rows rows;
  bool mean;

  // Rows [begin, end), on this thread.
  void range(int64_t begin, int64_t end) const {
    if (type == at::kFloat) {
      rowSums(static_cast<const float*>(in), static_cast<float*>(out), rows.len, begin, end,
              rows.lanes, mean ? static_cast<float>(rows.len) : 1.0f);
    } else {
      rowSums(static_cast<const double*>(in), static_cast<double*>(out), rows.len, begin, end,
              rows.lanes, mean ? static_cast<double>(rows.len) : 1.0);
    }
  }
  // Every row, split between the device's threads in runs of at least a
  // grain of elements; a row's sum does not depend on the split.
  void all() const {
    const int64_t grain = std::max<int64_t>(1, kGrainSize / rows.len);
    at::parallel_for(0, rows.count, grain, [&](int64_t begin, int64_t end) { range(begin, end); });
  }
};

// The reduction as a fusion pass's row op (Fusion.h): its elements are its
// input's, and a pass hands it whole rows.
struct RowOp final : FusibleOp {
  RowKernel kernel;
  void run() override { kernel.all(); }
  void runRange(int64_t begin, int64_t end) override {
    const int64_t len = kernel.rows.len;
    TORCH_CHECK(begin % len == 0 && end % len == 0, name, ": a fusion pass split a row (elements ",
                begin, " to ", end, ", rows of ", len, ")");
    kernel.range(begin / len, end / len);
  }
};

// Queues the row kernel: as a fusible row op where fusion may pair it with
// the ops around it (a LayerNorm's statistics), else alone.
void launchRows(const char* name, const at::Tensor& out, const at::Tensor& self, Rows rows,
                bool mean) {
  const RowKernel kernel{self.const_data_ptr(), out.mutable_data_ptr(), self.scalar_type(), rows,
                         mean};
  if (self.numel() >= kMinFusibleElements && fusionEnabled()) {
    auto op = std::make_unique<RowOp>();
    op->kernel = kernel;
    op->numel = self.numel();
    op->rowLength = rows.len;
    launchFusible(getCurrentStream(out.device().index()), describeDirect(name, out, {&self}),
                  std::move(op));
    return;
  }
  launchDirect(name, out, {&self}, [kernel] { kernel.all(); });
}

// The boxed call of a reduction `op` (sum.dim_IntList, mean.dim) on the
// generic path, for the calls the direct paths leave (it raises CPU's errors).
at::Tensor reductionViaGeneric(const c10::OperatorHandle& op, const at::Tensor& self,
                               at::OptionalIntArrayRef dim, bool keepdim,
                               std::optional<at::ScalarType> dtype) {
  torch::jit::Stack stack{self, dim.has_value() ? c10::IValue(dim->vec()) : c10::IValue(),
                          keepdim, dtype.has_value() ? c10::IValue(*dtype) : c10::IValue()};
  return viaGeneric(op, std::move(stack));
}

at::Tensor sum_dim(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dtype) {
  NEURON_DIRECT_OP("aten::sum.dim_IntList");
  if (directEligible(self, dtype)) {
    if (auto r = reductionOf(self, dim, keepdim)) {
      OnDevice onDevice(self.device());
      at::Tensor out = emptyDevice(r->shape, self.scalar_type());
      if (auto rows = rowsOf(self, *r)) {
        launchRows(kName, out, self, *rows, /*mean=*/false);
      } else {
        std::optional<at::DimVector> dims;
        if (dim.has_value()) dims = at::DimVector(*dim);
        const bool serial =
            serialDimReduction(self.sizes(), self.strides(), self.scalar_type(), r->reduced);
        launchDirect(kName, out, {&self},
                     [o = Operand::of(out, /*written=*/true), in = Operand::of(self),
                      dims = std::move(dims), keepdim, serial] {
                       SerialScope scope(serial);
                       at::Tensor result = o.cpu();
                       at::OptionalIntArrayRef d;
                       if (dims.has_value()) d = at::IntArrayRef(*dims);
                       at::cpu::sum_out(result, in.cpu(), d, keepdim, std::nullopt);
                     });
      }
      recordOp(counters, OpPath::Async);
      return out;
    }
  }
  static const auto& op = genericOp("aten::sum", "dim_IntList");
  return reductionViaGeneric(op, self, dim, keepdim, dtype);
}

at::Tensor mean_dim(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                    std::optional<at::ScalarType> dtype) {
  NEURON_DIRECT_OP("aten::mean.dim");
  if (directEligible(self, dtype)) {
    if (auto r = reductionOf(self, dim, keepdim)) {
      if (auto rows = rowsOf(self, *r)) {
        OnDevice onDevice(self.device());
        at::Tensor out = emptyDevice(r->shape, self.scalar_type());
        launchRows(kName, out, self, *rows, /*mean=*/true);
        recordOp(counters, OpPath::Async);
        return out;
      }
    }
  }
  static const auto& op = genericOp("aten::mean", "dim");
  return reductionViaGeneric(op, self, dim, keepdim, dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("sum.dim_IntList", TORCH_FN(sum_dim));
  m.impl("mean.dim", TORCH_FN(mean_dim));
}

}  // namespace torchneuron
