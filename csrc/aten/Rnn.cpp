// Recurrent layers and cells on neuron, composed exactly as ATen composes
// them for CPU.
//
// aten::lstm/gru/rnn_tanh/rnn_relu (dense .input and packed .data) and the
// four *_cell ops are CompositeImplicitAutograd, and ATen's composition
// (aten/src/ATen/native/RNN.cpp) branches on the device:
//   - CPU projects the inputs of every time step with one linear before the
//     loop (FullLayer, PackedLayer); other devices do one linear per step;
//   - CPU builds the LSTM and GRU cells from linear + pointwise ops; other
//     devices call _thnn_fused_{lstm,gru}_cell, whose kernels and backward
//     formulas round differently;
//   - float32 LSTM on CPU runs oneDNN, one mkldnn_rnn_layer per layer and
//     direction.
// Our promise is CPU's bits, outputs and gradients. So these kernels, at
// AutogradPrivateUse1, replace the decomposition for neuron with CPU's
// branch: the same ATen ops in the same order, which autograd records into
// the same graph as on CPU, so backward runs CPU's formulas too. The same
// kernels sit at PrivateUse1 for inference mode, which skips autograd keys
// (without them the generic decomposition would run there).
//
// Error checks and messages follow ATen's, so misuse fails as on CPU.
#include "aten/Common.h"

#include <ATen/Context.h>
#include <ATen/MatrixRef.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/RNN.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mkldnn_rnn_layer.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

namespace torchneuron {
namespace {

using at::Tensor;
using at::TensorList;

// ---------------------------------------------------------------------------
// Parameters of one layer and direction. The biases are undefined for
// bias=False; w_hr is defined only for an LSTM with projections.

struct CellParams {
  Tensor w_ih, w_hh, b_ih, b_hh, w_hr;

