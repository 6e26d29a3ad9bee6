"""A worker raising inside @record: muster's failure report is torchrun's,
line for line once times, PIDs and random directory names are set aside."""
import re
import subprocess
from pathlib import Path

import pytest

from muster_testing import DATA, DEBIAN_PYTHON, base_env, debian_torch_available, free_port, run_muster, torchrun_path

SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "pytorch" / "record_fail.py")

pytest.importorskip("torch", reason="the compatibility tests need PyTorch: scripts/install-deps.sh installs it")


def report(stderr):
    m = re.search(r"\n(=+\n.*? FAILED\n.*\n=+)\n", stderr, re.S)
    assert m, stderr
    return m.group(1)


def normalized(text):
    text = re.sub(r"time      : \S+", "time      : T", text)
    text = re.sub(r"\(pid: \d+\)", "(pid: P)", text)
    text = re.sub(r"PID \d+", "PID P", text)
    text = re.sub(r"error_file: /\S+/(attempt_\d+/\d+/error\.json)", r"error_file: \1", text)
    return text


def check_root_cause(text):
    root = text.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root
    assert "exitcode  : 1 (pid: " in root
    assert re.search(r"error_file: \S+/attempt_0/1/error\.json", root)
    assert 'raise ValueError(f"boom on rank{rank}")' in root
    assert "\n  ValueError: boom on rank1\n" in root


def test_record_report_matches_torchrun():
    m = run_muster(["--nproc-per-node=2", SCRIPT], timeout=300)
    t = subprocess.run([torchrun_path(), "--nproc-per-node=2", SCRIPT], env=base_env(), capture_output=True, text=True,
                       timeout=300)
    assert m.returncode == 1 and t.returncode == 1
    check_root_cause(report(m.stderr))
    check_root_cause(report(t.stderr))
    assert normalized(report(m.stderr)) == normalized(report(t.stderr))


@pytest.mark.skipif(not debian_torch_available(), reason="Debian's python3-torch 1.13 is not installed")
def test_record_report_under_torch_1_13():
    m = run_muster(["--nproc-per-node=2", SCRIPT], env=base_env(PYTHON_EXEC=DEBIAN_PYTHON), timeout=300)
    t = subprocess.run([DEBIAN_PYTHON, str(DATA / "torchrun113.py"), "--nproc_per_node=2",
                        f"--master_port={free_port()}", SCRIPT], env=base_env(), capture_output=True, text=True,
                       timeout=300)
    assert m.returncode == 1 and t.returncode == 1
    # 1.13 reports the same root cause; muster also lists the peer it stopped, as torch 2.x does.
    check_root_cause(report(m.stderr))
    check_root_cause(report(t.stderr))
    m_root = normalized(report(m.stderr)).split("Root Cause (first observed failure):")[1]
    t_root = normalized(report(t.stderr)).split("Root Cause (first observed failure):")[1]
    # 1.13's block has no signal suffix and is indexed [0] alone; the traceback lines are the same.
    assert m_root.split("traceback : ")[1] == t_root.split("traceback : ")[1]
