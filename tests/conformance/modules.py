"""ModuleInfo conformance: every module in PyTorch's own module_db, run on
`neuron` and on CPU with the same parameters and inputs, compared.

    python tests/conformance/modules.py                              # everything
    python tests/conformance/modules.py --names nn.Linear,nn.Conv2d  # some modules
    python tests/conformance/modules.py --dtypes float32 --max-samples 4 --report out.json
    python tests/conformance/modules.py --shard 1/2 --report m1.json   # half the modules
    python tests/conformance/modules.py --merge 'm*.json' --report modules.json

For each module, each dtype its ModuleInfo lists (module_info.dtypes) and each
mode (train, eval), every ModuleInput from its module_inputs_func is run:

- the module is built on CPU after torch.manual_seed (lazy modules are
  materialised by one no-grad CPU forward), converted to the dtype and put in
  the mode; its neuron twin is copy.deepcopy(module).to('neuron') (tensors a
  module keeps outside its parameters and buffers, such as
  FractionalMaxPool's _random_samples, are moved too), so both have the same
  parameters and buffers;
- the inputs are made once on CPU and copied to neuron as fresh leaves with
  the same requires_grad;
- `forward_<mode>`: the outputs, and then every buffer (BatchNorm's running
  stats), must equal CPU's as harness.compare has it (dtype, shape, strides
  of dimensions of length > 1, every element's bits: -0.0 is not +0.0, NaNs
  equal);
- `backward_<mode>`: a grad_output drawn on CPU from a seeded generator for
  each differentiable output, torch.autograd.backward on both, then every
  input's .grad and every parameter's .grad must be bitwise equal;
- `forward_inference`: the eval-mode forward under torch.inference_mode() on
  detached inputs (the fast paths PyTorch takes only without autograd, e.g.
  MultiheadAttention's fused kernel), bitwise.

A sample that raises on CPU must raise the same exception type with the same
message on neuron (harness.compare_errors). A check passes when at least one
sample's results were compared, all equal; when every sample that ran raised
alike on both devices it is `both-raised`. Samples that draw random numbers
(dropout in train mode, ...) are skipped with a reason: the devices draw from
different generators. A check whose samples were all skipped is `skip` with
the reasons; nothing is dropped silently.

Modules run in worker processes (tests/conformance/harness.py): a crash or a
hang marks the module it was on as `crash` and the others still run. The
report is JSON, module x dtype x check, and the last line is the summary.
Known failures: modules_expected_failures.txt (`name dtype check  reason`).
"""
import argparse
import copy
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

EXPECTED = os.path.join(HERE, "modules_expected_failures.txt")
MODES = ("train", "eval")
CHECKS = tuple(f"{kind}_{mode}" for mode in MODES for kind in ("forward", "backward")) + (
    "forward_inference",)
SEED = 0


# ---------------------------------------------------------------------------
# Worker half: runs modules in this process.

def _random_reason(m, training):
    """Why m's forward draws random numbers (None when it does not)."""
    import torch.nn as nn
    for sub in m.modules():
        if isinstance(sub, (nn.FractionalMaxPool2d, nn.FractionalMaxPool3d)) \
                and getattr(sub, "_random_samples", None) is None:
            return "FractionalMaxPool without _random_samples"
        if not training:
            continue
        if isinstance(sub, nn.modules.dropout._DropoutNd) and sub.p > 0:
            return f"{type(sub).__name__}(p={sub.p}) in train mode"
        if isinstance(sub, nn.RReLU):
            return "RReLU in train mode"
        p = getattr(sub, "dropout", None)
        if isinstance(p, float) and p > 0 and not (isinstance(sub, nn.RNNBase) and sub.num_layers == 1):
            return f"{type(sub).__name__}(dropout={p}) in train mode"
    return None


def _is_lazy(m):
    import torch.nn as nn
    return any(nn.parameter.is_lazy(t) for t in [*m.parameters(), *m.buffers()])


def _move_plain_tensors(m, device):
    """Moves tensors a module keeps as plain attributes (not parameters or
    buffers, which .to() moves already)."""
    import torch
    for sub in m.modules():
        for k, v in list(vars(sub).items()):
            if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) \
                    and v.device.type != device:
                setattr(sub, k, v.to(device))


