"""A muster C++ worker runs under torchrun too: ddp_linear trains under torch
2.13's torchrun and under muster, and the two checkpoints are identical; the
collectives check passes with torchrun's agent store. Also: the installed
package (find_package(muster), pkg-config) builds the example outside the tree."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from muster_testing import HERE, SANITIZED, SLACK, base_env, build_ddp_linear, run_muster, torchrun_path

DDP_LINEAR = os.environ.get("MUSTER_DDP_LINEAR", "")
TOOL = os.environ.get("MUSTER_COLLECTIVES_TOOL", "")
BUILD_DIR = os.environ.get("MUSTER_BUILD_DIR", "")
pytestmark = pytest.mark.skipif(not (DDP_LINEAR and TOOL), reason="run through ctest")


def torchrun(args, timeout=300):
    exe = torchrun_path()
    assert exe, "torch 2.x's torchrun is not next to the test's Python (scripts/install-deps.sh makes .venv)"
    return subprocess.run([exe, *args], env=base_env(), capture_output=True, text=True, timeout=timeout * SLACK)


def test_ddp_linear_same_checkpoint_under_both(tmp_path):
    a, b = tmp_path / "muster", tmp_path / "torchrun"
    a.mkdir()
    b.mkdir()
    r = run_muster(["--standalone", "--nproc-per-node=2", "--no-python", DDP_LINEAR, str(a)], timeout=300 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    t = torchrun(["--standalone", "--nproc-per-node=2", "--no-python", DDP_LINEAR, str(b)])
    assert t.returncode == 0, t.stderr[-3000:]
    assert "all 2 ranks hold the same weights" in r.stdout and "all 2 ranks hold the same weights" in t.stdout
    ck = (a / "checkpoint.txt").read_text()
    assert ck == (b / "checkpoint.txt").read_text()
    assert "world_size 2" in ck
    # It learned: the bias is 0.5 in the data.
    bias = float([line for line in ck.splitlines() if line.startswith("b ")][0].split()[1])
    assert abs(bias - 0.5) < 0.01


def test_collectives_under_torchrun_agent_store():
    t = torchrun(["--standalone", "--nproc-per-node=3", "--no-python", TOOL, "check"])
    assert t.returncode == 0, t.stderr[-3000:]
    assert sorted(line.split()[2] for line in t.stdout.splitlines() if line.startswith("collectives ok")) == \
        ["rank=0", "rank=1", "rank=2"]


def test_installed_package_builds_the_example(tmp_path):
    assert BUILD_DIR, "MUSTER_BUILD_DIR is not set (run through ctest)"
    cmake = shutil.which("cmake", path="/usr/bin") or shutil.which("cmake")
    prefix = tmp_path / "prefix"
    for component in ("library", "development"):  # libmuster0's and libmuster-dev's parts
        subprocess.run([cmake, "--install", BUILD_DIR, "--prefix", str(prefix), "--component", component],
                       check=True, capture_output=True, timeout=120)
    assert (prefix / "include/muster/process_group.hpp").exists()
    flags = "-fsanitize=address,undefined" if SANITIZED else ""
    example = HERE.parent / "examples" / "ddp_linear"
    consumer = build_ddp_linear(tmp_path / "build", f"-DCMAKE_PREFIX_PATH={prefix}", f"-DCMAKE_CXX_FLAGS={flags}",
                                f"-DCMAKE_EXE_LINKER_FLAGS={flags}")
    out = tmp_path / "out"
    out.mkdir()
    env = base_env(LD_LIBRARY_PATH=prefix / "lib")
    r = run_muster(["--standalone", "--nproc-per-node=2", "--no-python", str(consumer), str(out), "1"],
                   env=env, timeout=300 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "checkpoint.txt").exists()
    # pkg-config: the same program from one compiler line.
    pc = subprocess.run(["pkg-config", "--cflags", "--libs", "muster"], capture_output=True, text=True,
                        env={**os.environ, "PKG_CONFIG_PATH": str(prefix / "lib/pkgconfig")})
    assert pc.returncode == 0, pc.stderr
    include = [w[2:] for w in pc.stdout.split() if w.startswith("-I")]
    assert [Path(i).resolve() for i in include] == [(prefix / "include").resolve()], pc.stdout
    assert "-lmuster" in pc.stdout.split()
    # The standard is the consumer's choice (C++20 or later), never forced by the package.
    assert not [w for w in pc.stdout.split() if w.startswith("-std")], pc.stdout
    exe = tmp_path / "ddp_linear_pc"
    r = subprocess.run(["g++", "-std=c++20", *flags.split(), str(example / "main.cpp"), "-o", str(exe), *pc.stdout.split()],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # One rank without a launcher: it hosts the store itself.
    from muster_testing import free_port
    env = base_env(LD_LIBRARY_PATH=prefix / "lib", RANK=0, WORLD_SIZE=1, MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=free_port())
    r = subprocess.run([str(exe), str(out), "1"], env=env, capture_output=True, text=True, timeout=120 * SLACK)
    assert r.returncode == 0, r.stderr
    assert "all 1 ranks hold the same weights" in r.stdout
