"""Process life cycle: exit after work, fork, torch.multiprocessing, configuration.

Every case runs in a fresh interpreter with a timeout, so a hang fails the test
instead of stalling the suite.
"""
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from multiprocessing.reduction import ForkingPickler

from conftest import run_python

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300  # seconds; generous for a loaded machine, a hang still fails
BAD_FORK = "Cannot re-initialize neuron in forked subprocess. To use neuron with " \
           "multiprocessing, you must use the 'spawn' start method"


def test_exit_after_backward_never_aborts():
    """50 processes that run a backward (nothing synchronised) and exit: all clean."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "exit_stress.py"), "--runs", "50"],
                       capture_output=True, text=True, timeout=2 * TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "50 clean, 0 not" in r.stdout, r.stdout


def test_exit_with_work_queued_waits_for_it():
    # The queued kernels run before the interpreter tears down, not during it.
    r = run_python("""
        import torch
        x = torch.randn(256, 256, device='neuron')
        torch.neuron._sleep(300000)
        for _ in range(20):
            x = (x @ x).tanh()
        print('queued')
    """, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["queued"]


# Device uses a forked child may try; each must raise the bad-fork error.
CHILD_USES = """
    import os
    uses = {
        'cpu': lambda: y.cpu(),
        'item': lambda: y[0].item(),
        'add': lambda: y + 1,
        'add_': lambda: y.add_(1),
        'empty': lambda: torch.empty(3, device='neuron'),
        'to': lambda: torch.ones(3).to('neuron'),
        'synchronize': lambda: torch.neuron.synchronize(),
        'stream': lambda: torch.neuron.Stream(),
        'print': lambda: str(y),
    }
    failures = []
    for name, use in uses.items():
        try:
            use()
            failures.append(name + ': no error')
        except RuntimeError as e:
            if BAD_FORK not in str(e):
                failures.append(name + ': ' + str(e)[:200])
    del y  # an inherited tensor is dropped without a crash
"""


@pytest.mark.parametrize("parent_busy", [True, False], ids=["parent-busy", "parent-idle"])
def test_os_fork_child_gets_bad_fork_error(parent_busy):
    r = run_python(f"""
        import os, sys, torch
        BAD_FORK = {BAD_FORK!r}
        y = torch.arange(4.0, device='neuron') * 2
        if {parent_busy}:
            torch.neuron._sleep(3000000)   # work still queued at the fork
            y = y + 1
        else:
            torch.neuron.synchronize()
        pid = os.fork()
        if pid == 0:
{textwrap.indent(textwrap.dedent(CHILD_USES), ' ' * 12)}
            sys.stderr.write('\\n'.join(failures))
            sys.stderr.flush()
            os._exit(1 if failures else 0)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), y.sum().item())
    """, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "16.0" if parent_busy else "12.0"], r.stdout + r.stderr


def test_multiprocessing_fork_child_gets_bad_fork_error(tmp_path):
    script = tmp_path / "mp_fork.py"
    script.write_text(textwrap.dedent(f"""
        import torch, torch.multiprocessing as mp
        BAD_FORK = {BAD_FORK!r}

        def child(x, out):
            try:
                x.cpu()
                out.put('no error')
            except RuntimeError as e:
                out.put(str(e))

        if __name__ == '__main__':
            x = torch.ones(3, device='neuron')
            torch.neuron._sleep(2000000)
            x = x * 3
            ctx = mp.get_context('fork')
            out = ctx.Queue()
            p = ctx.Process(target=child, args=(x, out))
            p.start()
            msg = out.get(timeout=120)
            p.join(120)
            print(BAD_FORK in msg, p.exitcode, x.sum().item())
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "0", "9.0"], r.stdout + r.stderr


SHARING = "cannot be sent to another process"


def test_pickling_neuron_tensor_for_multiprocessing_raises_at_once():
    x = torch.ones(3, device="neuron")
    for obj in (x, torch.nn.Parameter(x.clone()), x.untyped_storage(), x[1:],
                {"nested": [x]}):
        with pytest.raises(RuntimeError, match=SHARING):
            ForkingPickler.dumps(obj)
    # CPU tensors are shared as before; plain pickling (torch.save's route) is untouched.
    assert ForkingPickler.dumps(torch.ones(3))
    assert torch.equal(pickle.loads(pickle.dumps(x)).cpu(), torch.ones(3))


def test_spawn_queue_of_neuron_tensor_errors_instead_of_hanging(tmp_path):
    script = tmp_path / "mp_spawn.py"
    script.write_text(textwrap.dedent("""
        import warnings
        import torch, torch.multiprocessing as mp

        def consumer(q, out):
            try:
                t = q.get(timeout=120)
                out.put('received ' + str(t))
            except Exception as e:
                out.put(type(e).__name__ + ': ' + str(e))

        if __name__ == '__main__':
            ctx = mp.get_context('spawn')
            x = torch.ones(3, device='neuron')
            # Synchronous pickling raises in the producer at once.
            try:
                ctx.SimpleQueue().put(x)
                print('simplequeue: no error')
            except RuntimeError as e:
                print('simplequeue:', 'cannot be sent to another process' in str(e))
            q, out = ctx.Queue(), ctx.Queue()
            p = ctx.Process(target=consumer, args=(q, out))
            p.start()
            with warnings.catch_warnings(record=True):
                q.put(x)  # pickled by the feeder thread: the consumer gets the error
            msg = out.get(timeout=240)
            p.join(60)
            print('queue:', msg.split(':')[0], 'cannot be sent to another process' in msg)
            try:
                ctx.Process(target=consumer, args=(x, out)).start()
                print('spawn args: no error')
            except RuntimeError as e:
                print('spawn args:', 'cannot be sent to another process' in str(e))
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "simplequeue: True", "queue: NeuronSharingError True", "spawn args: True"], \
        r.stdout + r.stderr


@pytest.mark.parametrize("var,value,expected", [
    ("NEURON_RT_NUM_CORES", "128", "from 0 to 64"),
    ("NEURON_RT_NUM_CORES", "300", "from 0 to 64"),
    ("NEURON_RT_NUM_CORES", "1024", "from 0 to 64"),
    ("NEURON_RT_MEMORY_PER_CORE", "1M", "from 64M to 1T"),
])
def test_out_of_range_configuration_is_a_clear_error(var, value, expected):
    r = run_python("""
        import warnings, torch
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            print('count', torch.neuron.device_count(), torch.neuron.is_available())
        print('warning', ' '.join(str(x.message) for x in w))
        try:
            torch.ones(1, device='neuron')
            print('ERROR none')
        except RuntimeError as e:
            print('ERROR', str(e).replace('\\n', ' '))
    """, env={var: value}, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "count 0 False", r.stdout
    for line in lines[1:]:
        assert f"{var}={value}" in line and expected in line, r.stdout
