"""What the conformance suites (opinfo.py, modules.py) share: the bitwise
comparison against CPU, crash-isolated worker processes, the expected-failures
file and the report.

A suite is a script with two halves. Its worker half runs named items (ops,
modules) in this process and yields records
    {"op": name, "dtype": dtype, "check": check, "status": "pass"|"fail"|"skip", "detail": str}
Its parent half hands names to `run_workers`, which starts the script with
`--worker` on a chunk at a time; a worker that dies or hangs (ALARM_S) gets a
`crash` record for the item it was on and a new worker resumes after it, so
one crash never hides the others.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile

ALARM_S = 180  # per item; a hang is a bug, recorded as a crash


def load_expected(path):
    """{(name, dtype, check): reason} from an expected-failures file; every
    entry must give a reason (after two spaces)."""
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, reason = line.partition("  ")
        name, dtype, check = key.split()
        assert reason.strip(), f"expected failure without a reason: {line}"
        out[(name, dtype, check)] = reason.strip()
    return out


def to_cpu(x):
    import torch
    return x.cpu() if isinstance(x, torch.Tensor) and x.device.type == "neuron" else x


def compare(actual, expected, atol=0.0, rtol=0.0, allow_cpu=False):
    """None when actual (on neuron; on CPU too with allow_cpu) equals expected
    (on CPU) — bitwise unless tolerances are given, NaNs equal — else a short
    reason."""
    import torch
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"expected a tensor, got {type(actual).__name__}"
        if actual.device.type != "neuron" and not (allow_cpu and actual.device.type == "cpu"):
            return f"result on {actual.device}, not neuron"
        a = actual.detach().cpu()
        e = expected.detach()
        if a.dtype != e.dtype or a.shape != e.shape:
            return f"dtype/shape {a.dtype}{tuple(a.shape)} vs {e.dtype}{tuple(e.shape)}"
        if a.layout == e.layout == torch.sparse_coo:
            # Sparse COO: same dims and coalesced flag, then indices and values
            # as stored (an uncoalesced tensor's order is CPU's too).
            if (a.sparse_dim(), a.dense_dim(), a.is_coalesced()) != (
                    e.sparse_dim(), e.dense_dim(), e.is_coalesced()):
                return (f"sparse dims/coalesced {(a.sparse_dim(), a.dense_dim(), a.is_coalesced())}"
                        f" vs {(e.sparse_dim(), e.dense_dim(), e.is_coalesced())}")
            return (compare(a._indices(), e._indices(), 0.0, 0.0, allow_cpu=True)
                    or compare(a._values(), e._values(), atol, rtol, allow_cpu=True))
        if a.layout != torch.strided or e.layout != torch.strided:
            return f"layout {a.layout} vs {e.layout}"
        try:
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as err:
            lines = [l.strip() for l in str(err).splitlines() if l.strip()]
            return "values differ: " + "; ".join(lines[1:3] or lines[:1])[:200]
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return "sequence length differs"
        for a, e in zip(actual, expected):
            r = compare(a, e, atol, rtol, allow_cpu)
            if r:
                return r
        return None
    if isinstance(expected, float) and expected != expected:
        return None if actual != actual else f"{actual!r} vs nan"
    return None if actual == expected else f"{actual!r} vs {expected!r}"


def first_line(e):
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"


# ---------------------------------------------------------------------------
# Worker half.

def worker_loop(names, run_item, out_path):
    """Runs run_item(name) -> records for each name, appending JSON lines to
    out_path with start/done markers the parent reads after a crash."""
    with open(out_path, "a") as out:
        for name in names:
            out.write(json.dumps({"start": name}) + "\n")
            out.flush()
            signal.alarm(ALARM_S)
            for rec in run_item(name):
                out.write(json.dumps(rec) + "\n")
            signal.alarm(0)
            out.write(json.dumps({"done": name}) + "\n")
            out.flush()


# ---------------------------------------------------------------------------
# Parent half.

def run_workers(script, names, worker_args, chunk=40):
    """Runs names through `script --worker --names ... <worker_args> --out F`
    a chunk per process; returns the records, crashes included."""
    records, pending = [], list(names)
    while pending:
        batch, pending = pending[:chunk], pending[chunk:]
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as tmp:
            path = tmp.name
        cmd = [sys.executable, os.path.abspath(script), "--worker", "--names", ",".join(batch),
               *worker_args, "--out", path]
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
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:200]
            if started is None or started in done:
                # Died outside any item (import, set-up): nothing ran; say so.
                raise RuntimeError(f"conformance worker failed before running: {tail}")
            records.append({"op": started, "dtype": "-", "check": "run", "status": "crash",
                            "detail": f"worker exited with {proc.returncode}: {tail}"})
            pending = batch[batch.index(started) + 1:] + pending
    return records


def summarize(records, expected):
    """Counts per status (fail/crash matching an expected entry become xfail)
    and the unexpected failures."""
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


def stale_expected(records, expected):
    """Expected-failure entries whose check now passes (the file only
    shrinks: these should be deleted)."""
    passing = {(r["op"], r["dtype"], r["check"]) for r in records if r["status"] == "pass"}
    return sorted(k for k in expected if k in passing)


def report(records, expected, path=None):
    """Prints unexpected failures, stale expected entries and the summary
    line; writes the JSON report; returns the exit status."""
    counts, unexpected = summarize(records, expected)
    stale = stale_expected(records, expected)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"counts": counts, "records": records}, f, indent=1)
    for r in unexpected:
        print(f"{r['status'].upper():5} {r['op']} {r['dtype']} {r['check']}: {r['detail']}")
    for k in stale:
        print(f"STALE {' '.join(k)}: passes now; remove it from the expected-failures file")
    checked = counts["pass"] + counts["fail"] + counts["crash"] + counts["xfail"]
    rate = 100.0 * counts["pass"] / checked if checked else 0.0
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['xfail']} expected failures, "
          f"{counts['crash']} crashes, {counts['skip']} skipped ({rate:.2f}% of checked pass)")
    return 1 if unexpected or stale else 0
