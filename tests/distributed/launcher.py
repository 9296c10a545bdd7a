"""Runs a worker function on N ranks, each its own process, as torchrun would.

Every rank gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and runs
``python -m tests.distributed.<module> <function> <outdir>``; the function
returns a picklable result (tensors on CPU) that the launcher hands back, one
per rank. Every launch is bounded by a timeout: a hang kills all ranks and
fails the test with each rank's output.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RanksFailed(AssertionError):
    pass


def run_ranks(module: str, function: str, world_size: int = 2, timeout: float = 180,
              env: dict | None = None, expect_failure: set[int] | None = None) -> list:
    """Results of `function` on each rank (None for a rank expected to fail)."""
    # A port per function: a group made after another was destroyed must not
    # meet the old store (its server may still be closing).
    ports = [str(free_port()) for _ in function.split(",")]
    expect_failure = expect_failure or set()
    with tempfile.TemporaryDirectory(prefix="neuron-dist-") as out:
        procs = []
        for rank in range(world_size):
            e = dict(os.environ)
            e.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                     LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=ports[0],
                     NEURON_TEST_PORTS=",".join(ports),
                     OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + e.get("PYTHONPATH", ""))
            e.update(env or {})
            log = open(Path(out) / f"rank{rank}.log", "w+")
            procs.append((subprocess.Popen(
                [sys.executable, "-m", f"tests.distributed.{module}", function, out],
                cwd=ROOT, env=e, stdout=log, stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + timeout
        timed_out = False
        for p, _ in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            for p, _ in procs:
                p.kill()
            for p, _ in procs:
                p.wait()
        logs = []
        for rank, (p, log) in enumerate(procs):
            log.seek(0)
            logs.append(f"--- rank {rank} (exit {p.returncode}) ---\n{log.read()[-6000:]}")
            log.close()
        if timed_out:
            raise RanksFailed(f"{module}.{function} timed out after {timeout} s\n" + "\n".join(logs))
        results = []
        for rank, (p, _) in enumerate(procs):
            if rank in expect_failure:
                results.append(None)
                continue
            if p.returncode != 0:
                raise RanksFailed(f"{module}.{function}: rank {rank} exited {p.returncode}\n"
                                  + "\n".join(logs))
            results.append(torch.load(Path(out) / f"result{rank}.pt", weights_only=False))
        return results


def main() -> None:
    """The worker side: python -m tests.distributed.<module> <function>[,<function>...] <outdir>.

    Several functions run one after the other in the same processes (each
    makes and destroys its own process group), which saves interpreter
    start-ups; the result is then a dict by function name."""
    functions, out = sys.argv[1].split(","), sys.argv[2]
    main_module = sys.modules["__main__"]
    if len(functions) == 1:
        result = getattr(main_module, functions[0])()
    else:
        result = {}
        for f, port in zip(functions, os.environ["NEURON_TEST_PORTS"].split(",")):
            os.environ["MASTER_PORT"] = port
            result[f] = getattr(main_module, f)()
    torch.save(result, Path(out) / f"result{os.environ['RANK']}.pt")