def _twin_inputs(args, kwargs):
    """(cpu, neuron) copies of a forward input: every tensor a fresh leaf with
    the requires_grad of the original; PackedSequences keep batch_sizes on CPU."""
    import torch
    from torch.nn.utils.rnn import PackedSequence
    from torch.utils._pytree import tree_map

    def leaf(t, device):
        return t.detach().to(device, copy=True).requires_grad_(t.requires_grad)

    def on(device, src):
        def f(x):
            if isinstance(x, PackedSequence):
                move = (lambda t: None if t is None else t.to(device))
                return x._replace(data=leaf(x.data, device), sorted_indices=move(x.sorted_indices),
                                  unsorted_indices=move(x.unsorted_indices))
            return leaf(x, device) if isinstance(x, torch.Tensor) else x
        return tree_map(f, src, is_leaf=lambda x: isinstance(x, PackedSequence))

    cpu = on("cpu", (args, kwargs))
    return cpu, on("neuron", cpu)


def _leaves(obj):
    """The flattened leaves and structure of a module's output (a
    PackedSequence as its fields, batch_sizes as a list: it stays on CPU)."""
    from torch.nn.utils.rnn import PackedSequence
    from torch.utils._pytree import tree_flatten, tree_map

    def norm(x):
        if isinstance(x, PackedSequence):
            return (x.data, x.batch_sizes.tolist(), x.sorted_indices, x.unsorted_indices)
        return x
    return tree_flatten(tree_map(norm, obj, is_leaf=lambda x: isinstance(x, PackedSequence)))


def _compare_tree(actual, expected, what):
    a, a_spec = _leaves(actual)
    e, e_spec = _leaves(expected)
    if a_spec != e_spec:
        return f"{what}: structure differs: {a_spec} vs {e_spec}"[:200]
    for i, (x, y) in enumerate(zip(a, e)):
        r = _compare_maybe_none(x, y)
        if r:
            return f"{what}[{i}]: {r}" if len(e) > 1 else f"{what}: {r}"
    return None


def _compare_maybe_none(actual, expected):
    if expected is None or actual is None:
        return None if actual is None and expected is None else \
            f"{'None' if actual is None else type(actual).__name__} vs " \
            f"{'None' if expected is None else type(expected).__name__}"
    return harness.compare(actual, expected)


def _compare_named(actual, expected, what, attr=None):
    """Compares two {name: tensor} dicts (of .grad when attr is 'grad')."""
    if list(actual) != list(expected):
        return f"{what} names differ: {sorted(set(actual) ^ set(expected))}"
    for name, e in expected.items():
        a = actual[name]
        if attr:
            a, e = getattr(a, attr), getattr(e, attr)
        r = _compare_maybe_none(a, e)
        if r:
            return f"{what} {name}: {r}"
    return None


def _call(fn):
    """(result, None) or (None, exception); neuron work is synchronised."""
    import torch
    try:
        out = fn()
        torch.neuron.synchronize()
        return out, None
    except Exception as e:  # noqa: BLE001 - the module's own errors are data here
        return None, e


def _inference(m, nm, cargs, ckwargs, nargs, nkwargs, desc, inf):
    """Eval forward under torch.inference_mode() on detached inputs: the
    fast paths PyTorch takes only without autograd (MultiheadAttention's
    _native_multi_head_attention, TransformerEncoderLayer's fused layer)."""
    import torch
    from torch.utils._pytree import tree_map

    def detach(x):
        return x.detach() if isinstance(x, torch.Tensor) else x
    with torch.inference_mode():
        expected, c_err = _call(lambda: m(*tree_map(detach, cargs), **tree_map(detach, ckwargs)))
        actual, n_err = _call(lambda: nm(*tree_map(detach, nargs), **tree_map(detach, nkwargs)))
    r = harness.compare_errors(n_err, c_err)
    if r:
        inf.fail(desc, r)
    elif c_err is not None:
        inf.both_raised(c_err)
    else:
        r = _compare_tree(actual, expected, "output")
        inf.fail(desc, r) if r else inf.ok()


