"""``python -m torchneuron``: what this machine's neuron device is, and what a
script did on it.

    python -m torchneuron                 devices, memory, versions, configuration
    python -m torchneuron run SCRIPT ...  runs SCRIPT (with its arguments), then
                                          reports the path each op took and every
                                          host wait with its cause and call site
"""
from __future__ import annotations

import argparse
import collections
import os
import platform
import runpy
import sys

# The runtime's variables (read by the runtime) and the backend's (csrc/core/Config.cpp),
# with their defaults as documented in the README.
ENVIRONMENT = [
    ("NEURON_RT_NUM_CORES", "2"),
    ("NEURON_RT_VISIBLE_CORES", "all"),
    ("NEURON_RT_MEMORY_PER_CORE", "8G"),
    ("NEURON_RT_EXECUTOR_THREADS", "2"),
    ("NEURON_RT_QUEUE_DEPTH", "16384"),
    ("NEURON_RT_COMPUTE_THREADS", "host cores"),
    ("NEURON_LAUNCH_BLOCKING", "0"),
    ("TORCHNEURON_ASYNC", "1"),
    ("TORCH_DEVICE_BACKEND_AUTOLOAD", "1"),
]


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def report_environment(out=sys.stdout) -> int:
    import torch
    import torchneuron
    from torchneuron import _C

    p = lambda *a: print(*a, file=out)  # noqa: E731
    build = _C._build_info()
    p("versions")
    p(f"  torchneuron  {torchneuron.__version__} ({os.path.dirname(torchneuron.__file__)})")
    p(f"  torch        {torch.__version__}")
    p(f"  python       {platform.python_version()} ({sys.executable})")
    p(f"  compiler     {build['compiler']} (C++ {build['cplusplus']}, "
      f"assertions {'on' if build['assertions'] else 'off'})")
    p(f"  host         {platform.machine()}, {os.cpu_count()} cores, torch threads "
      f"{torch.get_num_threads()}")
    p("configuration (effective value; * = set in the environment)")
    for name, default in ENVIRONMENT:
        value = os.environ.get(name)
        p(f"  {'*' if value is not None else ' '} {name:28s} {value if value is not None else default}")
    try:
        n = torch.neuron.device_count()
    except RuntimeError as e:  # e.g. an invalid configuration
        p(f"devices: unavailable: {e}")
        return 1
    p(f"devices: {n}")
    for i in range(n):
        props = torch.neuron.get_device_properties(i)
        free, total = torch.neuron.mem_get_info(i)
        p(f"  neuron:{i}  {props.name}  core {props.physical_core}  memory {_gib(total)} "
          f"(free {_gib(free)}, allocated {_gib(torch.neuron.memory_allocated(i))}, "
          f"reserved {_gib(torch.neuron.memory_reserved(i))})")
        least, greatest = props.stream_priority_range
        p(f"            executor threads {props.executor_threads}, compute threads "
          f"{props.compute_threads}, stream priorities {greatest}..{least}")
    return 0


def _call_site(stack, script):
    """The innermost frame of the user's script, else the innermost frame."""
    for frame in reversed(stack):
        if os.path.abspath(frame[0]) == script:
            return frame
    return stack[-1] if stack else ("?", 0, "?")


def report_run(script: str, out=sys.stdout, top: int = 10) -> None:
    import torchneuron

    p = lambda *a: print(*a, file=out)  # noqa: E731
    paths = torchneuron.get_op_paths()
    totals = collections.Counter()
    p("\nop paths on neuron (native: dedicated kernel; async: queued; inline: ran on the "
      "host after a wait; fallback: synchronous path)")
    p(f"  {'op':50s} {'native':>8} {'async':>8} {'inline':>8} {'fallback':>8}")
    for op, rec in sorted(paths.items(), key=lambda kv: -sum(kv[1].values())):
        totals.update(rec)
        p(f"  {op[:50]:50s} {rec['native']:8d} {rec['async']:8d} {rec['inline']:8d} "
          f"{rec['fallback']:8d}")
    p(f"  {'total':50s} {totals['native']:8d} {totals['async']:8d} {totals['inline']:8d} "
      f"{totals['fallback']:8d}")
    counts = torchneuron.host_wait_counts()
    p(f"\nhost waits: {sum(counts.values())}" +
      (" (" + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ")" if counts else ""))
    sites = collections.Counter()
    for w in torchneuron.get_host_waits():
        f = _call_site(w["stack"], script)
        sites[(w["cause"], w["op"], f"{f[0]}:{f[1]} in {f[2]}")] += 1
    for (cause, op, where), n in sites.most_common(top):
        p(f"  {n:6d}  {cause:15s} {op:40s} {where}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchneuron", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run a script and report op paths and host waits")
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER)
    run.add_argument("--top", type=int, default=10, help="call sites of host waits to list")
    args = parser.parse_args(argv)
    if args.command != "run":
        return report_environment()
    import torchneuron

    script = os.path.abspath(args.script)
    sys.argv = [script] + args.args
    sys.path.insert(0, os.path.dirname(script))
    torchneuron.clear_op_tracking()
    status = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        report_run(script, top=args.top)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
