"""FlexAttention under torch.compile on neuron: forward and backward.

Inductor lowers FlexAttention's higher-order ops with a Triton template for
every device but CPU, and its CPU template has no backward. For neuron graphs
this post-grad pass (the device's own pass, ``register_backend_for_device``'s
``device_custom_pass``) replaces each ``flex_attention`` and
``flex_attention_backward`` node by the dense math of FlexAttention's eager
implementation (``sdpa_dense`` / ``sdpa_dense_backward``, score_mod and
mask_mod applied elementwise), traced into aten ops that Inductor then fuses
and compiles like any other part of the graph. The math is eager
FlexAttention's, so compiled results agree with eager ones to rounding.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._higher_order_ops.flex_attention import (
    flex_attention,
    flex_attention_backward,
    sdpa_dense,
    sdpa_dense_backward,
)
from torch._inductor.custom_graph_pass import CustomGraphModulePass

_DENSE = {flex_attention: sdpa_dense, flex_attention_backward: sdpa_dense_backward}


def _trace_dense(gm: fx.GraphModule, node: fx.Node) -> tuple[fx.GraphModule, list[fx.Node]]:
    """The node's dense math as a graph of aten ops, and the nodes it reads."""
    from torch._guards import detect_fake_mode
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    inputs = [i for i, a in enumerate(flat) if isinstance(a, fx.Node) and a.op != "get_attr"]
    fixed = [getattr(gm, a.target) if isinstance(a, fx.Node) and a.op == "get_attr" else a
             for a in flat]
    dense = _DENSE[node.target]

    def fn(*tensors: Any) -> Any:
        vals = list(fixed)
        for i, t in zip(inputs, tensors):
            vals[i] = t
        args, kwargs = pytree.tree_unflatten(vals, spec)
        return dense(*args, **kwargs)

    examples = [flat[i].meta["val"] for i in inputs]
    fake_mode = detect_fake_mode(examples)
    with fake_mode:
        traced = make_fx(fn, decomposition_table=select_decomp_table(),
                         tracing_mode="real")(*examples)
    return traced, [flat[i] for i in inputs]


def _replace_uses(node: fx.Node, value: Any) -> None:
    """Points the getitem users of a tuple-valued node at `value`'s parts."""
    for user in list(node.users):
        if user.op == "call_function" and user.target is operator.getitem:
            part = value[user.args[1]]
            if isinstance(part, (tuple, list)):
                _replace_uses(user, part)
            else:
                user.replace_all_uses_with(part)
            user.graph.erase_node(user)
        else:
            raise RuntimeError(f"torchneuron: unexpected use of {node}: {user.format_node()}")


class FlexAttentionToMath(CustomGraphModulePass):
    def __call__(self, gm: fx.GraphModule) -> None:
        nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _DENSE]
        for node in nodes:
            if not _on_neuron(node):
                continue
            traced, reads = _trace_dense(gm, node)
            _move_attributes(traced, gm)
            placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
            with gm.graph.inserting_before(node):
                out = gm.graph.graph_copy(traced.graph, dict(zip(placeholders, reads)))
            _replace_uses(node, out)
            gm.graph.erase_node(node)
        if nodes:
            gm.graph.eliminate_dead_code()
            gm.recompile()

    def uuid(self) -> Any:
        from . import config

        return ("torchneuron.flex_attention", config.codegen_version)


def _move_attributes(traced: fx.GraphModule, gm: fx.GraphModule) -> None:
    """Tensors the trace made constants of (get_attr) move to gm, under new names."""
    for n in traced.graph.nodes:
        if n.op != "get_attr":
            continue
        i = 0
        while hasattr(gm, f"_flex_dense_{n.target}_{i}"):
            i += 1
        name = f"_flex_dense_{n.target}_{i}"
        value = getattr(traced, n.target)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            gm.register_buffer(name, value)
        else:
            setattr(gm, name, value)
        n.target = name


def _on_neuron(node: fx.Node) -> bool:
    q = node.args[0]
    val = q.meta.get("val") if isinstance(q, fx.Node) else None
    return isinstance(val, torch.Tensor) and val.device.type == "neuron"
