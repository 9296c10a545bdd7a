"""Model zoo parity: real torchvision and Hugging Face models on CPU and on neuron.

Each model is built on CPU with a fixed seed (``weights=None``; transformers
models from tiny configs built in code: nothing is downloaded) and deep-copied
to neuron. Both copies then run, from the same weights and on the same inputs:

- an eval-mode forward under ``torch.no_grad`` (BatchNorm on running stats);
- a train-mode forward, the loss, ``backward()`` and one ``AdamW`` step;

and we compare every output, the loss, every parameter's gradient, every
parameter and buffer (BatchNorm running statistics) before and after the step,
and AdamW's moments, all with ``rtol=0, atol=0``: neuron runs PyTorch's own CPU
kernels on device memory, so fp32 results must be bitwise those of CPU, and
every output must be on neuron. Dropout probabilities are 0 (the two devices
draw masks from different generators: CPU mt19937, neuron Philox), so train
mode is deterministic; BatchNorm in train mode (batch statistics, running-stat
updates) is deterministic and is tested in train mode.

AdamW is left to its defaults, as user code writes it: it picks the for-loop
implementation for CPU parameters and the foreach one for neuron parameters;
the two are the same arithmetic and give the same bits in this PyTorch.

Models are tiny (hidden 32, 2 layers, vocab 64, batch 2) so that the file runs
in well under two minutes on two busy cores; vit_b_16 keeps its real size (86M
parameters) but sees one batch of two 32x32 images (about 15 s).

The backend bugs the zoo found (tied weights lost by Module.to, silu/mish
backward decomposed, integer histc) are fixed; minimal tests at the end of the
file keep them fixed.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchneuron
from conftest import NEURON

import torchvision  # noqa: E402  (test dependencies: scripts/setup.sh installs them)
import transformers  # noqa: E402

EXACT = dict(rtol=0, atol=0)


# ----------------------------------------------------------------------------
# The harness
# ----------------------------------------------------------------------------

def _tensors(out):
    """The tensors of a model output (a tensor, a tuple, or a transformers ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):  # ModelOutput is an OrderedDict
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []  # None, a Cache object, ...


def _sharing(model):
    """Groups of parameter names that are one tensor (tied weights)."""
    groups = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return sorted(g for g in groups.values() if len(g) > 1)