def run_sample(info, mi, dtype, training, desc, fwd, bwd, inf=None):
    """Runs one ModuleInput on both devices; adds its outcome to fwd and bwd
    (and, in eval mode, to inf: the same forward under inference mode)."""
    import torch
    from torch.utils._pytree import tree_leaves

    if mi.forward_input is None:
        for c in (fwd, bwd):
            c.skip("no forward input")
        return
    try:
        torch.manual_seed(SEED)
        m = info.module_cls(*mi.constructor_input.args, **mi.constructor_input.kwargs)
        m.to(dtype)
        m.train(training)
    except Exception as e:  # noqa: BLE001
        for c in (fwd, bwd):
            c.skip(f"construction raises on CPU ({type(e).__name__})")
        return
    reason = _random_reason(m, training)
    if reason:
        for c in (fwd, bwd):
            c.skip(f"random ({reason}): the devices draw from different generators")
        return
    (cargs, ckwargs), (nargs, nkwargs) = _twin_inputs(mi.forward_input.args, mi.forward_input.kwargs)
    if _is_lazy(m):
        # Materialise on CPU (parameters drawn once), so the twin copies them.
        (largs, lkwargs), _ = _twin_inputs(cargs, ckwargs)
        try:
            with torch.no_grad():
                m(*largs, **lkwargs)
        except Exception:  # noqa: BLE001 - the compared forward below raises too
            pass
    try:
        nm = copy.deepcopy(m).to("neuron")
        _move_plain_tensors(nm, "neuron")
    except Exception as e:  # noqa: BLE001
        fwd.fail(desc, f"moving the module to neuron raised {harness.first_line(e)}")
        bwd.skip("the module did not move to neuron")
        return

    if inf is not None:
        _inference(m, nm, cargs, ckwargs, nargs, nkwargs, desc, inf)

    # Forward, then buffers.
    expected, c_err = _call(lambda: m(*cargs, **ckwargs))
    actual, n_err = _call(lambda: nm(*nargs, **nkwargs))
    r = harness.compare_errors(n_err, c_err)
    if r:
        fwd.fail(desc, r)
        bwd.skip("forward failed")
        return
    if c_err is not None:
        fwd.both_raised(c_err)
        bwd.skip("forward raises on both")
        return
    r = _compare_tree(actual, expected, "output") or _compare_named(
        dict(nm.named_buffers()), dict(m.named_buffers()), "buffer")
    if r:
        fwd.fail(desc, r)
    else:
        fwd.ok()

    # Backward: also after a forward that differs in values only (its
    # gradients are checked on their own), not after one that differs in
    # structure, shapes or dtypes.
    e_out = [t for t in _leaves(expected)[0] if isinstance(t, torch.Tensor)]
    a_out = [t for t in _leaves(actual)[0] if isinstance(t, torch.Tensor)]
    if [(t.shape, t.dtype) for t in a_out] != [(t.shape, t.dtype) for t in e_out]:
        bwd.skip("forward outputs differ in shape or dtype")
        return
    pairs = [(a, e) for a, e in zip(a_out, e_out) if e.requires_grad]
    if not pairs:
        bwd.skip("no differentiable output")
        return
    missing = [i for i, (a, _) in enumerate(pairs) if not a.requires_grad]
    if missing:
        bwd.fail(desc, f"differentiable output {missing[0]} does not require grad on neuron")
        return
    g = torch.Generator().manual_seed(SEED)
    c_grads = [torch.randn(e.shape, dtype=e.dtype, generator=g) for _, e in pairs]
    n_grads = [t.to("neuron") for t in c_grads]
    _, c_err = _call(lambda: torch.autograd.backward([e for _, e in pairs], c_grads))
    _, n_err = _call(lambda: torch.autograd.backward([a for a, _ in pairs], n_grads))
    r = harness.compare_errors(n_err, c_err)
    if r:
        bwd.fail(desc, r)
        return
    if c_err is not None:
        bwd.both_raised(c_err)
        return
    c_in = [t for t in tree_leaves((cargs, ckwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    n_in = [t for t in tree_leaves((nargs, nkwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    r = _compare_named({i: t for i, t in enumerate(n_in)}, {i: t for i, t in enumerate(c_in)},
                       "input grad", "grad") \
        or _compare_named(dict(nm.named_parameters()), dict(m.named_parameters()), "grad of", "grad")
    if r:
        bwd.fail(desc, r)
        return
    if all(t.grad is None for t in c_in) and all(p.grad is None for p in m.parameters()):
        bwd.skip("no gradient reached an input or a parameter (on either device)")
        return
    bwd.ok()


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def run_module(info, dtypes, max_samples):
    """Records for one ModuleInfo: dicts with op (the module), dtype, check,
    status, detail."""
    import torch
    records = []
    supported = sorted(info.dtypes, key=dtype_name)
    for dtype in supported:
        dname = dtype_name(dtype)
        if dtypes and dname not in dtypes:
            continue
        base = {"op": info.name, "dtype": dname}
        for mode in MODES:
            training = mode == "train"
            fwd, bwd = harness.Check(), harness.Check()
            inf = harness.Check() if not training else None
            try:
                torch.manual_seed(SEED)
                inputs = list(info.module_inputs_func(info, device="cpu", dtype=dtype,
                                                      requires_grad=True, training=training))
            except Exception as e:  # noqa: BLE001
                for c in (fwd, bwd):
                    c.skip(f"module_inputs_func raised on CPU: {harness.first_line(e)}")
                inputs = []
            if max_samples and len(inputs) > max_samples:
                for c in (fwd, bwd):
                    for _ in inputs[max_samples:]:
                        c.skip(f"beyond --max-samples {max_samples}")
                inputs = inputs[:max_samples]
            for i, mi in enumerate(inputs):
                desc = f"sample {i}" + (f" ({mi.desc})" if mi.desc else "")
                try:
                    run_sample(info, mi, dtype, training, desc, fwd, bwd, inf)
                except Exception as e:  # noqa: BLE001 - a harness gap, never a pass
                    fwd.fail(desc, f"harness error: {harness.first_line(e)}")
                    bwd.skip("harness error")
            records.append(fwd.record(base, f"forward_{mode}"))
            records.append(bwd.record(base, f"backward_{mode}"))
            if inf is not None:
                records.append(inf.record(base, "forward_inference"))
    return records


def worker(names, dtypes, max_samples, out_path):
    import warnings
    import torch  # noqa: F401
    import torchneuron  # noqa: F401
    from torch.testing._internal.common_modules import module_db
    warnings.filterwarnings("ignore")
    by_name = {m.name: m for m in module_db}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"no ModuleInfo named {unknown} in module_db")
    harness.worker_loop(names, lambda n: run_module(by_name[n], dtypes, max_samples), out_path)


# ---------------------------------------------------------------------------
# Parent half.

def all_module_names():
    code = ("from torch.testing._internal.common_modules import module_db\n"
            "print('\\n'.join(m.name for m in module_db))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [n for n in r.stdout.splitlines() if n.startswith("nn.")]


def run(names=None, dtypes=None, max_samples=0, chunk=40):
    """Runs the modules (module_db names; all when None) in workers; returns
    the records, crashes included."""
    names = names or all_module_names()
    worker_args = ["--max-samples", str(max_samples)]
    if dtypes:
        worker_args += ["--dtypes", ",".join(dtypes)]
    return harness.run_workers(__file__, names, worker_args, chunk=chunk)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--names", help="comma-separated module names, e.g. nn.Linear (default: all of module_db)")
    p.add_argument("--dtypes", help="comma-separated dtypes (default: each ModuleInfo's own)")
    p.add_argument("--max-samples", type=int, default=0, help="per (module, dtype, mode); 0: all")
    p.add_argument("--shard", help="i/n: run the i-th of n shards of the modules (1 <= i <= n)")
    p.add_argument("--merge", help="merge shard reports matching this glob instead of running")
    p.add_argument("--report", default=None, help="write the JSON report here")
    p.add_argument("--quiet", action="store_true", help="print the summary line only")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    names = args.names.split(",") if args.names else None
    dtypes = args.dtypes.split(",") if args.dtypes else None
    if args.worker:
        worker(names, dtypes, args.max_samples, args.out)
        return 0
    names = names or all_module_names()
    expected = harness.load_expected(EXPECTED)
    if args.merge:
        return harness.merge(harness.shard_paths(args.merge), names, expected, args.report)
    names = harness.shard(names, args.shard)
    records, wall = harness.timed(lambda: run(names, dtypes, args.max_samples))
    meta = {"names": names, "shard": args.shard or "1/1", "wall_s": round(wall, 1),
            "dtypes": dtypes, "max_samples": args.max_samples}
    print(f"modules: {len(names)} modules in {wall:.0f} s")
    return harness.report(records, expected, args.report, meta, args.quiet)


if __name__ == "__main__":
    sys.exit(main())
