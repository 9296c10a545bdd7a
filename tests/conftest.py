"""Shared fixtures for the neuron backend suites.

Every test compares work done on the ``neuron`` device against PyTorch CPU.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "conformance"))
import harness  # noqa: E402

import torchneuron  # noqa: F401  (explicit: also loaded by torch's autoload)

NEURON = torch.device("neuron")

LAUNCH_BLOCKING = os.environ.get("NEURON_LAUNCH_BLOCKING") == "1"
# For tests that observe asynchronous execution (meaningless when every
# launch runs synchronously on the calling thread).
requires_async = pytest.mark.skipif(
    LAUNCH_BLOCKING, reason="observes asynchronous execution; NEURON_LAUNCH_BLOCKING=1")


# Compile-heavy tests (models, the OpInfo slice, AOTInductor packages) run in
# make test's plain pass; the NEURON_LAUNCH_BLOCKING=1 pass reruns the light
# ones (kernels then run inside their launch), to keep make test's time down.
compile_heavy = pytest.mark.skipif(
    LAUNCH_BLOCKING, reason="compile-heavy: run in the plain pass only")


# Multi-process suites (tests/distributed): their launch-blocking behaviour
# is covered by the collective matrix, point-to-point and pipeline tests;
# the rest run in the plain pass only (each launch starts interpreters).
plain_pass_only = pytest.mark.skipif(
    LAUNCH_BLOCKING, reason="multi-process suite: plain pass only (NEURON_LAUNCH_BLOCKING=1)")


def pytest_configure(config):
    config.addinivalue_line("markers", "multidevice: needs at least two neuron devices")
    config.addinivalue_line(
        "markers", "slow_distributed: 4-process distributed runs (make test-distributed-long)")


def _reset_streams_and_device():
    for i in range(torch.neuron.device_count()):
        torch.neuron.set_stream(torch.neuron.default_stream(i))
    torch.neuron.set_device(0)


@pytest.fixture(autouse=True)
def _default_stream_and_device():
    """Each test starts on device 0 and the default streams, and leaves no queued work."""
    _reset_streams_and_device()
    yield
    for i in range(torch.neuron.device_count()):
        torch.neuron.synchronize(i)
    _reset_streams_and_device()


@pytest.fixture
def two_devices():
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices (NEURON_RT_NUM_CORES>=2)")


def cpu_has_flag(flag: str) -> bool:
    """Whether /proc/cpuinfo lists `flag` (avx2, avx512f, ...) for this CPU."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and flag in line.split() for line in f)
    except OSError:
        return False


def run_python(code: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter (for autoload, fork and conflict checks)."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=full_env, timeout=timeout,
    )


def assert_same(neuron_result, cpu_result):
    """neuron_result must be on neuron and be cpu_result exactly, as the
    conformance suites compare (tests/conformance/harness.py compare): the
    same dtype, shape and strides (of dimensions of length > 1) and the same
    bits in every element (-0.0 is not +0.0; NaNs equal); sequences element
    by element."""
    reason = harness.compare(neuron_result, cpu_result)
    assert reason is None, reason


def chrome_trace_events(prof):
    """The events of a finished torch.profiler session, as its Chrome trace has them."""
    import json
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)["traceEvents"]
    finally:
        os.remove(path)
