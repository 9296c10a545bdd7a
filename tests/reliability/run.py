"""The reliability suite: the bad-input table (cases.py) and the soak
(soak.py), crash- and hang-isolated.

    python tests/reliability/run.py [--names a,b] [--no-soak] [--report F]

The parent starts one worker process (the pattern of
tests/conformance/harness.py: the worker announces each case before running
it, so a worker that dies or hangs is charged to that case and a new worker
resumes after it). The parent, not the worker, enforces the per-case time
limit: a case stuck inside a native call never returns to Python to see a
signal. After every case the worker checks that the device still computes
(synchronize, then a matmul bitwise equal to CPU's); a case that leaves it
broken, or whose error surfaces only at that synchronize, is `wrong`.

Each case ends clean / crash / hang / wrong. Expected failures live in
expected_failures.txt (name, two spaces, reason): such a case counts as xfail;
one that comes out clean is XPASS and fails the run (strict: the list only
shrinks). Exit status 0 when nothing unexpected happened.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "conformance"))

CASE_TIMEOUT_S = 30     # a hang is a bug; no case needs more than a second or two
SOAK_TIMEOUT_S = 120
START_TIMEOUT_S = 240   # importing torch on a loaded 2-core machine is slow
ENV_TIMEOUT_S = 150     # forked cases all run at once, next to the worker


def load_expected(path=os.path.join(HERE, "expected_failures.txt")):
    out = {}
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition("  ")
        assert reason.strip(), f"expected failure without a reason: {line}"
        out[name.strip()] = reason.strip()
    return out


# ---------------------------------------------------------------------------
# Worker half.

def _describe(e):
    from harness import first_line
    return first_line(e)


def _run(fn, device):
    try:
        return True, fn(device)
    except Exception as e:  # noqa: BLE001 - the exception is the result
        e.__traceback__ = None  # its frames would keep the case's tensors alive
        return False, e


def _judge(c):
    """(status, detail) of one case: clean or wrong."""
    import torch
    from harness import compare
    kind = c.expect[0]
    ok_n, val_n = _run(c.fn, "neuron")
    if kind == "cpu":
        ok_c, val_c = _run(c.fn, "cpu")
        if not ok_c:
            if ok_n:
                return "wrong", f"CPU raises {_describe(val_c)}; neuron accepted it"
            if not isinstance(val_n, type(val_c)):
                return "wrong", f"CPU raises {_describe(val_c)}; neuron raises {_describe(val_n)}"
            return "clean", f"both raise {type(val_c).__name__}"
        if not ok_n:
            return "wrong", f"CPU succeeds; neuron raises {_describe(val_n)}"
        diff = compare(val_n, val_c, allow_cpu=True)
        return ("wrong", f"result differs from CPU: {diff}") if diff else ("clean", "same as CPU")
    if kind == "raises":
        types, frag = c.expect[1], c.expect[2]
        want = "/".join(t.__name__ for t in types) + (f" with '{frag}'" if frag else "")
        if ok_n:
            return "wrong", f"expected {want}; neuron accepted it"
        if not isinstance(val_n, types):
            return "wrong", f"expected {want}; neuron raises {_describe(val_n)}"
        if frag and frag.lower() not in str(val_n).lower():
            return "wrong", f"expected {want}; message was: {_describe(val_n)}"
        return "clean", f"raises {type(val_n).__name__}"
    # ok
    if not ok_n:
        return "wrong", f"expected success; neuron raises {_describe(val_n)}"
    why = c.expect[1](val_n)
    return ("wrong", why) if why else ("clean", "ok")


_PROBE = {}


def _device_healthy():
    """None when the device still computes bitwise what CPU computes, else why."""
    import torch
    try:
        torch.neuron.synchronize()
    except Exception as e:  # noqa: BLE001
        return f"an error surfaced at the next synchronize: {_describe(e)}"
    if not _PROBE:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(48, 40, generator=g)
        b = torch.randn(40, 24, generator=g)
        _PROBE.update(a=a, b=b, want=a @ b)
    try:
        got = (_PROBE["a"].to("neuron") @ _PROBE["b"].to("neuron")).cpu()
    except Exception as e:  # noqa: BLE001
        return f"a matmul after the case raises {_describe(e)}"
    if not torch.equal(got, _PROBE["want"]):
        return "a matmul after the case differs from CPU"
    return None


def _reset():
    import torch
    for i in range(torch.neuron.device_count()):
        torch.neuron.set_stream(torch.neuron.default_stream(i))
    torch.neuron.set_device(0)


def _env_child(var, value, expect, out_path):
    """In a forked child that has not touched the runtime yet."""
    import torch
    os.environ[var] = value
    rec = {"name": f"env.{var}={value}"}
    try:
        try:
            n = torch.neuron.device_count()
        except Exception as e:  # noqa: BLE001
            n = None
            count_err = _describe(e)
        if expect == "bad":
            if n is not None and n != 0:
                raise AssertionError(f"device_count() is {n}: the value was accepted")
            try:
                torch.zeros(2, device="neuron").sum().item()
            except RuntimeError as e:
                if isinstance(e, torch.OutOfMemoryError) or var not in str(e):
                    raise AssertionError(f"the error does not name {var}: {_describe(e)}")
            else:
                raise AssertionError(f"accepted: device_count() {n}, tensors work")
        else:
            if n != expect:
                raise AssertionError(f"device_count() is {n}, expected {expect}"
                                     + ("" if n is not None else f" ({count_err})"))
            a = torch.arange(6.0).view(2, 3)
            if not torch.equal((a.to("neuron") @ a.t().to("neuron")).cpu(), a @ a.t()):
                raise AssertionError("matmul differs from CPU")
        rec.update(status="clean", detail="as expected")
    except Exception as e:  # noqa: BLE001
        rec.update(status="wrong", detail=_describe(e))
    with open(out_path, "w") as f:
        json.dump(rec, f)
    os._exit(0)


def _isolated_child(c, out_path):
    try:
        status, detail = _judge(c)
    except Exception as e:  # noqa: BLE001
        status, detail = "wrong", f"case raised outside the call: {_describe(e)}"
    health = _device_healthy()
    if health:
        status, detail = "wrong", f"{detail}; then {health}"
    with open(out_path, "w") as f:
        json.dump({"name": c.name, "status": status, "detail": detail}, f)
    os._exit(0)


def fork_cases(names):
    """Forks one child per environment case and per isolated case from the
    parent, which imports torch but never touches the runtime (its
    configuration is read once per process, and a child forked after that
    could not use the device); they run while the worker runs the rest, each
    with a runtime of its own."""
    import torch  # noqa: F401
    import torchneuron  # noqa: F401
    from cases import CASES, ENV_CASES
    children = []
    jobs = [(f"env.{var}={value}", lambda p, a=(var, value, expect): _env_child(*a, p))
            for var, value, expect in ENV_CASES]
    jobs += [(c.name, lambda p, c=c: _isolated_child(c, p)) for c in CASES if c.isolate]
    for name, job in jobs:
        if names is not None and name not in names:
            continue
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        pid = os.fork()
        if pid == 0:
            try:
                job(path)
            finally:
                os._exit(3)
        children.append((name, pid, path))
    return children


def collect_forked(children, deadline):
    records = []
    for name, pid, path in children:
        status = None
        while time.time() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            records.append({"name": name, "status": "hang", "detail": "no answer in time"})
            os.unlink(path)
            continue
        try:
            rec = json.load(open(path))
        except (OSError, ValueError):
            rec = {"name": name, "status": "crash",
                   "detail": f"child ended with wait status {status} and no result"}
        os.unlink(path)
        records.append(rec)
    return records


def worker(names, out_path):
    import torch
    import torchneuron  # noqa: F401
    from cases import CASES
    out = open(out_path, "a")

    def emit(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()

    emit({"ready": True})
    by_name = {c.name: c for c in CASES}
    for name in (names if names is not None else [c.name for c in CASES] + ["soak"]):
        if name.startswith("env.") or (name in by_name and by_name[name].isolate):
            continue
        t_case = time.time()
        emit({"start": name, "t": t_case})
        if name == "soak":
            import soak
            try:
                result = soak.run()
                rec = {"name": "soak", "status": "clean" if not result["problems"] else "wrong",
                       "detail": "; ".join(result["problems"]) or "bounded", "soak": result}
            except Exception as e:  # noqa: BLE001
                rec = {"name": "soak", "status": "wrong",
                       "detail": f"raised {_describe(e)}: {traceback.format_exc()[-400:]}"}
        else:
            try:
                status, detail = _judge(by_name[name])
            except Exception as e:  # noqa: BLE001 - a bug in the case itself
                status, detail = "wrong", f"case raised outside the call: {_describe(e)}"
            # Frees what the case left now, so a crash in a free is its own
            # (the young generations: a full collection costs half a second).
            gc.collect(1)
            health = _device_healthy()
            if health:
                status, detail = "wrong", f"{detail}; then {health}"
            rec = {"name": name, "status": status, "detail": detail}
        rec["secs"] = round(time.time() - t_case, 2)
        emit(rec)
        try:
            _reset()
        except Exception as e:  # noqa: BLE001
            emit({"name": name + ".reset", "status": "wrong", "detail": _describe(e)})
        emit({"done": name})
    out.close()


# ---------------------------------------------------------------------------
# Parent half.

def run_all(names, soak_on):
    sys.path.insert(0, HERE)
    from cases import CASES, ENV_CASES
    pending = [c.name for c in CASES if not c.isolate] + (["soak"] if soak_on else [])
    env_names = [f"env.{v}={x}" for v, x, _ in ENV_CASES] + [c.name for c in CASES if c.isolate]
    if names is not None:
        pending = [n for n in pending if n in names]
        env_names = [n for n in env_names if n in names]
    records = []
    t_start = time.time()
    # Cleared of PYTHONPATH-less imports: the parent imports torch to fork from.
    children = fork_cases(env_names) if env_names else []
    TIMES["fork"] = round(time.time() - t_start, 1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    while pending:
        fd, path = tempfile.mkstemp(suffix=".jsonl")
        os.close(fd)
        # Names go through a file: some contain commas (NEURON_RT_VISIBLE_CORES=0,0).
        names_path = path + ".names"
        with open(names_path, "w") as f:
            json.dump(pending, f)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--out", path,
               "--names-file", names_path]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        started = started_at = None
        done, pos, ready = set(), 0, False
        t0, killed = time.time(), None
        while True:
            try:
                with open(path) as f:
                    f.seek(pos)
                    chunk = f.read()
            except FileNotFoundError:  # (seen once under heavy load) treat as no news
                chunk = ""
            # Only whole lines; a partial one is read again next time.
            cut = chunk.rfind("\n") + 1
            pos += cut
            for line in chunk[:cut].splitlines():
                rec = json.loads(line)
                if "start" in rec:
                    started, started_at = rec["start"], time.time()
                elif "done" in rec:
                    done.add(rec["done"])
                elif "ready" in rec:
                    ready = True
                    TIMES.setdefault("worker start", round(time.time() - t0, 1))
                else:
                    records.append(rec)
            if proc.poll() is not None:
                break
            limit = SOAK_TIMEOUT_S if started == "soak" else CASE_TIMEOUT_S
            if started is not None and started not in done and time.time() - started_at > limit:
                killed = f"no progress in {limit} s"
                proc.kill()
            elif started is None and not ready and time.time() - t0 > START_TIMEOUT_S:
                killed = "the worker did not start"
                proc.kill()
            time.sleep(0.05)
        output = proc.stdout.read()
        os.unlink(path)
        os.unlink(names_path)
        if proc.returncode == 0:
            pending = [n for n in pending if n not in done]
            if pending:  # should not happen: say so rather than loop
                records += [{"name": n, "status": "crash", "detail": "never ran"} for n in pending]
            break
        tail = (output.strip().splitlines() or ["(no output)"])[-1][:200]
        if started is None or started in done:
            if not ready:
                raise RuntimeError(f"reliability worker failed before running: {output[-2000:]}")
            raise RuntimeError(f"reliability worker died between cases: {output[-2000:]}")
        status = "hang" if killed and "progress" in killed else "crash"
        detail = killed or f"worker exited with {proc.returncode}: {tail}"
        records.append({"name": started, "status": status, "detail": detail})
        pending = pending[pending.index(started) + 1:]
    TIMES["worker"] = round(time.time() - t_start, 1)
    records += collect_forked(children, t_start + ENV_TIMEOUT_S)
    TIMES["forked cases"] = round(time.time() - t_start, 1)
    return records


TIMES = {}


def summarize(records, expected):
    counts = {"clean": 0, "crash": 0, "hang": 0, "wrong": 0, "xfail": 0}
    problems = []
    for r in records:
        if r["name"] in expected:
            if r["status"] == "clean":
                problems.append(f"XPASS {r['name']}: clean now; remove it from expected_failures.txt")
                counts["clean"] += 1
            else:
                r["expected"] = expected[r["name"]]
                counts["xfail"] += 1
            continue
        counts[r["status"]] += 1
        if r["status"] != "clean":
            problems.append(f"{r['status'].upper():5} {r['name']}: {r['detail']}")
    seen = {r["name"] for r in records}
    return counts, problems, seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--names", help="comma-separated case names")
    ap.add_argument("--names-file", help="(worker) a JSON list of case names")
    ap.add_argument("--out")
    ap.add_argument("--no-soak", action="store_true")
    ap.add_argument("--report")
    args = ap.parse_args()
    names = args.names.split(",") if args.names else None
    if args.worker:
        if args.names_file:
            names = json.load(open(args.names_file))
        worker(names, args.out)
        return 0
    t0 = time.time()
    records = run_all(names, soak_on=not args.no_soak)
    expected = load_expected()
    counts, problems, seen = summarize(records, expected)
    for name in sorted(set(expected) - seen):
        if names is None:
            problems.append(f"STALE {name}: in expected_failures.txt but no such case")
    for p in problems:
        print(p)
    for r in records:
        if r["name"] == "soak" and "soak" in r:
            s = r["soak"]
            print("soak: " + ", ".join(f"{k} {v}" for k, v in s.items() if k != "problems"))
    slow = sorted((r for r in records if "secs" in r), key=lambda r: -r["secs"])[:4]
    print("time: " + ", ".join(f"{k} {v} s" for k, v in TIMES.items()) + "; slowest: "
          + ", ".join(f"{r['name']} {r['secs']} s" for r in slow))
    tried = sum(counts.values())
    print(f"reliability: {tried} tried, {counts['clean']} clean, {counts['crash']} crash, "
          f"{counts['hang']} hang, {counts['wrong']} wrong, {counts['xfail']} xfail "
          f"({time.time() - t0:.0f} s)")
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"counts": counts, "records": records}, f, indent=1)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
