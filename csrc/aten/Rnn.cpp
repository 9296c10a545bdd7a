// Fused RNN cells. ATen's LSTM/GRU cells use _thnn_fused_{lstm,gru}_cell on
// every non-CPU device, and those have CUDA kernels only; on neuron they are
// composed from device ops with the CUDA kernels' semantics (workspace
// layout included, so the autograd formulas in derivatives.yaml apply).
#include "aten/Common.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/tanh.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  NEURON_RECORD_OP("aten::_thnn_fused_lstm_cell", Native);
  at::Tensor gates = input_gates + hidden_gates;
  if (input_bias.has_value() && input_bias->defined()) gates = gates + *input_bias;
  if (hidden_bias.has_value() && hidden_bias->defined()) gates = gates + *hidden_bias;
  auto chunks = gates.chunk(4, 1);
  at::Tensor ig = chunks[0].sigmoid();
  at::Tensor fg = chunks[1].sigmoid();
  at::Tensor cg = chunks[2].tanh();
  at::Tensor og = chunks[3].sigmoid();
  at::Tensor cy = fg * cx + ig * cg;
  at::Tensor hy = og * cy.tanh();
  at::Tensor workspace = at::cat({ig, fg, cg, og}, 1);
  return {hy, cy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward_impl(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  NEURON_RECORD_OP("aten::_thnn_fused_lstm_cell_backward_impl", Native);
  const bool has_hy = grad_hy.has_value() && grad_hy->defined();
  const bool has_cy = grad_cy.has_value() && grad_cy->defined();
  if (!has_hy && !has_cy) return {at::Tensor(), at::Tensor(), at::Tensor()};
  auto w = workspace.chunk(4, 1);
  const at::Tensor &ig = w[0], &fg = w[1], &cg = w[2], &og = w[3];
  at::Tensor tanh_cy = cy.tanh();
  at::Tensor gog = has_hy ? *grad_hy * tanh_cy : at::zeros_like(og);
  at::Tensor gcx = has_hy ? *grad_hy * og * (1 - tanh_cy * tanh_cy) : at::zeros_like(cy);
  if (has_cy) gcx = gcx + *grad_cy;
  at::Tensor gig = gcx * cg * (1 - ig) * ig;
  at::Tensor gfg = gcx * cx * (1 - fg) * fg;
  at::Tensor gcg = gcx * ig * (1 - cg * cg);
  gog = gog * (1 - og) * og;
  at::Tensor grad_gates = at::cat({gig, gfg, gcg, gog}, 1);
  at::Tensor grad_cx = gcx * fg;
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& hx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  NEURON_RECORD_OP("aten::_thnn_fused_gru_cell", Native);
  at::Tensor ig_all = input_gates;
  at::Tensor hg_all = hidden_gates;
  if (input_bias.has_value() && input_bias->defined()) ig_all = ig_all + *input_bias;
  if (hidden_bias.has_value() && hidden_bias->defined()) hg_all = hg_all + *hidden_bias;
  auto i = ig_all.chunk(3, 1);
  auto h = hg_all.chunk(3, 1);
  at::Tensor rg = (i[0] + h[0]).sigmoid();
  at::Tensor zg = (i[1] + h[1]).sigmoid();
  at::Tensor hn = h[2];
  at::Tensor ng = (i[2] + rg * hn).tanh();
  at::Tensor hy = ng + zg * (hx - ng);
  at::Tensor workspace = at::cat({rg, zg, ng, hx, hn}, 1);
  return {hy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  NEURON_RECORD_OP("aten::_thnn_fused_gru_cell_backward", Native);
  auto w = workspace.chunk(5, 1);
  const at::Tensor &rg = w[0], &zg = w[1], &ng = w[2], &hx = w[3], &hn = w[4];
  at::Tensor gzg = grad_hy * (hx - ng) * (1 - zg) * zg;
  at::Tensor ghx = grad_hy * zg;
  at::Tensor gin = grad_hy * (1 - zg) * (1 - ng * ng);
  at::Tensor ghn = gin * rg;
  at::Tensor grg = gin * hn * (1 - rg) * rg;
  at::Tensor grad_input_gates = at::cat({grg, gzg, gin}, 1);
  at::Tensor grad_hidden_gates = at::cat({grg, gzg, ghn}, 1);
  at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {grad_input_gates, grad_hidden_gates, ghx, grad_input_bias, grad_hidden_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(fused_lstm_cell_backward_impl));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(fused_gru_cell_backward));
}

}  // namespace torchneuron
