"""Exit-after-backward stress: processes that run one backward on neuron and exit.

Every process must exit with status 0: an abort at exit ("terminate called
without an active exception"), a crash or a hang is counted and printed.

    python scripts/exit_stress.py --runs 200            # forked from one parent
    python scripts/exit_stress.py --runs 200 --fresh    # a new interpreter each

The default forks each run from a parent that imported torch but never touched
the device, so a run costs the backward and the exit, not the import; each
child starts the device itself, runs, and exits through the normal interpreter
shutdown (Py_Finalize, then C++ static destructors), as a script does.
``--fresh`` starts a new interpreter per run (slower, the literal case).
Exit status: 0 when every run exited cleanly, 1 otherwise.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

# The work of one run: forward and backward of a small model, an optimizer step,
# nothing synchronised, so device work can still be queued when the script ends.
WORK = """
import torch
torch.manual_seed({seed})
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 10)).to("neuron")
x = torch.randn(32, 64, device="neuron")
y = torch.randint(0, 10, (32,), device="neuron")
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward()
torch.optim.SGD(model.parameters(), lr=0.1).step()
"""


def describe(status: int) -> str:
    if status >= 0:
        return f"exit status {status}"
    try:
        return f"signal {signal.Signals(-status).name}"
    except ValueError:
        return f"signal {-status}"


def run_fresh(i: int, timeout: float) -> tuple[int, str]:
    try:
        r = subprocess.run([sys.executable, "-c", WORK.format(seed=i)], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return (None, "hung")
    return (r.returncode, r.stderr[-2000:])


def run_forked(runs: int, jobs: int, timeout: float) -> list[tuple[int | None, str]]:
    import torch  # noqa: F401  (loads the backend; the device stays untouched)

    if getattr(torch, "neuron", None) is None or torch.neuron.is_initialized():
        raise SystemExit("exit_stress: the parent must not initialise neuron")
    results: list[tuple[int | None, str]] = []
    live: dict[int, tuple[int, float, int]] = {}  # pid -> (run, start, stderr fd)
    next_run = 0
    while next_run < runs or live:
        while next_run < runs and len(live) < jobs:
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                os.dup2(write_fd, 2)
                os.close(write_fd)
                exec(compile(WORK.format(seed=next_run), "<exit-stress-run>", "exec"),
                     {"__name__": "__main__"})
                # Leave through the normal interpreter shutdown, as a script does.
                sys.exit(0)
            os.close(write_fd)
            live[pid] = (next_run, time.monotonic(), read_fd)
            next_run += 1
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for p, (run, start, fd) in list(live.items()):
                if time.monotonic() - start > timeout:
                    os.kill(p, signal.SIGKILL)
                    os.waitpid(p, 0)
                    os.close(fd)
                    del live[p]
                    results.append((None, "hung"))
            time.sleep(0.005)
            continue
        run, start, fd = live.pop(pid)
        with os.fdopen(fd, "r", errors="replace") as f:
            err = f.read()[-2000:]
        results.append((os.waitstatus_to_exitcode(status), err))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=2, help="runs at once")
    ap.add_argument("--fresh", action="store_true", help="a new interpreter per run")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a run is hung")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    if args.fresh:
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda i: run_fresh(i, args.timeout), range(args.runs)))
    else:
        results = run_forked(args.runs, args.jobs, args.timeout)
    bad = [(status, err) for status, err in results if status != 0]
    kinds: dict[str, int] = {}
    for status, err in bad:
        kind = "hung" if status is None else describe(status)
        kinds[kind] = kinds.get(kind, 0) + 1
    mode = "fresh interpreters" if args.fresh else "forked from one parent"
    print(f"exit stress: {len(results)} runs ({mode}) in {time.monotonic() - t0:.1f} s: "
          f"{len(results) - len(bad)} clean, {len(bad)} not"
          + (f" ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})" if bad else ""))
    for status, err in bad[:3]:
        print(f"--- {'hung' if status is None else describe(status)}:\n{err.strip()}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