  Tensor linearIh(const Tensor& x) const { return at::linear(x, w_ih, b_ih); }
  Tensor linearHh(const Tensor& h) const { return at::linear(h, w_hh, b_hh); }
  Tensor project(const Tensor& h) const { return w_hr.defined() ? at::matmul(h, w_hr.t()) : h; }
};

// The flat parameter list of nn.RNNBase (w_ih, w_hh[, b_ih, b_hh][, w_hr]
// per layer and direction) as CellParams.
std::vector<CellParams> gatherParams(TensorList params, bool has_biases,
                                     bool has_projections = false) {
  const size_t stride = (has_biases ? 4 : 2) + (has_projections ? 1 : 0);
  TORCH_CHECK(params.size() % stride == 0, "got an incorrect number of RNN parameters");
  std::vector<CellParams> result;
  for (size_t i = 0; i < params.size(); i += stride) {
    CellParams p{params[i], params[i + 1], {}, {}, {}};
    if (has_biases) {
      p.b_ih = params[i + 2];
      p.b_hh = params[i + 3];
    }
    if (has_projections) p.w_hr = params[i + stride - 1];
    result.push_back(std::move(p));
  }
  return result;
}

// ---------------------------------------------------------------------------
// Hidden state: one tensor (RNN, GRU) or (h, c) (LSTM). The layers slice and
// concatenate it along the batch when packed sequences end.

using LstmHidden = std::tuple<Tensor, Tensor>;

Tensor hiddenOutput(const Tensor& h) { return h; }
Tensor hiddenOutput(const LstmHidden& h) { return std::get<0>(h); }

Tensor hiddenSlice(const Tensor& h, int64_t start, int64_t end) {
  return h.narrow(0, start, end - start);
}
LstmHidden hiddenSlice(const LstmHidden& h, int64_t start, int64_t end) {
  return {hiddenSlice(std::get<0>(h), start, end), hiddenSlice(std::get<1>(h), start, end)};
}

Tensor hiddenConcat(const std::vector<Tensor>& hs) { return at::cat(hs, 0); }
LstmHidden hiddenConcat(const std::vector<LstmHidden>& hs) {
  std::vector<Tensor> h, c;
  for (const auto& [hi, ci] : hs) {
    h.push_back(hi);
    c.push_back(ci);
  }
  return {at::cat(h, 0), at::cat(c, 0)};
}

// ---------------------------------------------------------------------------
// Cells: one time step. With `projected`, x already holds the step's input
// gates (linearIh of the whole sequence, computed by the layer). The
// in-place ops and chunking are CPU's: they decide which tensors autograd
// saves, hence the backward formulas.

struct Tanh {
  Tensor operator()(const Tensor& t) const { return at::tanh(t); }
};
struct Relu {
  Tensor operator()(const Tensor& t) const { return at::relu(t); }
};

template <typename Nonlinearity>
struct SimpleCell {
  using Hidden = Tensor;
  Tensor operator()(const Tensor& x, const Tensor& h, const CellParams& p, bool projected) const {
    Tensor gates = p.linearHh(h);
    gates.add_(projected ? x : p.linearIh(x));
    return Nonlinearity{}(gates);
  }
};

struct LstmCell {
  using Hidden = LstmHidden;
  Hidden operator()(const Tensor& x, const Hidden& hidden, const CellParams& p,
                    bool projected) const {
    const auto& [hx, cx] = hidden;
    Tensor gates = p.linearHh(hx);
    gates.add_(projected ? x : p.linearIh(x));
    auto chunks = gates.unsafe_chunk(4, 1);
    Tensor ingate = chunks[0].sigmoid_();
    Tensor forgetgate = chunks[1].sigmoid_();
    Tensor cellgate = chunks[2].tanh_();
    Tensor outgate = chunks[3].sigmoid_();
    Tensor cy = forgetgate * cx;
    cy.add_(ingate * cellgate);
    Tensor hy = p.project(outgate * cy.tanh());
    return {std::move(hy), std::move(cy)};
  }
};

struct GruCell {
  using Hidden = Tensor;
  Tensor operator()(const Tensor& x, const Tensor& h, const CellParams& p, bool projected) const {
    auto igates = (projected ? x : p.linearIh(x)).unsafe_chunk(3, 1);
    auto hgates = p.linearHh(h).unsafe_chunk(3, 1);
    Tensor reset = hgates[0].add_(igates[0]).sigmoid_();
    Tensor update = hgates[1].add_(igates[1]).sigmoid_();
    Tensor candidate = igates[2].add(hgates[2].mul_(reset)).tanh_();
    return (h - candidate).mul_(update).add_(candidate);
  }
};

// ---------------------------------------------------------------------------
// Layers: a cell over a whole sequence, dense ([T, B, *]) or packed.

struct Packed {
  Tensor data;
  Tensor batch_sizes;  // CPU int64, one entry per time step, non-increasing
};

template <typename Cell>
struct Layers {
  using Hidden = typename Cell::Hidden;
  template <typename IO>
  using Result = std::pair<IO, Hidden>;
  template <typename IO>
  using BidirResult = std::pair<IO, std::pair<Hidden, Hidden>>;

  Cell cell;

  // The cell over precomputed per-step input gates; one output per step.
  std::pair<std::vector<Tensor>, Hidden> steps(const std::vector<Tensor>& gates, Hidden hidden,
                                               const CellParams& p) const {
    std::vector<Tensor> outputs;
    for (const Tensor& g : gates) {
      hidden = cell(g, hidden, p, /*projected=*/true);
      outputs.push_back(hiddenOutput(hidden));
    }
    TORCH_CHECK(!outputs.empty(), "Expected sequence length to be larger than 0 in RNN");
    return {std::move(outputs), std::move(hidden)};
  }

  Result<Tensor> forward(const Tensor& input, const Hidden& hidden, const CellParams& p) const {
    auto [outputs, last] = steps(p.linearIh(input).unbind(0), hidden, p);
    return {at::stack(outputs, 0), std::move(last)};
  }

  BidirResult<Tensor> bidirectional(const Tensor& input, const Hidden& fw_hidden,
                                    const Hidden& bw_hidden, const CellParams& fw_p,
                                    const CellParams& bw_p) const {
    auto [fw_outputs, fw_last] = steps(fw_p.linearIh(input).unbind(0), fw_hidden, fw_p);
    Tensor fw_output = at::stack(fw_outputs, 0);
    std::vector<Tensor> bw_gates = bw_p.linearIh(input).unbind(0);
    std::reverse(bw_gates.begin(), bw_gates.end());
    auto [bw_outputs, bw_last] = steps(bw_gates, bw_hidden, bw_p);
    std::reverse(bw_outputs.begin(), bw_outputs.end());
    Tensor bw_output = at::stack(bw_outputs, 0);
    return {at::cat({fw_output, bw_output}, fw_output.dim() - 1),
            {std::move(fw_last), std::move(bw_last)}};
  }

