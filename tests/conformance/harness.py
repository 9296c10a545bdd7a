"""What the conformance suites (opinfo.py, modules.py) share: the bitwise
comparison against CPU, the comparison of errors, the outcome of one check
over its samples, crash-isolated worker processes, shards, the
expected-failures file and the report.

A suite is a script with two halves. Its worker half runs named items (ops,
modules) in this process and yields records
    {"op": name, "dtype": dtype, "check": check, "status": status, "detail": str}
with status "pass" (at least one sample's results were compared, all equal),
"both-raised" (no sample gave results to compare: every one that ran raised
the same error on both devices), "fail" or "skip" (nothing ran, with the
reason). Its parent half hands names to `run_workers`, which starts the script
with `--worker` on a chunk at a time; a worker that dies or hangs (ALARM_S per
record) gets a `crash` record for the item it was on and a new worker resumes
after it, so one crash never hides the others. `report` turns fail/crash
records listed in the expected-failures file into `xfail`.
"""
import glob
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

# Per record (one check of one item over all its samples): a hang is a bug,
# recorded as a crash.
ALARM_S = 600
STATUSES = ("pass", "both-raised", "fail", "xfail", "skip", "crash")


def load_expected(path):
    """{(name, dtype, check): (reason, samples)} from an expected-failures
    file, one entry a line: `name dtype check[ samples=i,j,...]  reason`.
    With samples=, exactly those samples (their indices in the op's
    sample_inputs) must fail, so the entry hides nothing else in the check;
    without, any failure of the check is expected. Every entry must give a
    reason (after two spaces)."""
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, reason = line.partition("  ")
        name, dtype, check, *rest = key.split()
        samples = None
        if rest:
            assert len(rest) == 1 and rest[0].startswith("samples="), f"bad entry: {line}"
            samples = frozenset(int(i) for i in rest[0][len("samples="):].split(","))
        assert reason.strip(), f"expected failure without a reason: {line}"
        assert (name, dtype, check) not in out, f"expected failure listed twice: {line}"
        out[(name, dtype, check)] = (reason.strip(), samples)
    return out


def to_cpu(x):
    import torch
    return x.cpu() if isinstance(x, torch.Tensor) and x.device.type == "neuron" else x


# ---------------------------------------------------------------------------
# Comparing results.

def _same_width_int(dtype):
    import torch
    size = torch.empty(0, dtype=dtype).element_size()
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]


def _bits_differ(a, e):
    """A bool tensor: where a and e (CPU, same dtype and shape) differ as bit
    patterns. Floating point: -0.0 != +0.0, NaN == NaN whatever the payload
    and sign, a NaN never equals a number; complex: each component so;
    integers and bools: exactly."""
    import torch
    a, e = a.resolve_conj().resolve_neg(), e.resolve_conj().resolve_neg()
    if a.is_complex():
        a, e = torch.view_as_real(a), torch.view_as_real(e)
    if a.dtype == torch.bool:
        return a != e
    if not a.dtype.is_floating_point:
        return a.view(_same_width_int(a.dtype)) != e.view(_same_width_int(e.dtype))
    ia, ie = a.view(_same_width_int(a.dtype)), e.view(_same_width_int(e.dtype))
    # (isnan on float8 and friends goes through float32, which keeps NaN)
    nan_a, nan_e = a.float().isnan(), e.float().isnan()
    return ((ia != ie) & ~(nan_a & nan_e)) | (nan_a != nan_e)


def _element(t, idx):
    """'value (0xbits)' of t[idx] for a report."""
    import torch
    v = t.resolve_conj().resolve_neg()[tuple(idx)]
    if v.is_complex():
        re_, im = torch.view_as_real(v).unbind(-1)
        return f"({_element(re_, [])}, {_element(im, [])})"
    if v.dtype.is_floating_point:
        width = v.element_size() * 2
        bits = v.view(_same_width_int(v.dtype)).item() & ((1 << (8 * v.element_size())) - 1)
        return f"{v.float().item()!r} (0x{bits:0{width}x})"
    return repr(v.item())


