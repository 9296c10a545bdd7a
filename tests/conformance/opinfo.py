"""OpInfo conformance: every op in PyTorch's own op_db, run on `neuron` and on
CPU with the same samples, compared.

    python tests/conformance/opinfo.py                  # everything (make conformance)
    python tests/conformance/opinfo.py --ops add,mm,sum  # some ops
    python tests/conformance/opinfo.py --report out.json

Checks per (op, dtype): `forward` (results must be bitwise equal to CPU's;
NaNs equal) and `inplace` (the in-place variant, same rule). A sample that
raises on CPU must raise on neuron too. Random ops are skipped with a reason
(the devices draw from different generators).

Ops run in worker processes, a chunk at a time; a worker that dies or hangs
marks the op it was running as `crash` and a new worker resumes after it, so
one crash never hides the others. The report is JSON (op x dtype x check:
status and detail) and the last line is the plain summary
"N passed, N failed, N skipped".
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(HERE, "expected_failures.txt")
# Ops whose values are not a function of their inputs: random draws (the two
# devices use different generators) and uninitialised memory.
RANDOM_OPS = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform", "exponential",
              "geometric", "cauchy", "log_normal", "poisson", "randint", "randperm", "rrelu",
              "fractional_max_pool", "lowrank")
UNINITIALISED_OPS = ("empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
                     "empty_permuted")
DTYPES = ("float32", "float64", "int64", "bool", "complex64")


def load_expected():
    """{(op, dtype, check): reason}; every entry must give a reason."""
    out = {}
    if not os.path.exists(EXPECTED):
        return out
    for line in open(EXPECTED):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, reason = line.partition("  ")
        op, dtype, check = key.split()
        assert reason.strip(), f"expected failure without a reason: {line}"
        out[(op, dtype, check)] = reason.strip()
    return out


# ---------------------------------------------------------------------------
# Worker side: runs ops in this process.

def _to_cpu(x):
    import torch
    return x.cpu() if isinstance(x, torch.Tensor) and x.device.type == "neuron" else x


def _cpu_sample(s):
    """The CPU twin of a sample generated on neuron: neuron tensors copied to
    CPU, CPU-only arguments (e.g. tensor_split's indices) left as they are,
    and a device argument pointed at CPU."""
    import torch
    c = s.transform(_to_cpu)
    for k, v in list(c.kwargs.items()):
        if isinstance(v, torch.device) and v.type == "neuron":
            c.kwargs[k] = torch.device("cpu")
        elif k == "device" and isinstance(v, str) and v.startswith("neuron"):
            c.kwargs[k] = "cpu"
    return c


def _compare(actual, expected):
    """None when equal (bitwise, NaNs equal), else a short reason."""
    import torch
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"expected a tensor, got {type(actual).__name__}"
        if actual.device.type != "neuron":
            return f"result on {actual.device}, not neuron"
        a = actual.cpu()
        if a.dtype != expected.dtype or a.shape != expected.shape:
            return f"dtype/shape {a.dtype}{tuple(a.shape)} vs {expected.dtype}{tuple(expected.shape)}"
        try:
            torch.testing.assert_close(a, expected, rtol=0, atol=0, equal_nan=True)
        except AssertionError as e:
            first = str(e).strip().splitlines()
            return "values differ: " + (first[1] if len(first) > 1 else first[0])[:160]
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return "sequence length differs"
        for a, e in zip(actual, expected):
            r = _compare(a, e)
            if r:
                return r
        return None
    if isinstance(expected, float) and expected != expected:
        return None if actual != actual else f"{actual!r} vs nan"
    return None if actual == expected else f"{actual!r} vs {expected!r}"


def _run_samples(fn, samples):
    """'pass', or ('fail', reason). Samples are on neuron."""
    import torch
    for ns in samples:
        s = _cpu_sample(ns)
        try:
            expected = fn(s.input, *s.args, **s.kwargs)
            cpu_error = None
        except Exception as e:  # noqa: BLE001 - the op's own errors are data here
            expected, cpu_error = None, e
        try:
            actual = fn(ns.input, *ns.args, **ns.kwargs)
            torch.neuron.synchronize()
        except Exception as e:  # noqa: BLE001
            if cpu_error is not None and type(e) is type(cpu_error):
                continue
            return ("fail", f"raised {type(e).__name__}: {str(e).splitlines()[0][:160]}"
                    + ("" if cpu_error is None else f" (CPU raised {type(cpu_error).__name__})"))
        if cpu_error is not None:
            return ("fail", f"CPU raised {type(cpu_error).__name__}, neuron did not")
        reason = _compare(actual, expected)
        if reason:
            return ("fail", reason)
    return "pass"


def run_op(op, dtypes, max_samples):
    """Records for one OpInfo: dicts with op, dtype, check, status, detail."""
    import torch
    records = []
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    supported = op.supported_dtypes("cpu")
    for dname in dtypes:
        dtype = getattr(torch, dname)
        base = {"op": name, "dtype": dname}
        if dtype not in supported:
            continue
        if any(r in op.name for r in RANDOM_OPS):
            records.append({**base, "check": "forward", "status": "skip",
                            "detail": "random op: neuron and CPU draw from different generators"})
            continue
        if op.name in UNINITIALISED_OPS:
            records.append({**base, "check": "forward", "status": "skip",
                            "detail": "returns uninitialised memory"})
            continue
        try:
            # Samples are made on neuron (as PyTorch's device tests do), then
            # copied to CPU for the reference.
            samples = list(op.sample_inputs("neuron", dtype, requires_grad=False))[:max_samples]
        except Exception as e:  # noqa: BLE001
            records.append({**base, "check": "forward", "status": "skip",
                            "detail": f"no samples on neuron: {type(e).__name__}: {e}"[:200]})
            continue
        checks = [("forward", op.op)]
        if op.inplace_variant is not None:
            def inplace(x, *a, _f=op.inplace_variant, **k):
                return _f(x.clone(), *a, **k)
            checks.append(("inplace", inplace))
        for check, fn in checks:
            result = _run_samples(fn, samples)
            status, detail = (result, "") if result == "pass" else result
            records.append({**base, "check": check, "status": status, "detail": detail})
    return records


def worker(ops, dtypes, max_samples, out_path):
    import torch  # noqa: F401
    import torchneuron  # noqa: F401
    from torch.testing._internal.common_methods_invocations import op_db
    by_name = {}
    for op in op_db:
        by_name.setdefault(op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""), op)
    with open(out_path, "a") as out:
        for name in ops:
            out.write(json.dumps({"start": name}) + "\n")
            out.flush()
            signal.alarm(120)  # a hang is a bug: the parent records it
            for rec in run_op(by_name[name], dtypes, max_samples):
                out.write(json.dumps(rec) + "\n")
            signal.alarm(0)
            out.write(json.dumps({"done": name}) + "\n")
            out.flush()


# ---------------------------------------------------------------------------
# Parent side.

def all_op_names():
    code = ("from torch.testing._internal.common_methods_invocations import op_db\n"
            "print('\\n'.join(o.name + ('.' + o.variant_test_name if o.variant_test_name else '')"
            " for o in op_db))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [l for l in r.stdout.splitlines() if l]


def expand(names):
    """op_db entries for names: an exact name, or every variant ("div" ->
    "div.no_rounding_mode", ...). Unknown names are an error."""
    known = all_op_names()
    out = []
    for n in names:
        hits = [k for k in known if k == n or k.startswith(n + ".")]
        if not hits:
            raise ValueError(f"no OpInfo named {n!r} in op_db")
        out += [h for h in hits if h not in out]
    return out


def run(ops, dtypes, max_samples, chunk=40):
    """Runs ops (op_db names, see expand) in workers; returns the records
    (crashes included)."""
    records, pending = [], expand(ops)
    while pending:
        batch, pending = pending[:chunk], pending[chunk:]
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as tmp:
            path = tmp.name
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--ops", ",".join(batch),
               "--dtypes", ",".join(dtypes), "--max-samples", str(max_samples), "--out", path]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        started, done = None, set()
        for line in open(path):
            rec = json.loads(line)
            if "start" in rec:
                started = rec["start"]
            elif "done" in rec:
                done.add(rec["done"])
            else:
                records.append(rec)
        os.unlink(path)
        if proc.returncode != 0 and started is not None and started not in done:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:200]
            records.append({"op": started, "dtype": "-", "check": "run", "status": "crash",
                            "detail": f"worker exited with {proc.returncode}: {tail}"})
            rest = batch[batch.index(started) + 1:]
            pending = rest + pending
    return records


def summarize(records, expected):
    counts = {"pass": 0, "fail": 0, "skip": 0, "xfail": 0, "crash": 0}
    unexpected = []
    for r in records:
        key = (r["op"], r["dtype"], r["check"])
        if r["status"] in ("fail", "crash") and key in expected:
            r["status"], r["detail"] = "xfail", expected[key]
        counts[r["status"]] += 1
        if r["status"] in ("fail", "crash"):
            unexpected.append(r)
    return counts, unexpected


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ops", help="comma-separated op names (default: all of op_db)")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--max-samples", type=int, default=8)
    p.add_argument("--report", default=None, help="write the JSON report here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    dtypes = args.dtypes.split(",")
    ops = args.ops.split(",") if args.ops else None
    if args.worker:
        worker(ops, dtypes, args.max_samples, args.out)
        return 0
    records = run(ops or all_op_names(), dtypes, args.max_samples)
    counts, unexpected = summarize(records, load_expected())
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"counts": counts, "records": records}, f, indent=1)
    for r in unexpected:
        print(f"{r['status'].upper():5} {r['op']} {r['dtype']} {r['check']}: {r['detail']}")
    print(f"expected failures: {counts['xfail']}, crashes: {counts['crash']}")
    print(f"{counts['pass']} passed, {counts['fail'] + counts['crash']} failed, "
          f"{counts['skip']} skipped")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
