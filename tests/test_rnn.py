"""Recurrent layers and cells on neuron against CPU, bit for bit: outputs,
final hidden states, and the gradients of the input, the initial state and
every parameter (nn.RNN/LSTM/GRU and nn.RNNCell/LSTMCell/GRUCell; dense and
packed sequences, bidirectional, stacked, projections, float32/float64)."""
import copy
import itertools

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import torchneuron

DTYPES = [torch.float32, torch.float64]
_INT = {torch.float32: torch.int32, torch.float64: torch.int64}


def assert_bitwise(neuron, cpu, what=""):
    assert neuron.device.type == "neuron", what
    got = neuron.detach().cpu()
    torch.testing.assert_close(got, cpu.detach(), rtol=0, atol=0, equal_nan=True, msg=what)
    # assert_close equates 0.0 and -0.0; the promise is CPU's bits
    assert torch.equal(got.view(_INT[got.dtype]), cpu.detach().view(_INT[got.dtype])), what


def _flatten(out):
    if isinstance(out, torch.nn.utils.rnn.PackedSequence):
        return [out.data]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten(o)]
    return [out]


def check_module(module, leaves, make_args=lambda *t: t, backward=True):
    """Runs module on CPU and a copy of it on neuron, on arguments built by
    make_args from the leaf tensors (moved to neuron for the copy); compares
    every output and, after backward with a random gradient for each output,
    the gradients of the leaves that require them and of every parameter."""
    nmodule = copy.deepcopy(module).to("neuron")
    nleaves = [t.detach().to("neuron").requires_grad_(t.requires_grad) for t in leaves]
    out = _flatten(module(*make_args(*leaves)))
    nout = _flatten(nmodule(*make_args(*nleaves)))
    assert len(out) == len(nout)
    for i, (n, c) in enumerate(zip(nout, out)):
        assert_bitwise(n, c, f"output {i}")
    if not backward:
        return
    grads = [torch.randn_like(o) for o in out]
    torch.autograd.backward(out, grads)
    torch.autograd.backward(nout, [g.to("neuron") for g in grads])
    for i, (n, c) in enumerate(zip(nleaves, leaves)):
        if c.requires_grad:
            assert_bitwise(n.grad, c.grad, f"grad of argument {i}")
    for (name, p), np_ in zip(module.named_parameters(), nmodule.parameters()):
        assert_bitwise(np_.grad, p.grad, f"grad of {name}")


LAYERS = {
    "rnn_tanh": lambda **kw: torch.nn.RNN(nonlinearity="tanh", **kw),
    "rnn_relu": lambda **kw: torch.nn.RNN(nonlinearity="relu", **kw),
    "lstm": torch.nn.LSTM,
    "gru": torch.nn.GRU,
}


def _layer(kind, dtype, **kw):
    torch.manual_seed(0)
    return LAYERS[kind](input_size=4, hidden_size=6, **kw).to(dtype)


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bidirectional,batch_first,bias",
                         list(itertools.product([False, True], repeat=3)))
def test_layers(kind, dtype, bidirectional, batch_first, bias):
    m = _layer(kind, dtype, num_layers=2, bidirectional=bidirectional,
               batch_first=batch_first, bias=bias)
    x = torch.randn((3, 5, 4) if batch_first else (5, 3, 4), dtype=dtype, requires_grad=True)
    check_module(m, [x])