def _float_bits(x):
    return struct.pack("<d", x)


def _scalar_differs(actual, expected):
    """A reason when two Python scalars differ: the same type, and floats
    (each component of complex numbers) bitwise with NaNs equal."""
    if type(actual) is not type(expected):
        return f"{actual!r} ({type(actual).__name__}) vs {expected!r} ({type(expected).__name__})"
    if isinstance(expected, complex):
        return (_scalar_differs(actual.real, expected.real)
                or _scalar_differs(actual.imag, expected.imag))
    if isinstance(expected, float):
        if math.isnan(actual) and math.isnan(expected):
            return None
        return None if _float_bits(actual) == _float_bits(expected) else f"{actual!r} vs {expected!r}"
    return None if actual == expected else f"{actual!r} vs {expected!r}"


def significant_strides(t):
    """(size, stride) of the dimensions whose stride matters: those of length
    > 1 (a dimension of length 0 or 1 never steps, so its stride is arbitrary
    and may differ)."""
    return tuple((s, st) for s, st in zip(t.shape, t.stride()) if s > 1)


def compare(actual, expected, allow_cpu=False):
    """None when actual (on neuron; on CPU too with allow_cpu) is expected
    (on CPU), else a short reason. Tensors: the same dtype, shape, layout,
    conjugate and negative bits, strides of every dimension of length > 1,
    and the same bit pattern in every element (see _bits_differ). Sparse COO:
    dims, the coalesced flag, indices and values as stored. Sequences: the
    same type and length, element by element. Python scalars: the same type
    and bits (NaNs equal)."""
    import torch
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"expected a tensor, got {type(actual).__name__}"
        if actual.device.type != "neuron" and not (allow_cpu and actual.device.type == "cpu"):
            return f"result on {actual.device}, not neuron"
        a = actual.detach().cpu() if actual.device.type != "cpu" else actual.detach()
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
            r = compare(a._indices(), e._indices(), allow_cpu=True)
            if r:
                return f"sparse indices: {r}"
            r = compare(a._values(), e._values(), allow_cpu=True)
            return f"sparse values: {r}" if r else None
        if a.layout != torch.strided or e.layout != torch.strided:
            return f"layout {a.layout} vs {e.layout}"
        # The conjugate and negative bits and the strides of the neuron tensor
        # itself (its copy to CPU resolves the bits and may lay it out anew).
        bits_a, bits_e = (actual.is_conj(), actual.is_neg()), (e.is_conj(), e.is_neg())
        if bits_a != bits_e:
            return f"conj/neg bits {bits_a} vs {bits_e}"
        sa, se = significant_strides(actual), significant_strides(e)
        if sa != se:
            return f"strides {tuple(actual.stride())} vs {tuple(e.stride())} (shape {tuple(e.shape)})"
        if e.numel() == 0:
            return None
        diff = _bits_differ(a, e)
        if diff.any():
            idx = diff.nonzero()[0].tolist()
            return (f"values differ at {tuple(idx)}: {_element(a, idx)} vs {_element(e, idx)} "
                    f"({int(diff.sum())} of {e.numel()} elements)")[:300]
        return None
    if isinstance(expected, (list, tuple)):
        if type(actual) is not type(expected):
            return f"{type(actual).__name__} vs {type(expected).__name__}"
        if len(actual) != len(expected):
            return f"sequence length {len(actual)} vs {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            r = compare(a, e, allow_cpu)
            if r:
                return f"[{i}] {r}" if len(expected) > 1 else r
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or list(actual) != list(expected):
            return "dict keys differ"
        for k, e in expected.items():
            r = compare(actual[k], e, allow_cpu)
            if r:
                return f"[{k!r}] {r}"
        return None
    if isinstance(expected, (bool, int, float, complex)):
        return _scalar_differs(actual, expected)
    if isinstance(actual, torch.Tensor):
        return f"expected {type(expected).__name__}, got a tensor"
    return None if actual == expected else f"{actual!r} vs {expected!r}"[:200]


