"""python -m torchneuron: the environment report and the op-path report of a script."""
import os
import subprocess
import sys
import textwrap

import torch


def _run(*args, cwd=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-m", "torchneuron", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd)


def test_environment_report():
    r = _run()
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"torch        {torch.__version__}" in out
    assert f"devices: {torch.neuron.device_count()}" in out
    assert "neuron:0" in out and "executor threads" in out
    assert "NEURON_RT_MEMORY_PER_CORE" in out and "compiler" in out


def test_run_reports_op_paths_and_host_waits(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        x = torch.ones(4, 4, device="neuron")
        for _ in range(3):
            y = (x @ x).relu()       # queued (the first call verified on scratch memory)
        print("value", y.sum().item(), sys.argv[1:])
        torch.nonzero(y)
    """))
    r = _run("run", str(script), "--flag", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "value 64.0 ['--flag']" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()
            if line.strip().startswith("aten::")}
    assert rows["aten::mm"] == ["0", "3", "0", "0"], out      # native async inline fallback
    assert rows["aten::nonzero"][3] == "1", out
    assert "scalar_read" in out and "data_dependent" in out
    # The call sites are the script's own lines.
    assert f"{script}:8 in <module>" in out and f"{script}:7 in <module>" in out