def _state(kind, shape, dtype):
    """Initial state tensors, and how the module takes them."""
    h = torch.randn(shape, dtype=dtype, requires_grad=True)
    if kind != "lstm":
        return [h], lambda x, h: (x, h)
    return [h, torch.randn(shape, dtype=dtype, requires_grad=True)], lambda x, h, c: (x, (h, c))


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layers_with_initial_state(kind, dtype):
    m = _layer(kind, dtype, num_layers=2, bidirectional=True)
    state, make_args = _state(kind, (4, 3, 6), dtype)
    check_module(m, [torch.randn(5, 3, 4, dtype=dtype, requires_grad=True)] + state, make_args)


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layers_eval_and_unbatched(kind, dtype):
    m = _layer(kind, dtype, num_layers=2).eval()
    check_module(m, [torch.randn(5, 4, dtype=dtype, requires_grad=True)])


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layers_inference_mode(kind, dtype):
    # autograd keys are skipped: the PrivateUse1 registration must answer
    m = _layer(kind, dtype, num_layers=2, bidirectional=True).eval()
    x = torch.randn(5, 3, 4, dtype=dtype)
    torchneuron.clear_op_tracking()
    with torch.inference_mode():
        check_module(m, [x], backward=False)
    assert f"aten::{m.mode.lower()}.input" in torchneuron.get_executed_ops()  # ours ran
    with torch.no_grad():
        check_module(m, [x], backward=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bidirectional,batch_first,bias",
                         list(itertools.product([False, True], repeat=3)))
def test_lstm_projections(dtype, bidirectional, batch_first, bias):
    m = _layer("lstm", dtype, num_layers=2, proj_size=3, bidirectional=bidirectional,
               batch_first=batch_first, bias=bias)
    x = torch.randn((3, 5, 4) if batch_first else (5, 3, 4), dtype=dtype, requires_grad=True)
    check_module(m, [x])