# ---------------------------------------------------------------------------
# Comparing errors.

# What may legitimately differ between an error raised on CPU and the same
# error raised on neuron, and nothing else:
#   - the device as ATen prints it: "cpu" on CPU, "neuron" or "neuron:<index>"
#     on neuron (c10::Device's and DeviceType's names, e.g. "expected device
#     cpu" / "expected device neuron:0");
#   - the dispatch key the call went through, named after the backend: "CPU" /
#     "PrivateUse1", also as the suffix of the per-backend keys ("SparseCPU",
#     "AutogradCPU", "QuantizedCPU", "NestedTensorCPU" / "...PrivateUse1");
#   - a tensor's repr inside a message (an argument list, say): it ends in
#     ", device='neuron:0'" for a neuron tensor and has no device for a CPU
#     tensor, so that suffix is dropped.
# Both sides are rewritten to the same placeholder; the rest of the message
# must match exactly (whitespace included).
_DEVICE = re.compile(r"\b(?:cpu|neuron)(?::\d+)?\b")
_KEY = re.compile(r"\b(Sparse|SparseCsr|Autograd|Quantized|NestedTensor|)(?:CPU|PrivateUse1)\b")
_REPR_DEVICE = ", device='<device>'"


def normalise_message(msg):
    return _KEY.sub(r"\1<backend>", _DEVICE.sub("<device>", msg)).replace(_REPR_DEVICE, "")


def first_line(e):
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"


def compare_errors(n_err, c_err):
    """None when neither raised, or both raised the same exception type with
    the same message (normalise_message); else a reason."""
    if c_err is None and n_err is None:
        return None
    if c_err is None:
        return f"neuron raised {first_line(n_err)}; CPU did not"
    if n_err is None:
        return f"CPU raised {first_line(c_err)}; neuron did not"
    if type(n_err) is not type(c_err):
        return f"neuron raised {first_line(n_err)}; CPU raised {first_line(c_err)}"
    nm, cm = normalise_message(str(n_err)), normalise_message(str(c_err))
    if nm != cm:
        # The first place they differ, with a little context.
        i = next((k for k, (x, y) in enumerate(zip(nm, cm)) if x != y), min(len(nm), len(cm)))
        lo = max(0, i - 40)
        return (f"both raised {type(c_err).__name__}, messages differ at {i}: "
                f"neuron {nm[lo:i + 60]!r} vs CPU {cm[lo:i + 60]!r}")
    return None


class Check:
    """The outcome of one check (an op or module, a dtype, a check) over its
    samples: pass when at least one sample's results were compared and none
    failed; both-raised when none was compared but samples raised the same
    error on both devices; skip when no sample ran (with the reasons)."""

    def __init__(self):
        self.compared = 0     # results compared, equal
        self.raised = 0       # raised the same error on both devices
        self.skipped = {}     # reason -> count
        self.failure = None   # the first failing sample's reason
        self.error = None     # the first error raised on both, for the report
        self.failed_samples = []  # indices of the failing samples (or what failed)
        self.failures = []        # each failing sample's reason (the first 100)

    def ok(self):
        self.compared += 1

    def both_raised(self, err=None):
        self.raised += 1
        if self.error is None and err is not None:
            self.error = first_line(err)[:120]

    def skip(self, reason):
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def fail(self, desc, reason):
        """A failing sample; desc starts with "sample <index>" when it is one
        (the checks go on with the other samples)."""
        if self.failure is None:
            self.failure = f"{desc}: {reason}"[:400]
        m = re.match(r"sample (\d+)", desc)
        self.failed_samples.append(int(m.group(1)) if m else desc)
        if len(self.failures) < 100:
            self.failures.append(f"{desc}: {reason}"[:240])

    @property
    def failed(self):
        return self.failure is not None

    def record(self, base, check):
        skipped = "; ".join(f"{n} skipped: {r}" for r, n in self.skipped.items())
        raised = (f"{self.raised} raised the same error on both"
                  + (f" (first: {self.error})" if self.error else "")) if self.raised else ""
        if self.failure is not None:
            n = len(self.failed_samples)
            status, detail = "fail", self.failure + (f" [{n} samples fail]" if n > 1 else "")
            return {**base, "check": check, "status": status, "detail": detail[:500],
                    "failed_samples": sorted(i for i in self.failed_samples if isinstance(i, int))
                    + [d for d in self.failed_samples if not isinstance(d, int)],
                    "failures": self.failures}
        elif self.compared:
            status = "pass"
            detail = "; ".join(x for x in (f"{self.compared} compared", raised, skipped) if x)
        elif self.raised:
            status, detail = "both-raised", "; ".join(x for x in (raised, skipped) if x)
        else:
            status, detail = "skip", skipped or "no samples"
        return {**base, "check": check, "status": status, "detail": detail[:400]}


