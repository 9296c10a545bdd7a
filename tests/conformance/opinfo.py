"""OpInfo conformance: every op in PyTorch's own op_db, run on `neuron` and on
CPU with the same samples, compared.

    python tests/conformance/opinfo.py                  # everything, every sample
    python tests/conformance/opinfo.py --names add,mm   # some ops (and their variants)
    python tests/conformance/opinfo.py --checks forward,backward --dtypes float32
    python tests/conformance/opinfo.py --shard 2/4 --report s2.json   # a quarter of the ops
    python tests/conformance/opinfo.py --merge 's*.json' --report all.json

Checks per (op, dtype), each over every sample of the op (made on neuron, as
PyTorch's device tests do, and copied to CPU as the same views for the
reference; --max-samples n takes the first n):
  forward        the op's results equal CPU's (harness.compare: dtype, shape,
                 strides of dimensions of length > 1, and every element's bits)
  noncontiguous  the same with every tensor argument made non-contiguous
  out            the out= variant writes the result into the given tensors,
                 keeps their storage and returns them as CPU does
  inplace        the in-place variant
  backward       gradients of every differentiable input (floating and complex
                 dtypes) for the same seeded grad_outputs
A sample that raises on CPU must raise the same exception type with the same
message on neuron (harness.compare_errors). A check passes when at least one
sample's results were compared and all were equal; when every sample that ran
raised alike on both devices it is `both-raised`; when none ran, `skip` with
the reasons. Random ops (RANDOM_OPS, by exact name), samples that ask for
dropout, ops returning uninitialised memory and samples without a neuron
tensor or device are skipped with a reason. Workers, crash isolation, shards
and the report: harness.py. Expected failures: expected_failures.txt.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

EXPECTED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "expected_failures.txt")
# Ops whose values are not a function of their inputs, by exact OpInfo name
# (name.variant): random draws (the two devices use different generators:
# CPU mt19937, neuron Philox) and uninitialised memory. Every name must be in
# op_db (checked when the ops are listed).
RANDOM_OPS = frozenset({
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal",
    "normal.in_place", "normal.number_mean", "uniform", "rand_like", "randn", "randn_like",
    "randint", "randint_like", "svd_lowrank", "pca_lowrank",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.rrelu", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d",
})
UNINITIALISED_OPS = frozenset({"empty", "empty_like", "new_empty", "new_empty_strided",
                               "empty_strided", "empty_permuted"})
# Every dtype CPU has kernels for; an op runs those it supports on CPU.
DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128",
          "int8", "int16", "int32", "int64", "uint8", "bool")
CHECKS = ("forward", "noncontiguous", "out", "inplace", "backward")


# ---------------------------------------------------------------------------
# Worker half: runs ops in this process.

def _cpu_copy(x):
    """x copied to CPU as the same view of a copy of its storage (same storage
    offset and strides: as_strided and friends see the same memory; the same
    conjugate and negative bits: kernels take other routes for those)."""
    import torch
    if x.is_conj():
        return _cpu_copy(x.conj()).conj()
    if x.is_neg():
        return torch._neg_view(_cpu_copy(torch._neg_view(x)))
    if x.is_contiguous() and x.storage_offset() == 0 and \
            x.untyped_storage().nbytes() == x.numel() * x.element_size():
        return x.cpu()
    storage = x.untyped_storage().cpu()
    with torch.no_grad():
        c = torch.empty(0, dtype=x.dtype).set_(storage, x.storage_offset(), x.size(), x.stride())
    return c


def _cpu_twin(s, leaf=False):
    """The CPU twin of a sample made on neuron: neuron tensors copied to CPU
    (as leaves with the same requires_grad when leaf), CPU-only arguments (e.g.
    tensor_split's indices) left as they are, a device argument pointed at CPU."""
    import torch

    def f(x):
        if not isinstance(x, torch.Tensor) or x.device.type != "neuron":
            return x
        if x.layout != torch.strided:
            return x.cpu()
        c = _cpu_copy(x)
        return c.detach().requires_grad_(x.requires_grad) if leaf else c
    def device(v, named):
        if isinstance(v, torch.device) and v.type == "neuron":
            return torch.device("cpu")
        if isinstance(v, str) and v.startswith("neuron") and (named or v.split(":")[0] == "neuron"):
            return "cpu"
        return v
    c = s.transform(f)
    c.args = tuple(device(v, False) for v in c.args)
    c.kwargs = {k: device(v, k == "device") for k, v in c.kwargs.items()}
    return c


def _asks_for_cpu(s):
    """Whether a sample asks for a CPU result (to(device="cpu"), ...)."""
    import torch
    values = list(s.args) + list(s.kwargs.values())
    return any((isinstance(v, torch.device) and v.type == "cpu") or v == "cpu" for v in values
               if isinstance(v, (torch.device, str)))


def _involves_neuron(s):
    """Whether a sample has a neuron tensor or asks for the neuron device
    (a factory sample such as linspace(1, 3, 1) without a device runs on CPU
    on both sides and tests nothing)."""
    import torch

    def on_neuron(v):
        if isinstance(v, torch.Tensor):
            return v.device.type == "neuron"
        if isinstance(v, torch.device):
            return v.type == "neuron"
        if isinstance(v, str):
            return v.split(":")[0] == "neuron"
        if isinstance(v, (list, tuple)):
            return any(on_neuron(x) for x in v)
        if isinstance(v, dict):
            return any(on_neuron(x) for x in v.values())
        return False
    return on_neuron([s.input, list(s.args), s.kwargs])


NO_NEURON = "the sample has no neuron tensor or device (it runs on CPU on both sides)"


def _call(fn, s, **extra):
    return fn(s.input, *s.args, **s.kwargs, **extra)


def _both(run_cpu, run_neuron):
    """Runs the CPU reference, then neuron (synchronised). Returns
    ("ran", cpu_result, neuron_result) when neither raised, ("raised", error,
    None) when both raised the same error (harness.compare_errors), else
    (reason, None, None)."""
    import torch
    try:
        expected, cpu_error = run_cpu(), None
    except Exception as e:  # noqa: BLE001 - the op's own errors are data here
        expected, cpu_error = None, e
    try:
        actual, neuron_error = run_neuron(), None
        torch.neuron.synchronize()
    except Exception as e:  # noqa: BLE001
        actual, neuron_error = None, e
    reason = harness.compare_errors(neuron_error, cpu_error)
    if reason:
        return reason, None, None
    if cpu_error is not None:
        return "raised", cpu_error, None
    return "ran", expected, actual


def check_forward(fn, samples, noncontiguous=False):
    """harness.Check of fn over samples [(index, SampleInput on neuron)]:
    each sample's result on neuron against its CPU twin's."""
    check = harness.Check()
    for i, ns in samples:
        if not _involves_neuron(ns):
            check.skip(NO_NEURON)
            continue
        cs = _cpu_twin(ns)
        if noncontiguous:
            ns, cs = ns.noncontiguous(), cs.noncontiguous()
        outcome, expected, actual = _both(lambda: _call(fn, cs), lambda: _call(fn, ns))
        if outcome == "raised":
            check.both_raised(expected)
            continue
        reason = outcome if outcome != "ran" else \
            harness.compare(actual, expected, allow_cpu=_asks_for_cpu(ns))
        if reason:
            check.fail(f"sample {i}", reason)
            continue
        check.ok()
    return check


def _tensors(x):
    import torch
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


def check_out(fn, samples):
    """out= gets tensors shaped like the result (zero-filled); the op must
    write into them, return them, and keep their storage."""
    import torch
    check = harness.Check()
    for i, ns in samples:
        if not _involves_neuron(ns):
            check.skip(NO_NEURON)
            continue
        cs = _cpu_twin(ns)
        try:
            ref = _call(fn, cs)
        except Exception:  # noqa: BLE001 - no reference result, no out= shape to offer
            check.skip("raises on CPU without out= (the forward check compares the error)")
            continue
        if not _tensors(ref) or (not isinstance(ref, torch.Tensor) and len(_tensors(ref)) != len(ref)):
            check.skip("the result is not a tensor or a flat sequence of tensors")
            continue
        def outs(device):
            made = [torch.zeros_like(t, device=device) for t in _tensors(ref)]
            return made[0] if isinstance(ref, torch.Tensor) else tuple(made)
        out_c, out_n = outs("cpu"), outs("neuron")
        # (an empty out= tensor may get new storage, as on CPU)
        ptrs = [t.untyped_storage().data_ptr() if t.numel() else None for t in _tensors(out_n)]
        outcome, expected, actual = _both(lambda: _call(fn, cs, out=out_c),
                                          lambda: _call(fn, ns, out=out_n))
        if outcome == "raised":
            check.both_raised(expected)
            continue
        if outcome != "ran":
            check.fail(f"sample {i}", outcome)
            continue
        if any(p is not None and p != t.untyped_storage().data_ptr()
               for p, t in zip(ptrs, _tensors(out_n))):
            check.fail(f"sample {i}", "out= tensors got new storage")
            continue
        if [a is b for a, b in zip(_tensors(actual), _tensors(out_n))] != \
                [a is b for a, b in zip(_tensors(expected), _tensors(out_c))]:
            check.fail(f"sample {i}", "the op did not return its out= tensors as on CPU")
            continue
        reason = harness.compare(out_n, out_c) or harness.compare(actual, expected)
        if reason:
            check.fail(f"sample {i}", reason)
            continue
        check.ok()
    return check


def check_backward(op, samples):
    """Gradients of every input that requires grad, for the same seeded
    grad_outputs on both devices."""
    import torch
    check = harness.Check()
    for i, ns in samples:
        if not _involves_neuron(ns):
            check.skip(NO_NEURON)
            continue
        ns = ns.transform(lambda t: t.detach().requires_grad_(t.requires_grad)
                          if isinstance(t, torch.Tensor) else t)
        cs = _cpu_twin(ns, leaf=True)

        def grads(s, device):
            out = s.output_process_fn_grad(op.gradcheck_wrapper(op.get_op(), s.input, *s.args,
                                                                **s.kwargs))
            outs = [o for o in _tensors(out) if o.requires_grad and
                    (o.dtype.is_floating_point or o.dtype.is_complex)]
            leaves = [t for t in _tensors([s.input, list(s.args), list(s.kwargs.values())])
                      if t.requires_grad]
            if not outs or not leaves:
                return None
            g = torch.Generator().manual_seed(0)
            gos = [torch.randn(o.shape, dtype=o.dtype, generator=g).to(device) for o in outs]
            return torch.autograd.grad(outs, leaves, gos, allow_unused=True)
        outcome, expected, actual = _both(lambda: grads(cs, "cpu"), lambda: grads(ns, "neuron"))
        if outcome == "raised":
            check.both_raised(expected)
            continue
        if outcome == "ran" and expected is None and actual is None:
            check.skip("no differentiable output or no input requiring grad")
            continue
        if outcome == "ran" and expected is not None and actual is not None \
                and all(g is None for g in expected) and all(g is None for g in actual):
            check.skip("no gradient reached an input (on either device)")
            continue
        reason = outcome if outcome != "ran" else \
            harness.compare(actual, expected, allow_cpu=_asks_for_cpu(ns))
        if reason:
            check.fail(f"sample {i}", reason)
            continue
        check.ok()
    return check


# Ops that take a dropout probability, and where: (keyword, position in
# args, whether a training=False keyword turns it off). Only these ops'
# samples are filtered for randomness (a `p` elsewhere is a norm's order).
DROPOUT_ARGS = {
    "nn.functional.scaled_dot_product_attention": ("dropout_p", None, False),
    "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu": ("dropout_p", None, False),
    "nn.functional.multi_head_attention_forward": ("dropout_p", 9, True),
}


def _draws_randomly(s, name):
    """Samples of otherwise deterministic ops that ask for dropout
    (scaled_dot_product_attention(dropout_p=0.5), ...): random, like RANDOM_OPS."""
    if name not in DROPOUT_ARGS:
        return False
    key, pos, training_gates = DROPOUT_ARGS[name]
    if training_gates and not s.kwargs.get("training", True):
        return False
    p = s.kwargs.get(key, s.args[pos] if pos is not None and len(s.args) > pos else 0.0)
    return isinstance(p, float) and p > 0


def op_name(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _samples(op, name, dtype, requires_grad, max_samples):
    """[(index, sample)] on neuron and {skip reason: count}, or raises."""
    skipped, out = {}, []
    for i, s in enumerate(op.sample_inputs("neuron", dtype, requires_grad=requires_grad)):
        if _draws_randomly(s, name):
            why = "draws random numbers (dropout probability > 0)"
            skipped[why] = skipped.get(why, 0) + 1
        elif max_samples and len(out) >= max_samples:
            why = f"beyond --max-samples {max_samples}"
            skipped[why] = skipped.get(why, 0) + 1
        else:
            out.append((i, s))
    return out, skipped


def run_op(op, dtypes, checks, max_samples):
    """Records for one OpInfo."""
    import torch
    name = op_name(op)
    supported = op.supported_dtypes("cpu")
    backward_dtypes = op.supported_backward_dtypes("cpu") if op.supports_autograd else ()
    if not any(getattr(torch, d) in supported for d in dtypes):
        # (an OpInfo for other devices only, e.g. batch_norm.without_cudnn)
        yield {"op": name, "dtype": "-", "check": "forward", "status": "skip",
               "detail": f"none of the dtypes asked for is supported on CPU "
                         f"({sorted(str(d).replace('torch.', '') for d in supported)})"}
    for dname in dtypes:
        dtype = getattr(torch, dname)
        if dtype not in supported:
            continue
        base = {"op": name, "dtype": dname}
        if name in RANDOM_OPS or name in UNINITIALISED_OPS:
            why = ("random op: neuron and CPU draw from different generators"
                   if name in RANDOM_OPS else "returns uninitialised memory")
            yield {**base, "check": "forward", "status": "skip", "detail": why}
            continue
        try:
            samples, skipped = _samples(op, name, dtype, False, max_samples)
        except Exception as e:  # noqa: BLE001
            try:
                list(op.sample_inputs("cpu", dtype))
            except Exception:  # noqa: BLE001 - PyTorch's own sample function fails
                yield {**base, "check": "forward", "status": "skip",
                       "detail": f"sample_inputs raises on CPU too: {harness.first_line(e)}"}
                continue
            yield {**base, "check": "forward", "status": "fail",
                   "detail": f"sample_inputs raised on neuron, not on CPU: {harness.first_line(e)}"}
            continue
        if not samples:
            yield {**base, "check": "forward", "status": "skip",
                   "detail": "; ".join(f"{n} skipped: {r}" for r, n in skipped.items())
                   or "no samples"}
            continue
        todo = []
        if "forward" in checks:
            todo.append(("forward", lambda: check_forward(op.op, samples)))
        if "noncontiguous" in checks:
            todo.append(("noncontiguous", lambda: check_forward(op.op, samples, True)))
        if "out" in checks and op.supports_out:
            todo.append(("out", lambda: check_out(op.op, samples)))
        if "inplace" in checks and op.inplace_variant is not None:
            def inplace(x, *a, _f=op.inplace_variant, **k):
                return _f(x.clone(), *a, **k)
            todo.append(("inplace", lambda: check_forward(inplace, samples)))
        if ("backward" in checks and dtype in backward_dtypes
                and (dtype.is_floating_point or dtype.is_complex)):
            def backward():
                grad_samples, grad_skipped = _samples(op, name, dtype, True, max_samples)
                check = check_backward(op, grad_samples)
                return check, grad_skipped
            todo.append(("backward", backward))
        for check_name, fn in todo:
            extra = skipped
            try:
                check = fn()
                if isinstance(check, tuple):
                    check, extra = check
            except Exception as e:  # noqa: BLE001 - a harness-level error is a failure too
                check = harness.Check()
                check.fail("harness", harness.first_line(e))
            for reason, n in extra.items():
                check.skipped[reason] = check.skipped.get(reason, 0) + n
            yield check.record(base, check_name)


def worker(names, dtypes, checks, max_samples, out_path):
    import torch  # noqa: F401
    import torchneuron  # noqa: F401
    from torch.testing._internal.common_methods_invocations import op_db
    by_name = {}
    for op in op_db:
        by_name.setdefault(op_name(op), op)
    harness.worker_loop(names, lambda n: run_op(by_name[n], dtypes, checks, max_samples), out_path)


# ---------------------------------------------------------------------------
# Parent half.

def all_op_names():
    """Every OpInfo name (name.variant) in op_db, in op_db's order."""
    code = ("from torch.testing._internal.common_methods_invocations import op_db\n"
            "print('\\n'.join(o.name + ('.' + o.variant_test_name if o.variant_test_name else '')"
            " for o in op_db))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names = [l for l in r.stdout.splitlines() if l]
    unknown = sorted((RANDOM_OPS | UNINITIALISED_OPS) - set(names))
    if unknown:
        raise ValueError(f"skip lists name ops that are not in op_db: {unknown}")
    return names


def expand(names, known=None):
    """op_db entries for names: an exact name, or every variant ("div" ->
    "div.no_rounding_mode", ...). Unknown names are an error."""
    known = known or all_op_names()
    out = []
    for n in names:
        hits = [k for k in known if k == n or k.startswith(n + ".")]
        if not hits:
            raise ValueError(f"no OpInfo named {n!r} in op_db")
        out += [h for h in hits if h not in out]
    return out


def run(names, dtypes=DTYPES, checks=CHECKS, max_samples=None, chunk=40):
    """Runs ops (see expand) in workers; returns the records (crashes
    included). max_samples: the first n samples of each op (None: all)."""
    return run_exact(expand(names), dtypes, checks, max_samples, chunk)


def run_exact(names, dtypes=DTYPES, checks=CHECKS, max_samples=None, chunk=40):
    """run() for exact OpInfo names (no variants added)."""
    args = ["--dtypes", ",".join(dtypes), "--checks", ",".join(checks),
            "--max-samples", str(max_samples or 0)]
    return harness.run_workers(__file__, names, args, chunk)


def load_expected():
    return harness.load_expected(EXPECTED)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--names", help="comma-separated op names (default: all of op_db)")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--checks", default=",".join(CHECKS))
    p.add_argument("--max-samples", type=int, default=0,
                   help="the first n samples of each op and dtype (default 0: all)")
    p.add_argument("--shard", help="i/n: run the i-th of n shards of the ops (1 <= i <= n)")
    p.add_argument("--merge", help="merge shard reports matching this glob instead of running")
    p.add_argument("--report", default=None, help="write the JSON report here")
    p.add_argument("--quiet", action="store_true", help="print the summary line only")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    dtypes, checks = args.dtypes.split(","), args.checks.split(",")
    names = args.names.split(",") if args.names else None
    if args.worker:
        worker(names, dtypes, checks, args.max_samples, args.out)
        return 0
    known = all_op_names()
    names = expand(names, known) if names else known
    if args.merge:
        return harness.merge(harness.shard_paths(args.merge), names, load_expected(), args.report)
    names = harness.shard(names, args.shard)
    records, wall = harness.timed(lambda: run_exact(names, dtypes, checks, args.max_samples))
    meta = {"names": names, "shard": args.shard or "1/1", "wall_s": round(wall, 1),
            "dtypes": dtypes, "checks": checks, "max_samples": args.max_samples}
    print(f"opinfo: {len(names)} ops in {wall:.0f} s")
    return harness.report(records, load_expected(), args.report, meta, args.quiet)


if __name__ == "__main__":
    sys.exit(main())