  // Packed, forward in time: sequences end as the batch shrinks; their final
  // hidden states are set aside and concatenated (longest first) at the end.
  Result<Packed> forward(const Packed& input, const Hidden& hidden, const CellParams& p) const {
    const int64_t num_steps = input.batch_sizes.size(0);
    const int64_t* batch_sizes = input.batch_sizes.data_ptr<int64_t>();
    const Tensor gates = p.linearIh(input.data);
    std::vector<Tensor> outputs;
    std::vector<Hidden> finished;
    Hidden h = hidden;
    int64_t offset = 0;
    int64_t last_batch = batch_sizes[0];
    for (const auto i : c10::irange(num_steps)) {
      const int64_t batch = batch_sizes[i];
      Tensor step = gates.narrow(0, offset, batch);
      offset += batch;
      if (batch < last_batch) {
        finished.push_back(hiddenSlice(h, batch, last_batch));
        h = hiddenSlice(h, 0, batch);
      }
      last_batch = batch;
      h = cell(step, h, p, /*projected=*/true);
      outputs.push_back(hiddenOutput(h));
    }
    finished.push_back(h);
    std::reverse(finished.begin(), finished.end());
    return {{at::cat(outputs, 0), input.batch_sizes}, hiddenConcat(finished)};
  }

  // Packed, backward in time: starts with the shortest batch and grows the
  // hidden state from the initial one as longer sequences join.
  Result<Packed> backward(const Packed& input, const Hidden& hidden, const CellParams& p) const {
    const int64_t num_steps = input.batch_sizes.size(0);
    const int64_t* batch_sizes = input.batch_sizes.data_ptr<int64_t>();
    const Tensor gates = p.linearIh(input.data);
    std::vector<Tensor> outputs;
    int64_t offset = input.data.size(0);
    int64_t last_batch = batch_sizes[num_steps - 1];
    Hidden h = hiddenSlice(hidden, 0, last_batch);
    for (int64_t i = num_steps - 1; i >= 0; --i) {
      const int64_t batch = batch_sizes[i];
      if (batch > last_batch) h = hiddenConcat({h, hiddenSlice(hidden, last_batch, batch)});
      Tensor step = gates.narrow(0, offset - batch, batch);
      offset -= batch;
      last_batch = batch;
      h = cell(step, h, p, /*projected=*/true);
      outputs.push_back(hiddenOutput(h));
    }
    std::reverse(outputs.begin(), outputs.end());
    return {{at::cat(outputs, 0), input.batch_sizes}, std::move(h)};
  }