# ---------------------------------------------------------------------------
# Worker half.

def worker_loop(names, run_item, out_path):
    """Runs run_item(name) -> records for each name, appending JSON lines to
    out_path with start/done markers the parent reads after a crash. The
    alarm covers each record (a check of an item), so an item with many
    checks is not cut short as a whole."""
    with open(out_path, "a") as out:
        for name in names:
            out.write(json.dumps({"start": name}) + "\n")
            out.flush()
            signal.alarm(ALARM_S)
            for rec in run_item(name):
                out.write(json.dumps(rec) + "\n")
                out.flush()
                signal.alarm(ALARM_S)
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
        started, done, last = None, set(), None
        for line in open(path):
            rec = json.loads(line)
            if "start" in rec:
                started, last = rec["start"], None
            elif "done" in rec:
                done.add(rec["done"])
            else:
                records.append(rec)
                last = rec
        os.unlink(path)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:200]
            if started is None or started in done:
                # Died outside any item: nothing ran (import, set-up), or
                # everything did and the process failed on its way out.
                when = ("before running its first item" if started is None
                        else f"after its last item ({len(done)} done), on exit")
                lines = "\n".join(proc.stderr.strip().splitlines()[-8:])
                raise RuntimeError(f"conformance worker failed {when} with exit status "
                                   f"{proc.returncode}; its stderr ends:\n{lines}")
            after = f" (after {last['dtype']} {last['check']})" if last else ""
            records.append({"op": started, "dtype": "-", "check": "run", "status": "crash",
                            "detail": f"worker exited with {proc.returncode}{after}: {tail}"})
            pending = batch[batch.index(started) + 1:] + pending
    return records


def parse_shard(spec):
    """'i/n' (1 <= i <= n) -> (i, n)."""
    i, _, n = (spec or "1/1").partition("/")
    i, n = int(i), int(n)
    if not 1 <= i <= n:
        raise ValueError(f"--shard {spec}: want i/n with 1 <= i <= n")
    return i, n


def shard(names, spec):
    """Shard i of n: every n-th name from the i-th (neighbours in op_db are
    often variants of one op, of similar cost, so shards come out even)."""
    i, n = parse_shard(spec)
    return list(names)[i - 1::n]


def summarize(records, expected):
    """Counts per status (fail/crash matching an expected entry become xfail)
    and the unexpected failures."""
    counts = dict.fromkeys(STATUSES, 0)
    unexpected = []
    for r in records:
        key = (r["op"], r["dtype"], r["check"])
        if r["status"] in ("fail", "crash") and key in expected:
            reason, samples = expected[key]
            failed = set(r.get("failed_samples", []))
            if samples is None or failed == samples:
                # (raw_status: what the check gave, for merging shard reports)
                r["raw_status"], r["status"], r["reason"] = r["status"], "xfail", reason
            elif "expected" not in r:
                r["expected"] = f"expected to fail in samples {sorted(samples)} only: {reason}"
        counts[r["status"]] += 1
        if r["status"] in ("fail", "crash"):
            unexpected.append(r)
    return counts, unexpected


