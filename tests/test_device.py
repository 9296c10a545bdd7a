"""Registration, the torch.neuron device module, autoload, conflicts, fork safety."""
import pytest
import torch

import torchneuron
from conftest import LAUNCH_BLOCKING, run_python


def test_backend_is_registered_as_neuron():
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert torch.neuron is torchneuron.neuron
    assert torch.neuron.is_available()
    assert torch.neuron.device_count() >= 1
    assert torch.accelerator.current_accelerator().type == "neuron"
    assert torch.accelerator.device_count() == torch.neuron.device_count()


def test_tensor_lives_in_device_memory():
    x = torch.arange(6, dtype=torch.float32, device="neuron")
    assert x.device == torch.device("neuron", 0)
    assert x.is_neuron
    # The data pointer belongs to the runtime's device arena.
    assert torchneuron._C._pointer_device(x.data_ptr()) == 0
    torch.testing.assert_close(x.cpu(), torch.arange(6, dtype=torch.float32))


def test_generated_methods():
    cpu = torch.randn(3)
    x = cpu.neuron()
    assert x.is_neuron and not cpu.is_neuron
    torch.testing.assert_close(x.cpu(), cpu)
    m = torch.nn.Linear(2, 2).neuron()
    assert m.weight.device.type == "neuron"
    s = torch.UntypedStorage(8).neuron()
    assert s.device.type == "neuron" and s.is_neuron


def test_current_device_and_context(two_devices):
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        y = torch.ones(2, device="neuron")
        assert y.device == torch.device("neuron", 1)
        assert torchneuron._C._pointer_device(y.data_ptr()) == 1
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device("neuron:1")
    assert torch.neuron.current_device() == 1
    assert torch.accelerator.current_device_index() == 1
    torch.neuron.set_device(0)
    z = torch.zeros(3, device="neuron:1")
    with torch.neuron.device_of(z):
        assert torch.neuron.current_device() == 1


def test_invalid_device_index_raises():
    with pytest.raises(RuntimeError, match="Invalid neuron device index"):
        torch.empty(1, device=f"neuron:{torch.neuron.device_count()}")


def test_properties_and_capabilities():
    props = torch.neuron.get_device_properties(0)
    assert props.name == torch.neuron.get_device_name(0)
    assert "NeuronCore" in props.name
    free, total = torch.neuron.mem_get_info(0)
    assert props.total_memory == total and 0 < free <= total
    assert torch.float16 in torch.neuron.get_amp_supported_dtype()
    assert torch.bfloat16 in torch.neuron.get_amp_supported_dtype()
    assert torch.neuron.is_bf16_supported()
    assert torch.neuron.is_initialized() and torch.neuron._initialized
    assert not torch.neuron._is_in_bad_fork()


def test_synchronize_waits_for_queued_work():
    x = torch.ones(1000, device="neuron")
    y = x * 3
    torch.neuron.synchronize()
    torch.accelerator.synchronize()
    torch.testing.assert_close(y.cpu(), torch.full((1000,), 3.0))


def test_autoload_through_entry_point():
    r = run_python("""
        import sys, torch
        print(torch._C._get_privateuse1_backend_name(), 'torchneuron' in sys.modules)
        print(torch.ones(2, device='neuron').add(1).cpu().tolist())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["neuron", "True", "[2.0,", "2.0]"]


def test_autoload_can_be_disabled():
    r = run_python("""
        import sys, torch
        print(torch._C._get_privateuse1_backend_name(), 'torchneuron' in sys.modules)
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["privateuseone", "False"]


def test_conflicting_privateuse1_backend_is_named():
    r = run_python("""
        import torch
        torch.utils.rename_privateuse1_backend('otherdev')
        import torchneuron
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode != 0
    assert "already claimed by the backend 'otherdev'" in r.stderr


def test_fork_after_init_is_a_bad_fork():
    r = run_python("""
        import os, torch
        x = torch.ones(4, device='neuron') * 2
        pid = os.fork()
        if pid == 0:
            bad = torch.neuron._is_in_bad_fork() and not torch.neuron.is_initialized()
            try:
                torch.neuron.init()
                ok = False
            except RuntimeError as e:
                ok = 'forked subprocess' in str(e)
            os._exit(0 if (bad and ok) else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), torch.neuron._is_in_bad_fork(), x.sum().item())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "False", "8.0"]


