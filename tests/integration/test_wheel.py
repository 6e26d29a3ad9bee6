"""The Python wheel: scripts/wheel.sh builds it (scikit-build-core over the
project's CMake build) and tags it with auditwheel; the test checks what it
holds and needs, installs it with torch 2.13 into a fresh virtual environment,
runs a real DDP job with the installed muster (whose workers must use that
environment's interpreter even when PATH leads elsewhere), and builds C++
consumers against the wheel's libmuster by find_package and pkg-config."""
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile  # pyelftools, which auditwheel brings

from muster_testing import DATA, SLACK, base_env, build_ddp_linear

ROOT = Path(__file__).resolve().parents[2]
VERSION = re.search(r"project\(muster VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
# PATH without the environment: its python3 is the system's (Debian's, with torch 1.13 where installed).
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def run_group(cmd, timeout, **kwargs):
    """subprocess.run for a command that starts compilers: on a timeout its whole
    process group goes, so nothing keeps building beside the next suites."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    build = Path(os.environ["MUSTER_BUILD_DIR"]) / "wheel"
    r = run_group([str(ROOT / "scripts" / "wheel.sh"), str(out)], 1200 * SLACK,
                  env=dict(os.environ, MUSTER_WHEEL_BUILD_DIR=str(build), MUSTER_WHEEL_PYTHON=sys.executable))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    wheels = list(out.glob("*.whl"))
    assert [w.name for w in out.iterdir()] == [w.name for w in wheels] and len(wheels) == 1
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    # torch 2.13 comes from wherever pip is set to find it (here: the machine's local wheels).
    env_dir = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=300)
    r = run_group([str(env_dir / "bin" / "pip"), "install", "--disable-pip-version-check", "-q", "torch==2.13.0",
                   "numpy", str(wheel)], 900 * SLACK)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    yield env_dir
    shutil.rmtree(env_dir, ignore_errors=True)  # about 1 GB with torch


def test_the_wheel_is_tagged_and_needs_only_the_c_and_cxx_runtimes(wheel):
    m = re.fullmatch(rf"muster_launcher-{re.escape(VERSION)}-py3-none-manylinux_2_(\d+)_x86_64\.whl", wheel.name)
    assert m, wheel.name
    show = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)], capture_output=True,
                          text=True, timeout=120)
    assert show.returncode == 0, show.stderr
    report = json.loads(show.stdout)
    assert report["overall_tag"] == f"manylinux_2_{m.group(1)}_x86_64"
    assert report["external_libs"] == {}  # nothing to graft: libcrypto is linked in
    assert set(report["versioned_symbols"]) <= {"libc.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libm.so.6"}
    # What every ELF file of the wheel needs, read from its dynamic section.
    allowed = {"libc.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libm.so.6", "ld-linux-x86-64.so.2", "libmuster.so.0"}
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            data = z.read(name)
            if not data.startswith(b"\x7fELF"):
                continue
            dynamic = ELFFile(io.BytesIO(data)).get_section_by_name(".dynamic")
            needed = {t.needed for t in dynamic.iter_tags() if t.entry.d_tag == "DT_NEEDED"}
            assert needed <= allowed, (name, needed - allowed)
    names = set(zipfile.ZipFile(wheel).namelist())
    data = f"muster_launcher-{VERSION}.data/scripts"
    for wanted in (f"{data}/muster", f"{data}/musterd", f"{data}/musterctl", "muster/__init__.py",
                   "muster/__main__.py", "muster/lib/libmuster.so.0", "muster/lib/libmuster.so",
                   "muster/include/muster/muster.hpp",
                   "muster/lib/cmake/muster/musterConfig.cmake", "muster/lib/pkgconfig/muster.pc"):
        assert wanted in names, wanted
    assert not [n for n in names if "systemd" in n or "/man/" in n or "bash-completion" in n]
    assert not [n for n in names if ".libs/" in n or ".scripts/" in n]  # nothing grafted, no script moved
    # libmuster.so is a linker script for -lmuster naming the real library, which keeps its SONAME.
    with zipfile.ZipFile(wheel) as z:
        assert z.read("muster/lib/libmuster.so") == b"INPUT(libmuster.so.0)\n"


def test_the_installed_muster_is_the_native_one(venv):
    muster = venv / "bin" / "muster"
    for name in ("muster", "musterd", "musterctl"):
        exe = venv / "bin" / name
        with open(exe, "rb") as f:
            assert f.read(4) == b"\x7fELF", f"{name} is a wrapper, not the binary"
        r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.startswith(f"{name} {VERSION} "), r.stdout + r.stderr
    built = subprocess.run([os.environ["MUSTER_BIN"], "--help"], capture_output=True, text=True, timeout=30).stdout
    assert subprocess.run([str(muster), "--help"], capture_output=True, text=True, timeout=30).stdout == built
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "muster", "--version"], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.strip() == VERSION, r.stdout + r.stderr


def test_a_ddp_job_runs_on_the_environment_s_python_and_torch(venv, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([str(venv / "bin" / "muster"), "--standalone", "--nproc-per-node=2",
                        str(DATA / "which_python.py"), str(out), str(ROOT / "examples/pytorch/ddp_train.py"), "2"],
                       env=base_env(PATH=SYSTEM_PATH), capture_output=True, text=True, timeout=300 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((out / f"python_{rank}.json").read_text())
        assert seen["executable"] == str(venv / "bin" / "python3"), seen
        assert seen["prefix"] == str(venv) and seen["torch"].startswith("2.13.0"), seen
    assert (out / "model.pt").exists() and json.loads((out / "weights.json").read_text())


def test_python_exec_still_chooses_the_interpreter(venv, tmp_path):
    system_python = shutil.which("python3", path=SYSTEM_PATH)
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([str(venv / "bin" / "muster"), "--nproc-per-node=1", str(DATA / "which_python.py"),
                        str(out)], env=base_env(PATH=SYSTEM_PATH, PYTHON_EXEC=system_python), capture_output=True,
                       text=True, timeout=300 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((out / "python_0.json").read_text())["executable"] == system_python


def test_a_cxx_consumer_builds_against_the_wheel(venv, tmp_path):
    python = str(venv / "bin" / "python")

    def where(flag):
        r = subprocess.run([python, "-m", "muster", flag], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    example = ROOT / "examples" / "ddp_linear"
    consumer = build_ddp_linear(tmp_path / "build", f"-Dmuster_DIR={where('--cmake-dir')}")
    out = tmp_path / "out"
    out.mkdir()
    muster = str(venv / "bin" / "muster")
    # No LD_LIBRARY_PATH: CMake gives the consumer the wheel's library folder as its RPATH.
    r = subprocess.run([muster, "--standalone", "--nproc-per-node=2", "--no-python", str(consumer),
                        str(out), "1"], env=base_env(PATH=SYSTEM_PATH), capture_output=True, text=True,
                       timeout=300 * SLACK)
    assert r.returncode == 0 and "all 2 ranks hold the same weights" in r.stdout, r.stderr[-3000:]

    pc = subprocess.run(["pkg-config", "--cflags", "--libs", "muster"], capture_output=True, text=True,
                        env=dict(os.environ, PKG_CONFIG_PATH=where("--pkgconfig-dir")))
    assert pc.returncode == 0, pc.stderr
    words = pc.stdout.split()
    assert [Path(w[2:]).resolve() for w in words if w.startswith("-I")] == [Path(where("--include-dir")).resolve()]
    exe = tmp_path / "ddp_linear_pc"
    r = subprocess.run(["g++", "-std=c++20", str(example / "main.cpp"), "-o", str(exe), *words],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([muster, "--standalone", "--nproc-per-node=2", "--no-python", str(exe), str(out), "1"],
                       env=base_env(PATH=SYSTEM_PATH, LD_LIBRARY_PATH=where("--library-dir")), capture_output=True,
                       text=True, timeout=300 * SLACK)
    assert r.returncode == 0 and "all 2 ranks hold the same weights" in r.stdout, r.stderr[-3000:]