def _to(inputs, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _assert_on_neuron_and_equal(dev, cpu, what):
    assert dev.device.type == "neuron", f"{what}: on {dev.device}, not on neuron"
    torch.testing.assert_close(dev.cpu(), cpu, **EXACT, msg=lambda m: f"{what}: {m}")


def _compare_outputs(dev_out, cpu_out, what):
    dev_ts, cpu_ts = _tensors(dev_out), _tensors(cpu_out)
    assert len(dev_ts) == len(cpu_ts) and cpu_ts, what
    for i, (d, c) in enumerate(zip(dev_ts, cpu_ts)):
        _assert_on_neuron_and_equal(d, c, f"{what}[{i}]")


def _compare_state(dev_model, cpu_model, what):
    for (name, d), (_, c) in zip(dev_model.named_parameters(), cpu_model.named_parameters(),
                                 strict=True):
        _assert_on_neuron_and_equal(d.detach(), c.detach(), f"{what}: parameter {name}")
    for (name, d), (_, c) in zip(dev_model.named_buffers(), cpu_model.named_buffers(),
                                 strict=True):
        _assert_on_neuron_and_equal(d, c, f"{what}: buffer {name}")


def _compare_grads(dev_model, cpu_model):
    """Every gradient on neuron and bitwise CPU's; a failure names all that differ
    (the first to differ in backward order is the last listed)."""
    n, differ, first_error = 0, [], None
    for (name, d), (_, c) in zip(dev_model.named_parameters(), cpu_model.named_parameters(),
                                 strict=True):
        assert (d.grad is None) == (c.grad is None), f"gradient of {name}: presence differs"
        if c.grad is None:
            continue
        n += 1
        try:
            _assert_on_neuron_and_equal(d.grad, c.grad, f"gradient of {name}")
        except AssertionError as e:
            differ.append(name)
            first_error = first_error or e
    assert n > 0, "no parameter received a gradient"
    if differ:
        raise AssertionError(f"{len(differ)} of {n} gradients differ: {differ}") from first_error


def _report_paths(what):
    """Prints (does not assert) which ops took the synchronous generic path.

    The first call of an op with new argument metadata runs synchronously while
    the async path checks its Meta kernel against CPU, so in a one-step run most
    ops appear once; the ops never queued asynchronously are the interesting ones.
    """
    paths = torchneuron.get_op_paths()
    never_async = sorted(op for op, r in paths.items() if r["fallback"] and not r["async"])
    print(f"{what}: synchronous path: {torchneuron.get_fallback_ops()}")
    print(f"{what}: never queued asynchronously: {never_async}")


def check_model(make_model, inputs, loss_fn):
    """Eval forward; train forward, loss, backward, one AdamW step: neuron == CPU, bitwise.

    make_model() builds the model on CPU (seeded here); inputs is a dict of CPU
    keyword arguments; loss_fn(output) returns the scalar loss.
    """
    torch.manual_seed(0)
    cpu_model = make_model()
    dev_model = copy.deepcopy(cpu_model).to(NEURON)
    assert _sharing(dev_model) == _sharing(cpu_model), "parameter sharing differs"
    dev_inputs = _to(inputs, NEURON)
    torchneuron.clear_op_tracking()

    cpu_model.eval()
    dev_model.eval()
    with torch.no_grad():
        cpu_out = cpu_model(**inputs)
        dev_out = dev_model(**dev_inputs)
    _compare_outputs(dev_out, cpu_out, "eval output")

    cpu_model.train()
    dev_model.train()
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    dev_opt = torch.optim.AdamW(dev_model.parameters(), lr=1e-2)
    cpu_out = cpu_model(**inputs)
    dev_out = dev_model(**dev_inputs)
    _compare_outputs(dev_out, cpu_out, "train output")
    cpu_loss = loss_fn(cpu_out)
    dev_loss = loss_fn(dev_out)
    _assert_on_neuron_and_equal(dev_loss.detach(), cpu_loss.detach(), "loss")
    cpu_loss.backward()
    dev_loss.backward()
    _compare_grads(dev_model, cpu_model)
    _compare_state(dev_model, cpu_model, "after the forward")  # BN running stats
    cpu_opt.step()
    dev_opt.step()
    _compare_state(dev_model, cpu_model, "after the AdamW step")
    for (name, d), (_, c) in zip(dev_model.named_parameters(), cpu_model.named_parameters()):
        if c.grad is not None:
            for key in ("exp_avg", "exp_avg_sq"):  # ("step" is a host tensor on both)
                _assert_on_neuron_and_equal(dev_opt.state[d][key], cpu_opt.state[c][key],
                                            f"AdamW {key} of {name}")
    _report_paths(type(cpu_model).__name__)


# ----------------------------------------------------------------------------
# torchvision
# ----------------------------------------------------------------------------

def _image_batch(n=2, size=32, classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return {"x": x}, (lambda out: F.cross_entropy(out, y.to(out.device)))


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_torchvision_cnn(name):
    """Convolutions, BatchNorm in train and eval mode, pooling; hardswish and
    squeeze-excitation blocks in mobilenet (its classifier dropout set to 0)."""
    kwargs = {"dropout": 0.0} if name == "mobilenet_v3_small" else {}
    inputs, loss_fn = _image_batch()
    check_model(lambda: getattr(torchvision.models, name)(weights=None, num_classes=10, **kwargs),
                inputs, loss_fn)


def test_torchvision_vit_b_16():
    """The full-size ViT-B/16 (86M parameters) on 32x32 images: 4 patches and the
    class token through 12 nn.MultiheadAttention encoder blocks (dropout 0 by default)."""
    inputs, loss_fn = _image_batch()
    check_model(lambda: torchvision.models.vit_b_16(weights=None, image_size=32, num_classes=10),
                inputs, loss_fn)


# ----------------------------------------------------------------------------
# Hugging Face transformers (tiny configs, built offline)
# ----------------------------------------------------------------------------

VOCAB = 64


def _tokens(n=2, length=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n, length), generator=g)


def _llama_config(**kw):
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2, **kw)


def _gpt2_config(**kw):
    return transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, **kw)


def _causal_lm_inputs():
    ids = _tokens()
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding on the second row
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}


def _hf_loss(out):
    return out.loss


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_llama(attn):
    """RMSNorm, rotary embeddings, grouped-query attention (SDPA and eager), SwiGLU MLP."""
    config = _llama_config(attn_implementation=attn)
    check_model(lambda: transformers.LlamaForCausalLM(config), _causal_lm_inputs(), _hf_loss)


def test_gpt2():
    """Conv1D projections, learned positions, tanh GELU, tied input/output embeddings."""
    config = _gpt2_config()
    check_model(lambda: transformers.GPT2LMHeadModel(config), _causal_lm_inputs(), _hf_loss)