@pytest.mark.parametrize("kind", list(LAYERS) + ["lstm_proj"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_sequences(kind, dtype, bidirectional):
    kw = {"proj_size": 3} if kind == "lstm_proj" else {}
    m = _layer(kind.removesuffix("_proj"), dtype, num_layers=2, bidirectional=bidirectional,
               batch_first=True, **kw)
    lengths = torch.tensor([3, 5, 1, 5])  # unsorted, repeated: hidden states split and rejoin
    x = torch.randn(4, 5, 4, dtype=dtype, requires_grad=True)
    check_module(m, [x], lambda x: (
        pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False),))


@pytest.mark.parametrize("kind", LAYERS)
def test_larger_layers(kind):
    # sizes where kernels block and vectorize differently, and the async path runs
    torch.manual_seed(0)
    m = LAYERS[kind](input_size=96, hidden_size=128, num_layers=2, bidirectional=True)
    check_module(m, [torch.randn(7, 16, 96, requires_grad=True)])


CELLS = {
    "rnn_tanh": lambda **kw: torch.nn.RNNCell(nonlinearity="tanh", **kw),
    "rnn_relu": lambda **kw: torch.nn.RNNCell(nonlinearity="relu", **kw),
    "lstm": torch.nn.LSTMCell,
    "gru": torch.nn.GRUCell,
}


def _cell(kind, dtype, bias=True):
    torch.manual_seed(0)
    return CELLS[kind](input_size=5, hidden_size=10, bias=bias).to(dtype)


@pytest.mark.parametrize("kind", CELLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batched", [True, False])
def test_cells(kind, dtype, bias, batched):
    m = _cell(kind, dtype, bias)
    shape = (3, 5) if batched else (5,)
    check_module(m, [torch.randn(shape, dtype=dtype, requires_grad=True)])


@pytest.mark.parametrize("kind", CELLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cells_with_state_eval(kind, dtype):
    m = _cell(kind, dtype).eval()
    state, make_args = _state(kind, (3, 10), dtype)
    check_module(m, [torch.randn(3, 5, dtype=dtype, requires_grad=True)] + state, make_args)


class _Unrolled(torch.nn.Module):
    """A cell stepped over a sequence by hand, as decoders do."""

    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def forward(self, xs):
        state, outs = None, []
        for x in xs.unbind(0):
            state = self.cell(x, state)
            outs.append(state[0] if isinstance(state, tuple) else state)
        return torch.stack(outs)


@pytest.mark.parametrize("kind", CELLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cells_unrolled(kind, dtype):
    xs = torch.randn(4, 3, 5, dtype=dtype, requires_grad=True)
    check_module(_Unrolled(_cell(kind, dtype)), [xs])


def _error(fn, *args):
    with pytest.raises(RuntimeError) as info:
        fn(*args)
    return str(info.value)


def _on_neuron(arg):
    if isinstance(arg, torch.Tensor):
        return arg.to("neuron")
    if isinstance(arg, (tuple, list)):
        return type(arg)(_on_neuron(a) for a in arg)
    return arg


def test_errors_match_cpu():
    x, h = torch.randn(3, 5), torch.randn(3, 10)
    w_ih, w_hh = torch.randn(30, 4), torch.randn(30, 10)
    lstm_w = [torch.randn(40, 5), torch.randn(40, 10)]
    cases = [
        (torch.gru_cell, (x, h, w_ih, w_hh)),  # input size
        (torch.gru_cell, (x, h[:2], torch.randn(30, 5), w_hh)),  # batch size
        (torch.rnn_tanh_cell, (x, h, torch.randn(10, 5), w_hh)),  # gate count
        (torch.lstm_cell, (x, (h,), torch.randn(40, 5), w_hh)),  # one state
        (torch.lstm, (torch.randn(0, 3, 5), (h[None], h[None]), lstm_w,
                      False, 1, 0.0, False, False, False)),  # empty sequence
        (torch.gru, (torch.randn(2, 3, 5), h[None], [w_ih, w_hh],
                     False, 2, 0.0, False, False, False)),  # too few layers of weights
    ]
    for fn, args in cases:
        assert _error(fn, *_on_neuron(args)) == _error(fn, *args)


ROOTS = {"aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu",
         "aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell"}


def _recorded(module, x):
    """The ops the RNN op calls directly, and the backward nodes autograd runs."""
    with torch.profiler.profile() as prof:
        out = module(x)
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    events = prof.events()
    # cudnn_is_acceptable: ATen asks before its composition; we know the answer
    calls = [e.name for e in events if e.cpu_parent is not None
             and e.cpu_parent.name in ROOTS and e.name != "aten::cudnn_is_acceptable"]
    nodes = [e.name for e in events if e.name.startswith("autograd::engine::evaluate_function")]
    return calls, nodes


@pytest.mark.parametrize("make,dtype", [
    (lambda: torch.nn.LSTM(4, 6, 2, bidirectional=True), torch.float32),  # oneDNN
    (lambda: torch.nn.LSTM(4, 6, 2, bias=False), torch.float32),
    (lambda: torch.nn.LSTM(4, 6, 2, bidirectional=True, proj_size=2), torch.float32),
    (lambda: torch.nn.LSTM(4, 6, 2, bidirectional=True), torch.float64),
    (lambda: torch.nn.GRU(4, 6, 2, batch_first=True, bidirectional=True), torch.float32),
    (lambda: torch.nn.RNN(4, 6, batch_first=True), torch.float64),
    (lambda: torch.nn.LSTMCell(4, 6), torch.float32),
    (lambda: torch.nn.GRUCell(4, 6), torch.float32),
    (lambda: torch.nn.RNNCell(4, 6, nonlinearity="relu"), torch.float32),
], ids=["lstm_onednn", "lstm_nobias", "lstm_proj", "lstm_f64", "gru", "rnn", "lstm_cell",
        "gru_cell", "rnn_cell"])
def test_same_composition_as_cpu(make, dtype):
    # the same ATen ops, hence the same autograd graph: what makes gradients bitwise
    # (CPU projects all steps' inputs at once and never calls fused cells)
    m = make().to(dtype)
    x = torch.randn((3, 4) if isinstance(m, torch.nn.RNNCellBase) else (3, 5, 4), dtype=dtype,
                    requires_grad=True)
    calls, nodes = _recorded(m, x)
    ncalls, nnodes = _recorded(copy.deepcopy(m).to("neuron"),
                               x.detach().to("neuron").requires_grad_())
    assert ncalls == calls
    assert nnodes == nodes
    assert not any("fused" in n for n in nnodes)