  BidirResult<Packed> bidirectional(const Packed& input, const Hidden& fw_hidden,
                                    const Hidden& bw_hidden, const CellParams& fw_p,
                                    const CellParams& bw_p) const {
    auto fw = forward(input, fw_hidden, fw_p);
    auto bw = backward(input, bw_hidden, bw_p);
    return {{at::cat({fw.first.data, bw.first.data}, -1), input.batch_sizes},
            {std::move(fw.second), std::move(bw.second)}};
  }
};

Tensor dropout(const Tensor& input, double p) { return at::dropout(input, p, /*train=*/true); }
Packed dropout(const Packed& input, double p) {
  return {at::dropout(input.data, p, /*train=*/true), input.batch_sizes};
}

// The layers stacked, dropout between them; returns the last layer's output
// and every layer's (and direction's) final hidden state.
template <typename Cell, typename IO>
std::pair<IO, std::vector<typename Cell::Hidden>> runStack(
    const IO& input, const std::vector<typename Cell::Hidden>& hiddens,
    const std::vector<CellParams>& params, int64_t num_layers, double dropout_p, bool train,
    bool bidirectional) {
  const size_t dirs = bidirectional ? 2 : 1;
  if (bidirectional) {
    TORCH_CHECK(params.size() % 2 == 0 && hiddens.size() % 2 == 0,
                "Odd number of params or hiddens given to a bidirectional RNN");
  }
  TORCH_CHECK(num_layers == static_cast<int64_t>(hiddens.size() / dirs),
              "Expected more hidden states in stacked_rnn");
  TORCH_CHECK(num_layers == static_cast<int64_t>(params.size() / dirs),
              "Expected more weights in stacked_rnn");
  Layers<Cell> layers;
  IO layer_input = input;
  std::vector<typename Cell::Hidden> finals;
  for (const auto l : c10::irange(num_layers)) {
    if (bidirectional) {
      auto [output, last] = layers.bidirectional(layer_input, hiddens[2 * l], hiddens[2 * l + 1],
                                                 params[2 * l], params[2 * l + 1]);
      finals.push_back(std::move(last.first));
      finals.push_back(std::move(last.second));
      layer_input = std::move(output);
    } else {
      auto [output, last] = layers.forward(layer_input, hiddens[l], params[l]);
      finals.push_back(std::move(last));
      layer_input = std::move(output);
    }
    if (dropout_p != 0 && train && l < num_layers - 1) layer_input = dropout(layer_input, dropout_p);
  }
  return {std::move(layer_input), std::move(finals)};
}

// ---------------------------------------------------------------------------
// RNN, GRU: one hidden tensor.

template <typename Cell>
std::tuple<Tensor, Tensor> oneHiddenRnn(const Tensor& input_, const Tensor& hx, TensorList params,
                                        bool has_biases, int64_t num_layers, double dropout_p,
                                        bool train, bool bidirectional, bool batch_first) {
  at::native::check_attributes(input_, params, hx);
  Tensor input = batch_first ? input_.transpose(0, 1) : input_;
  auto [output, finals] = runStack<Cell>(input, hx.unbind(0), gatherParams(params, has_biases),
                                         num_layers, dropout_p, train, bidirectional);
  Tensor hy = at::stack(finals, 0);
  if (batch_first) output.transpose_(0, 1);
  return {std::move(output), std::move(hy)};
}

template <typename Cell>
std::tuple<Tensor, Tensor> oneHiddenRnnPacked(const Tensor& data, const Tensor& batch_sizes,
                                              const Tensor& hx, TensorList params,
                                              bool has_biases, int64_t num_layers,
                                              double dropout_p, bool train, bool bidirectional) {
  TORCH_CHECK(batch_sizes.device().is_cpu() && batch_sizes.scalar_type() == at::kLong,
              "packed RNN expects batch_sizes as a CPU int64 tensor");
  auto [output, finals] =
      runStack<Cell>(Packed{data, batch_sizes}, hx.unbind(0), gatherParams(params, has_biases),
                     num_layers, dropout_p, train, bidirectional);
  return {std::move(output.data), at::stack(finals, 0)};
}

#define NEURON_ONE_HIDDEN_RNN(NAME, CELL)                                                       \
  std::tuple<Tensor, Tensor> NAME##_input(const Tensor& input, const Tensor& hx,                 \
                                          TensorList params, bool has_biases,                   \
                                          int64_t num_layers, double dropout_p, bool train,     \
                                          bool bidirectional, bool batch_first) {               \
    NEURON_RECORD_OP("aten::" #NAME ".input", Native);                                          \
    return oneHiddenRnn<CELL>(input, hx, params, has_biases, num_layers, dropout_p, train,      \
                              bidirectional, batch_first);                                      \
  }                                                                                             \
  std::tuple<Tensor, Tensor> NAME##_data(const Tensor& data, const Tensor& batch_sizes,         \
                                         const Tensor& hx, TensorList params, bool has_biases,  \
                                         int64_t num_layers, double dropout_p, bool train,      \
                                         bool bidirectional) {                                  \
    NEURON_RECORD_OP("aten::" #NAME ".data", Native);                                           \
    return oneHiddenRnnPacked<CELL>(data, batch_sizes, hx, params, has_biases, num_layers,      \
                                    dropout_p, train, bidirectional);                           \
  }

NEURON_ONE_HIDDEN_RNN(gru, GruCell)
NEURON_ONE_HIDDEN_RNN(rnn_tanh, SimpleCell<Tanh>)
NEURON_ONE_HIDDEN_RNN(rnn_relu, SimpleCell<Relu>)
#undef NEURON_ONE_HIDDEN_RNN

// ---------------------------------------------------------------------------
// LSTM: (h, c), optional projections, and CPU's oneDNN path for float32.

// Whether a CPU mkldnn op answering a yes/no question says yes (false if
// the op is absent from this build).
bool mkldnnSupports(const char* op_name) {
  auto op = c10::Dispatcher::singleton().findSchema({op_name, ""});
  return op.has_value() && op->typed<bool()>().call();
}

// ATen's use_mkldnn() for CPU tensors, asked of the neuron ones.
bool useMkldnn(const Tensor& input) {
  if (!at::globalContext().userEnabledMkldnn() || input.numel() == 0) return false;
  switch (input.scalar_type()) {
    case at::kFloat:
      return true;
    case at::kBFloat16:
      return mkldnnSupports("mkldnn::_is_mkldnn_bf16_supported");
    case at::kHalf:
      return !c10::GradMode::is_enabled() && mkldnnSupports("mkldnn::_is_mkldnn_fp16_supported");
    default:
      return false;
  }
}

bool onNeuron(TensorList tensors) {
  return std::all_of(tensors.begin(), tensors.end(), [](const Tensor& t) { return isNeuron(t); });
}

// ATen's mkldnn_rnn for LSTM (dense input only): one mkldnn_rnn_layer per
// layer and direction. The op runs its CPU (oneDNN) kernel on device memory
// and autograd records it as on CPU.
std::tuple<Tensor, Tensor, Tensor> lstmMkldnn(const Tensor& input_, TensorList hx,
                                              TensorList params, bool has_biases,
                                              int64_t num_layers, double dropout_p, bool train,
                                              bool bidirectional, bool batch_first) {
  constexpr int64_t kLstmMode = 2;  // ideep::rnn_kind::LSTM
  const Tensor input = (batch_first ? input_.transpose(0, 1) : input_).contiguous();
  const Tensor h0 = hx[0].contiguous();
  const Tensor c0 = hx[1].contiguous();
  const int64_t hidden_size = h0.size(2);
  const at::MatrixRef<Tensor> weights{params, static_cast<size_t>(has_biases ? 4 : 2)};
  const int64_t dirs = bidirectional ? 2 : 1;
  Tensor layer_input = input;
  std::vector<Tensor> hy(num_layers * dirs), cy(num_layers * dirs);
  for (const auto layer : c10::irange(num_layers)) {
    std::vector<Tensor> outputs(dirs);
    for (const auto dir : c10::irange(dirs)) {
      const int64_t index = layer * dirs + dir;
      const TensorList w = weights[index];
      TORCH_CHECK(w.size() == 2 || w.size() == 4);
      const Tensor& w_ih = w[0];
      const Tensor& w_hh = w[1];
      const Tensor layer_h0 = h0[index];
      const Tensor layer_c0 = c0[index];
      // Without biases the kernel makes its own zero bias; these only give it
      // tensor arguments (CPU creates them in this order too).
      Tensor b_hh = has_biases ? w[3] : at::zeros(w_hh.sizes(), w_hh.options());
      Tensor b_ih = has_biases ? w[2] : at::zeros(w_ih.sizes(), w_ih.options());
      auto result = at::mkldnn_rnn_layer(layer_input, w_ih, w_hh, b_ih, b_hh, layer_h0,
                                         layer_c0, /*reverse=*/dir > 0, /*batch_sizes=*/{},
                                         kLstmMode, hidden_size, num_layers, has_biases,
                                         bidirectional, batch_first, train);
      outputs[dir] = std::get<0>(result);
      hy[index] = std::get<1>(result);
      cy[index] = std::get<2>(result);
    }
    layer_input = dirs == 1 ? outputs[0] : at::cat(outputs, -1);
    if (dropout_p != 0 && train && layer < num_layers - 1) {
      layer_input = at::dropout(layer_input, dropout_p, /*train=*/true);
    }
  }
  Tensor output = batch_first ? layer_input.transpose(0, 1) : layer_input;
  return {std::move(output), at::stack(hy, 0), at::stack(cy, 0)};
}

template <typename IO>
std::pair<IO, std::pair<Tensor, Tensor>> lstmStack(const IO& input,
                                                   const std::vector<CellParams>& params,
                                                   const Tensor& hx, const Tensor& cx,
                                                   int64_t num_layers, double dropout_p,
                                                   bool train, bool bidirectional) {
  std::vector<Tensor> layer_hx = hx.unbind(0);
  std::vector<Tensor> layer_cx = cx.unbind(0);
  std::vector<LstmHidden> hiddens;
  for (const auto i : c10::irange(layer_hx.size())) hiddens.emplace_back(layer_hx[i], layer_cx[i]);
  auto [output, finals] =
      runStack<LstmCell>(input, hiddens, params, num_layers, dropout_p, train, bidirectional);
  std::vector<Tensor> hy, cy;
  for (auto& [h, c] : finals) {
    hy.push_back(std::move(h));
    cy.push_back(std::move(c));
  }
  return {std::move(output), {at::stack(hy, 0), at::stack(cy, 0)}};
}

std::tuple<Tensor, Tensor, Tensor> lstm_input(const Tensor& input_, TensorList hx,
                                              TensorList params, bool has_biases,
                                              int64_t num_layers, double dropout_p, bool train,
                                              bool bidirectional, bool batch_first) {
  NEURON_RECORD_OP("aten::lstm.input", Native);
  TORCH_CHECK(hx.size() == 2, "lstm expects two hidden states");
  // Cells of different size mean projections.
  const bool has_projections = hx[0].sym_size(2) != hx[1].sym_size(2);
  if (useMkldnn(input_) && onNeuron(params) && onNeuron(hx)) {
    if (!has_projections) {
      return lstmMkldnn(input_, hx, params, has_biases, num_layers, dropout_p, train,
                        bidirectional, batch_first);
    }
    TORCH_WARN_ONCE(
        "LSTM with projections is not supported with oneDNN. Using default implementation.");
  }
  at::native::check_attributes(input_, params, hx);
  Tensor input = batch_first ? input_.transpose(0, 1) : input_;
  auto [output, last] =
      lstmStack(input, gatherParams(params, has_biases, has_projections), hx[0], hx[1],
                num_layers, dropout_p, train, bidirectional);
  if (batch_first) output = output.transpose(0, 1);
  return {std::move(output), std::move(last.first), std::move(last.second)};
}

std::tuple<Tensor, Tensor, Tensor> lstm_data(const Tensor& data, const Tensor& batch_sizes,
                                             TensorList hx, TensorList params, bool has_biases,
                                             int64_t num_layers, double dropout_p, bool train,
                                             bool bidirectional) {
  NEURON_RECORD_OP("aten::lstm.data", Native);
  TORCH_CHECK(hx.size() == 2, "lstm expects two hidden states");
  TORCH_CHECK(batch_sizes.device().is_cpu() && batch_sizes.scalar_type() == at::kLong,
              "packed RNN expects batch_sizes as a CPU int64 tensor");
  const bool has_projections = hx[0].size(2) != hx[1].size(2);
  auto [output, last] =
      lstmStack(Packed{data, batch_sizes}, gatherParams(params, has_biases, has_projections),
                hx[0], hx[1], num_layers, dropout_p, train, bidirectional);
  return {std::move(output.data), std::move(last.first), std::move(last.second)};
}

// ---------------------------------------------------------------------------
// Single cells (nn.RNNCell, nn.LSTMCell, nn.GRUCell): the checks ATen makes,
// then one step with the input projected inside the cell.

void checkCellInput(const Tensor& input, const c10::SymInt& input_size) {
  TORCH_CHECK(input.sym_size(1) == input_size, "input has inconsistent input_size: got ",
              input.sym_size(1), " expected ", input_size);
}

void checkCellHidden(const Tensor& input, const Tensor& hx, const c10::SymInt& hidden_size,
                     const c10::SymInt& hidden_label) {
  TORCH_CHECK(input.sym_size(0) == hx.sym_size(0), "Input batch size ", input.sym_size(0),
              " doesn't match hidden", hidden_label, " batch size ", hx.sym_size(0));
  TORCH_CHECK(hx.sym_size(1) == hidden_size, "hidden", hidden_label,
              " has inconsistent hidden_size: got ", hx.sym_size(1), ", expected ", hidden_size);
}

void checkCellWeights(const Tensor& w_ih, const Tensor& w_hh, const c10::SymInt& hidden_size,
                      int64_t gate_count) {
  TORCH_CHECK(w_ih.size(0) == gate_count * hidden_size, "weight_ih first dim must be ", gate_count,
              " * hidden_size = ", gate_count * hidden_size, ", but got ", w_ih.size(0));
  TORCH_CHECK(w_hh.size(0) == gate_count * hidden_size, "weight_hh first dim must be ", gate_count,
              " * hidden_size = ", gate_count * hidden_size, ", but got ", w_hh.size(0));
}

CellParams cellParams(const Tensor& w_ih, const Tensor& w_hh, const std::optional<Tensor>& b_ih,
                      const std::optional<Tensor>& b_hh) {
  return {w_ih, w_hh, b_ih.value_or(Tensor()), b_hh.value_or(Tensor()), Tensor()};
}

std::tuple<Tensor, Tensor> lstm_cell(const Tensor& input, TensorList hx, const Tensor& w_ih,
                                     const Tensor& w_hh, const std::optional<Tensor>& b_ih,
                                     const std::optional<Tensor>& b_hh) {
  NEURON_RECORD_OP("aten::lstm_cell", Native);
  TORCH_CHECK(hx.size() == 2, "lstm_cell expects two hidden states");
  const c10::SymInt hidden_size = w_hh.sym_size(1);
  checkCellInput(input, w_ih.sym_size(1));
  checkCellWeights(w_ih, w_hh, hidden_size, 4);
  checkCellHidden(input, hx[0], hidden_size, 0);
  checkCellHidden(input, hx[1], hidden_size, 1);
  return LstmCell{}(input, {hx[0], hx[1]}, cellParams(w_ih, w_hh, b_ih, b_hh), false);
}

Tensor gru_cell(const Tensor& input, const Tensor& hx, const Tensor& w_ih, const Tensor& w_hh,
                const std::optional<Tensor>& b_ih, const std::optional<Tensor>& b_hh) {
  NEURON_RECORD_OP("aten::gru_cell", Native);
  checkCellInput(input, w_ih.sym_size(1));
  checkCellHidden(input, hx, w_hh.sym_size(1), 0);
  checkCellWeights(w_ih, w_hh, w_hh.sym_size(1), 3);
  return GruCell{}(input, hx, cellParams(w_ih, w_hh, b_ih, b_hh), false);
}

template <typename Nonlinearity>
Tensor simpleCell(const Tensor& input, const Tensor& hx, const Tensor& w_ih, const Tensor& w_hh,
                  const std::optional<Tensor>& b_ih, const std::optional<Tensor>& b_hh) {
  checkCellWeights(w_ih, w_hh, w_hh.sym_size(1), 1);
  checkCellInput(input, w_ih.sym_size(1));
  checkCellHidden(input, hx, w_hh.sym_size(1), 0);
  return SimpleCell<Nonlinearity>{}(input, hx, cellParams(w_ih, w_hh, b_ih, b_hh), false);
}

Tensor rnn_tanh_cell(const Tensor& input, const Tensor& hx, const Tensor& w_ih,
                     const Tensor& w_hh, const std::optional<Tensor>& b_ih,
                     const std::optional<Tensor>& b_hh) {
  NEURON_RECORD_OP("aten::rnn_tanh_cell", Native);
  return simpleCell<Tanh>(input, hx, w_ih, w_hh, b_ih, b_hh);
}

Tensor rnn_relu_cell(const Tensor& input, const Tensor& hx, const Tensor& w_ih,
                     const Tensor& w_hh, const std::optional<Tensor>& b_ih,
                     const std::optional<Tensor>& b_hh) {
  NEURON_RECORD_OP("aten::rnn_relu_cell", Native);
  return simpleCell<Relu>(input, hx, w_ih, w_hh, b_ih, b_hh);
}

void registerRnnKernels(torch::Library& m) {
  m.impl("lstm.input", TORCH_FN(lstm_input));
  m.impl("lstm.data", TORCH_FN(lstm_data));
  m.impl("gru.input", TORCH_FN(gru_input));
  m.impl("gru.data", TORCH_FN(gru_data));
  m.impl("rnn_tanh.input", TORCH_FN(rnn_tanh_input));
  m.impl("rnn_tanh.data", TORCH_FN(rnn_tanh_data));
  m.impl("rnn_relu.input", TORCH_FN(rnn_relu_input));
  m.impl("rnn_relu.data", TORCH_FN(rnn_relu_data));
  m.impl("lstm_cell", TORCH_FN(lstm_cell));
  m.impl("gru_cell", TORCH_FN(gru_cell));
  m.impl("rnn_tanh_cell", TORCH_FN(rnn_tanh_cell));
  m.impl("rnn_relu_cell", TORCH_FN(rnn_relu_cell));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { registerRnnKernels(m); }
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { registerRnnKernels(m); }

}  // namespace torchneuron