def test_bert():
    """Bidirectional encoder with a padding mask, token types, masked-LM head (tied)."""
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=0)
    ids = _tokens()
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0  # right padding on the second row
    labels = torch.full_like(ids, -100)
    labels[:, 2:5] = ids[:, 2:5]
    inputs = {"input_ids": ids, "attention_mask": mask,
              "token_type_ids": (torch.arange(12) >= 6).long().expand(2, 12), "labels": labels}
    check_model(lambda: transformers.BertForMaskedLM(config), inputs, _hf_loss)


def test_t5():
    """Encoder-decoder, relative position buckets, cross-attention, T5 RMS layer norm,
    one embedding shared by encoder, decoder and LM head."""
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, relative_attention_num_buckets=8, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    inputs = {"input_ids": _tokens(seed=1), "attention_mask": torch.ones(2, 12, dtype=torch.long),
              "labels": _tokens(length=7, seed=2)}
    check_model(lambda: transformers.T5ForConditionalGeneration(config), inputs, _hf_loss)


@pytest.mark.parametrize("experts", [
    "grouped_mm",
    "eager",
])
def test_mixtral_moe(experts):
    """Sparse mixture of experts (4 experts, top 2): router softmax/top-k, token dispatch,
    SwiGLU experts, load-balancing aux loss. ``grouped_mm`` is transformers' default
    experts implementation (sort, histc, torch._grouped_mm); ``eager`` loops over the
    experts (one_hot, nonzero, index_add_)."""
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
        router_aux_loss_coef=0.02, attention_dropout=0.0, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, experts_implementation=experts)
    check_model(lambda: transformers.MixtralForCausalLM(config), _causal_lm_inputs(), _hf_loss)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_generate_greedy(arch):
    """generate() with greedy decoding and a KV cache, left-padded batch: the same
    tokens and the same per-step scores on neuron as on CPU."""
    torch.manual_seed(0)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(_llama_config())
    else:
        model = transformers.GPT2LMHeadModel(_gpt2_config())
    model.eval()
    dev_model = copy.deepcopy(model).to(NEURON)
    ids = _tokens(n=2, length=5)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None,
              return_dict_in_generate=True, output_scores=True)
    cpu = model.generate(input_ids=ids, attention_mask=mask, **kw)
    dev = dev_model.generate(input_ids=ids.to(NEURON), attention_mask=mask.to(NEURON), **kw)
    assert dev.sequences.shape == (2, 15)
    _assert_on_neuron_and_equal(dev.sequences, cpu.sequences, "generated tokens")
    assert len(dev.scores) == len(cpu.scores) == 10
    for d, c in zip(dev.scores, cpu.scores):
        _assert_on_neuron_and_equal(d, c, "generation scores")


# ----------------------------------------------------------------------------
# Minimal tests for the backend bugs the zoo found (fixed; kept as regressions)
# ----------------------------------------------------------------------------

def test_module_to_keeps_tied_parameters():
    """Tied weights (an LM head sharing the embedding) stay one parameter after .to(), as on CUDA."""
    model = nn.Module()
    model.emb = nn.Embedding(10, 4)
    model.head = nn.Linear(4, 10, bias=False)
    model.head.weight = model.emb.weight
    model = model.to(NEURON)
    assert model.head.weight.device.type == "neuron"
    assert model.head.weight is model.emb.weight, "the tie was lost"
    assert len(list(model.parameters())) == 1


@pytest.mark.parametrize("op", ["silu_backward", "mish_backward"])
def test_silu_and_mish_backward_match_cpu(op):
    """The backward of SiLU (Llama, Mixtral, ... MLPs) and Mish must be CPU's bits."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g)
    grad = torch.randn(1000, generator=g)
    f = getattr(torch.ops.aten, op)
    _assert_on_neuron_and_equal(f(grad.to(NEURON), x.to(NEURON)), f(grad, x), op)


def test_histc_integer_input():
    """torch.histc on integer tensors, as CUDA supports (CPU does not: compare with CPU's
    float histc, exact for these integers)."""
    x = torch.tensor([0, 1, 1, 3, 2, 1, 5], dtype=torch.int32)
    out = torch.histc(x.to(NEURON), bins=4, min=0, max=3)
    assert out.device.type == "neuron" and out.dtype == torch.int32
    torch.testing.assert_close(out.cpu(), torch.histc(x.float(), bins=4, min=0, max=3).int(),
                               **EXACT)
    # Defaults (min == max): the data's range, as for floating inputs.
    wide = torch.randint(-50, 50, (1000,))
    torch.testing.assert_close(torch.histc(wide.to(NEURON), bins=7).cpu(),
                               torch.histc(wide.double(), bins=7).long(), **EXACT)
    # Floating inputs are CPU's kernel, unchanged.
    f = torch.randn(500)
    torch.testing.assert_close(torch.histc(f.to(NEURON), bins=9).cpu(), torch.histc(f, bins=9),
                               **EXACT)