def counts_by_check(records):
    out = {}
    for r in records:
        out.setdefault(r["check"], dict.fromkeys(STATUSES, 0))[r["status"]] += 1
    return out


def stale_expected(records, expected):
    """Expected-failure entries whose check ran and did not fail (the file
    only shrinks: these should be deleted)."""
    ok = {(r["op"], r["dtype"], r["check"]) for r in records
          if r["status"] in ("pass", "both-raised", "skip")}
    return sorted(k for k in expected if k in ok)


def counts_line(counts):
    total = sum(counts.values())
    rate = 100.0 * counts["pass"] / total if total else 0.0
    return (f"{counts['pass']} pass, {counts['both-raised']} both-raised, {counts['fail']} fail, "
            f"{counts['xfail']} xfail, {counts['skip']} skip, {counts['crash']} crash "
            f"of {total} checks ({rate:.2f}% pass)")


def report(records, expected, path=None, meta=None, quiet=False):
    """Prints unexpected failures, stale expected entries, the counts per
    check and the summary line; writes the JSON report; returns the exit
    status (1 on any unexpected failure, crash or stale entry). A run of the
    first samples only (meta max_samples) cannot tell stale entries."""
    counts, unexpected = summarize(records, expected)
    stale = [] if (meta or {}).get("max_samples") else stale_expected(records, expected)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"meta": meta or {}, "counts": counts, "by_check": counts_by_check(records),
                       "records": records}, f, indent=1)
    if not quiet:
        for r in unexpected:
            print(f"{r['status'].upper():5} {r['op']} {r['dtype']} {r['check']}: {r['detail']}"
                  + (f" (failing samples {r['failed_samples']}; {r['expected']})"
                     if "expected" in r else ""))
        for k in stale:
            print(f"STALE {' '.join(k)}: does not fail now; remove it from the expected-failures file")
        for check, c in counts_by_check(records).items():
            print(f"  {check:18} {counts_line(c)}")
    print(counts_line(counts))
    return 1 if unexpected or stale else 0


def merge(paths, all_names, expected, path=None):
    """Merges shard reports (JSON, as report() writes them with meta
    {"names": [...], "wall_s": ...}) into one report; it is an error if the
    shards do not cover all_names exactly once."""
    records, seen, walls = [], [], []
    for p in sorted(paths):
        with open(p) as f:
            rep = json.load(f)
        # Statuses as the worker gave them (report() turned some into xfail).
        for r in rep["records"]:
            if r["status"] == "xfail":
                r["status"] = r.pop("raw_status")
                r.pop("reason", None)
        names = set(rep["meta"]["names"])
        stray = sorted({r["op"] for r in rep["records"]} - names)
        if stray:
            raise SystemExit(f"{p} has records of items outside its shard: {stray[:10]}")
        records += rep["records"]
        seen += rep["meta"]["names"]
        walls.append(rep["meta"].get("wall_s", 0.0))
    missing = sorted(set(all_names) - set(seen))
    twice = sorted({n for n in seen if seen.count(n) > 1})
    extra = sorted(set(seen) - set(all_names))
    if missing or twice or extra:
        raise SystemExit(f"shard reports {paths} do not cover the suite: missing {missing[:10]}, "
                         f"twice {twice[:10]}, unknown {extra[:10]}")
    print(f"{len(paths)} shards, {len(all_names)} items; longest shard {max(walls):.0f} s, "
          f"all shards {sum(walls):.0f} s")
    meta = {"names": list(all_names), "shards": len(paths), "wall_s": max(walls)}
    return report(records, expected, path, meta)


def shard_paths(pattern):
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise SystemExit(f"no shard reports match {pattern}")
    return paths


def timed(fn):
    t = time.monotonic()
    out = fn()
    return out, time.monotonic() - t