def test_fork_before_init_is_fine():
    r = run_python("""
        import os, torch
        pid = os.fork()
        if pid == 0:
            ok = not torch.neuron._is_in_bad_fork()
            os._exit(0 if ok and torch.ones(2, device='neuron').sum().item() == 2 else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0"]


def test_import_torchneuron_before_torch():
    r = run_python("""
        import torchneuron, torch
        print(torch.ones(2, device='neuron').sum().item())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2.0"]


@pytest.mark.parametrize("value,message", [
    ("abc", "NEURON_RT_NUM_CORES"),
    ("0", "No neuron devices are visible"),
])
def test_unusable_runtime_is_reported_not_crashed(value, message):
    r = run_python("""
        import torch
        print(torch.neuron.is_available(), torch.neuron.device_count())
        try:
            torch.ones(1, device='neuron')
        except RuntimeError as e:
            print('ERROR', e)
    """, env={"NEURON_RT_NUM_CORES": value})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("False 0")
    assert "ERROR" in r.stdout and message in r.stdout


def test_visible_cores_select_devices():
    r = run_python("""
        import torch
        p = torch.neuron.get_device_properties(0)
        print(torch.neuron.device_count(), p.physical_core)
        x = torch.ones(3, device='neuron:0') * 2
        print(x.sum().item())
    """, env={"NEURON_RT_NUM_CORES": "3", "NEURON_RT_VISIBLE_CORES": "2"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "2", "6.0"]


def test_kernels_compute_with_torchs_thread_count():
    """Kernels run on executor threads, whose OpenMP thread count is their own:
    the device carries torch.set_num_threads over to them."""
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            torch.ones(4, device="neuron").add(1)  # a launch publishes the count
            assert torchneuron._C._kernel_compute_threads() == n
    finally:
        torch.set_num_threads(before)
    torch.ones(4, device="neuron").add(1)
    assert torchneuron._C._kernel_compute_threads() == before


def test_compute_threads_setting_is_applied():
    r = run_python("""
        import torch, torchneuron
        torch.set_num_threads(2)
        x = torch.ones(4, device="neuron") + 1
        print(torchneuron._C._kernel_compute_threads(),
              torch.neuron.get_device_properties(0).compute_threads, torch.get_num_threads())
    """, env={"NEURON_RT_COMPUTE_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    # Under NEURON_LAUNCH_BLOCKING=1 kernels run on the calling thread, with its own
    # count; torch's setting is never changed.
    kernel = "2" if LAUNCH_BLOCKING else "1"
    assert r.stdout.split() == [kernel, "1", "2"], r.stdout


MKL_PROBE = """
    import torch, torchneuron
    for n in (1, 2, 1):
        torch.set_num_threads(n)
        x = torch.ones(4, device="neuron") + 1  # a launch publishes the counts
        count, own = torchneuron._C._kernel_mkl_threads()
        print(n, count, own)
"""


def test_kernels_mkl_count_follows_openmps():
    # A worker's MKL computes with the worker's OpenMP count, torch's, with
    # no MKL count of the worker's own: one makes MKL fork threads inside
    # OpenMP regions too (CPU's flash attention calls sgemm inside one;
    # ComputeThreads.cpp).
    r = run_python(MKL_PROBE)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    if rows[0][1] == "-1":
        pytest.skip("torch without MKL")
    if LAUNCH_BLOCKING:
        # The kernel ran on the user's thread, left as it is: MKL's count
        # there is the one torch.set_num_threads gave it.
        assert [row[:2] for row in rows] == [["1", "1"], ["2", "2"], ["1", "1"]], r.stdout
        return
    assert rows == [["1", "1", "0"], ["2", "2", "0"], ["1", "1", "0"]], r.stdout


def test_configured_compute_threads_reach_mkl():
    # NEURON_RT_COMPUTE_THREADS=2 over torch.set_num_threads(1): the
    # worker's MKL uses 2 whatever the user's thread uses, still without a
    # count of its own.
    r = run_python(MKL_PROBE, env={"NEURON_RT_COMPUTE_THREADS": "2"})
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    if rows[0][1] == "-1":
        pytest.skip("torch without MKL")
    if LAUNCH_BLOCKING:
        # On the user's thread the configured count does not apply (as for
        # OpenMP's, test_compute_threads_setting_is_applied).
        assert [row[:2] for row in rows] == [["1", "1"], ["2", "2"], ["1", "1"]], r.stdout
        return
    assert rows == [["1", "2", "0"], ["2", "2", "0"], ["1", "2", "0"]], r.stdout


NICE_PROBE = """
    import os, threading, torch, torchneuron
    torch.set_num_threads(2)
    main = threading.get_native_id()
    def nices():
        out = {}
        for t in os.listdir("/proc/self/task"):
            try:
                out[int(t)] = os.getpriority(os.PRIO_PROCESS, int(t))
            except OSError:
                pass  # a thread that just exited
        return out
    a = torch.randn(1024, 1024, device="neuron")
    for _ in range(30):
        a = a @ a / 1024  # parallel kernels (~1 s), queued: they run while we look
    import time; time.sleep(0.3)
    during = nices()
    torch.neuron.synchronize()
    lowered = sorted(n for t, n in during.items() if t != main and n > during[main])
    print(during[main], len(lowered), lowered[:1])
"""


def test_device_threads_run_below_the_host_only_when_asked():
    # By default the executor's workers and their OpenMP team threads keep
    # the host's priority (a lower one starves them beside other work:
    # ComputeThreads.cpp). TORCHNEURON_COMPUTE_NICE lowers theirs (created by
    # a worker, team threads inherit it); the host's own is untouched.
    r = run_python(NICE_PROBE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["0", "0"], r.stdout

    r = run_python(NICE_PROBE, env={"TORCHNEURON_COMPUTE_NICE": "5"})
    assert r.returncode == 0, r.stderr
    host, lowered, first = r.stdout.strip().split(maxsplit=2)
    assert host == "0"
    if LAUNCH_BLOCKING:
        assert lowered == "0"  # work runs on the user's thread: left as it is
    else:
        assert int(lowered) >= 2 and first == "[5]", r.stdout  # a worker and its team

    r = run_python("""
        import torch, torchneuron
        try:
            torch.ones(4, device="neuron").add(1)
        except RuntimeError as e:
            print("raised", "TORCHNEURON_COMPUTE_NICE=high" in str(e))
        print((torch.ones(4) + 1).sum().item())
    """, env={"TORCHNEURON_COMPUTE_NICE": "high"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["raised", "True", "8.0"], r.stdout


def test_idle_openmp_teams_are_released():
    # libgomp's workers spin between regions only while all live teams fit the
    # cores; an idle team elsewhere makes every region pay OS wake-ups (see
    # csrc/core/ComputeThreads.cpp). So the launching thread's idle CPU team
    # goes at a launch, and the device's goes when its worker falls idle:
    # counted here as the process's threads (a team of 2 is one extra thread).
    r = run_python("""
        import os, time, torch, torchneuron
        torch.set_num_threads(2)
        def threads():
            time.sleep(0.2)  # executor workers poll ~0.2 ms, then go idle
            return len(os.listdir("/proc/self/task"))
        big = torch.ones(1 << 20)
        torch.ones(4, device="neuron").add(1).cpu()  # the runtime's threads start
        base = threads()
        (big * 2).sum()  # a parallel CPU op: the host thread gets a team
        with_cpu_team = threads()
        x = torch.ones(1 << 20, device="neuron")
        y = (x * 2).sum()  # a launch releases the host's team; the device computes
        torch.neuron.synchronize()
        after_device = threads()
        (big * 2).sum()
        print(base, with_cpu_team, after_device, threads(), torch.get_num_threads(),
              y.item() == (big * 2).sum().item())
    """)
    assert r.returncode == 0, r.stderr
    base, with_cpu_team, after_device, cpu_again, n, same = r.stdout.split()
    if LAUNCH_BLOCKING:
        # Device work runs on the host thread: its team is the device's and stays.
        assert int(after_device) == int(with_cpu_team), r.stdout
    else:
        assert int(with_cpu_team) == int(base) + 1, r.stdout
        assert int(after_device) == int(base), r.stdout  # both teams released
        assert int(cpu_again) == int(base) + 1, r.stdout  # CPU builds its team again
    assert n == "2" and same == "True", r.stdout
