"""Compiled conformance: OpInfo ops under torch.compile (Inductor), neuron vs CPU.

    python tests/conformance/compiled.py                     # the default op set
    python tests/conformance/compiled.py --names add,softmax --max-samples 3
    python tests/conformance/compiled.py --report build/compiled.json

For each op (float32, variant ""), its first --max-samples samples are
compiled afresh (dynamic=False) on CPU and on neuron and the results compared
with harness.compare (dtype, shape, strides of dimensions of length > 1, every
element's bits). A sample that raises on CPU must raise the same exception
type on neuron. Per op: `pass` (compared, all equal), `differ` (the first
difference; Inductor lowers a few ops differently for devices other than
"cpu", see tests/test_compile.py), `both-raised`, `fail` (one device raised).
Exit status 1 if any op fails (`differ` is reported, not failed: it is
Inductor's lowering, not the device). make conformance runs it; make test runs
a slice (tests/test_compile.py::test_opinfo_slice_compiled).
"""
import argparse
import json
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

DEFAULT_NAMES = (
    "abs acos add addcdiv addcmul addmm amax amin argmax asin atan atan2 bmm ceil clamp cos cosh "
    "cumsum div.no_rounding_mode erf exp exp2 expm1 floor fmod frac hypot lerp log log10 log1p log2 log_softmax "
    "logsumexp masked_fill matmul max.reduction_with_dim maximum mean min.reduction_with_dim "
    "minimum mm mul mv neg pow prod reciprocal remainder round rsqrt sigmoid sign sin sinh "
    "softmax sqrt square std sub sum tan tanh trunc var where nn.functional.gelu "
    "nn.functional.layer_norm nn.functional.relu nn.functional.silu nn.functional.softplus "
    "nn.functional.leaky_relu nn.functional.elu nn.functional.hardtanh nn.functional.linear "
    "nn.functional.embedding nn.functional.cross_entropy nn.functional.mse_loss cat stack "
    "transpose permute reshape flip roll gather index_select tril triu"
).split()


def _ops(names):
    from torch.testing._internal.common_methods_invocations import op_db
    by_name = {}
    for op in op_db:
        full = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
        by_name.setdefault(full, op)
    missing = [n for n in names if n not in by_name]
    if missing:
        raise SystemExit(f"not in op_db: {missing}")
    return [(n, by_name[n]) for n in names]


def _run(op, sample, device):
    import torch

    def move(t):
        return t.to(device) if isinstance(t, torch.Tensor) else t
    inp = move(sample.input) if not isinstance(sample.input, (list, tuple)) else \
        type(sample.input)(move(t) for t in sample.input)
    args = [move(a) for a in sample.args]
    kwargs = {k: move(v) for k, v in sample.kwargs.items()}

    def f(inp, args, kwargs):
        return op(inp, *args, **kwargs)
    torch._dynamo.reset()
    try:
        return "ok", torch.compile(f, dynamic=False)(inp, args, kwargs)
    except Exception as e:  # noqa: BLE001
        return "raise", type(e).__name__


def check(op, max_samples):
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:max_samples]
    compared, raised, reason = 0, 0, None
    for s in samples:
        ref, got = _run(op, s, "cpu"), _run(op, s, "neuron")
        if ref[0] != got[0] or (ref[0] == "raise" and ref[1] != got[1]):
            return "fail", f"cpu {ref[0]} {ref[1] if ref[0] == 'raise' else ''}, neuron " \
                           f"{got[0]} {got[1] if got[0] == 'raise' else ''}"
        if ref[0] == "raise":
            raised += 1
            continue
        r = harness.compare(got[1], ref[1])
        compared += 1
        if r and reason is None:
            reason = r
    if reason:
        return "differ", reason
    if compared:
        return "pass", None
    return ("both-raised" if raised else "skip"), None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--names", default=",".join(DEFAULT_NAMES))
    p.add_argument("--max-samples", type=int, default=2)
    p.add_argument("--report", default=None)
    args = p.parse_args()
    import torch  # noqa: F401
    import torchneuron  # noqa: F401
    start = time.time()
    results = {}
    for name, op in _ops(args.names.split(",")):
        status, reason = check(op, args.max_samples)
        results[name] = {"status": status, "reason": reason}
        if status != "pass":
            print(f"{name}: {status}" + (f" — {reason}" if reason else ""), flush=True)
    counts = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"compiled conformance: {len(results)} ops, {counts}, {time.time() - start:.0f} s")
    if args.report:
        with open(args.report, "w") as fh:
            json.dump({"counts": counts, "ops": results}, fh, indent=1)
    return 1 if counts.get("fail") else 0


if __name__ == "__main__":
    raise SystemExit(main())
