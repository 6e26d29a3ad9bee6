"""muster's store against PyTorch's: torch 2.13 and 1.13 clients against
muster's server, and muster's client against torch 2.13's and 1.13's servers."""
import json
import os
import subprocess
import sys

import pytest

from muster_testing import DATA, DEBIAN_PYTHON, debian_torch_available, free_port

STORE_TOOL = os.environ.get("MUSTER_STORE_TOOL", "")
PEER = str(DATA / "torch_store_peer.py")

pytest.importorskip("torch", reason="the compatibility tests need PyTorch: scripts/install-deps.sh installs it")

PYTHONS = [pytest.param(sys.executable, "torch2", id="torch2.13")]
if debian_torch_available():
    PYTHONS.append(pytest.param(DEBIAN_PYTHON, "torch1.13", id="torch1.13"))
else:
    PYTHONS.append(pytest.param(DEBIAN_PYTHON, "torch1.13", id="torch1.13",
                                marks=pytest.mark.skip(reason="Debian's python3-torch 1.13 is not installed")))


@pytest.fixture
def muster_server():
    assert STORE_TOOL, "MUSTER_STORE_TOOL is not set (run through ctest)"
    proc = subprocess.Popen([STORE_TOOL, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("PORT "), line
    yield int(line.split()[1])
    proc.stdin.close()
    proc.wait(timeout=10)


@pytest.mark.parametrize("python,dialect", PYTHONS)
def test_torch_client_against_muster_server(muster_server, python, dialect):
    r = subprocess.run([python, PEER, "client", str(muster_server)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["get"] == "v"
    assert (out["add"], out["add_again"], out["get_cnt"]) == (3, 7, "7")
    assert out["cas"] == "w"
    assert out["cas_miss"] == "w"
    assert out["cas_absent_empty"] == "made"
    assert out["num_keys"] == 3  # py_key, cnt, absent
    assert out["delete"] is True and out["delete_again"] is False
    assert out["late"] == "arrived"
    assert out["wait_timeout"] != "no timeout"
    if dialect == "torch2":
        assert out["check_present"] is True and out["check_absent"] is False
        assert out["multi_get"] == ["a", "b"]
        assert out["appended"] == "a+"
        assert out["after_timeout"] == "w"


@pytest.mark.parametrize("python,dialect", PYTHONS)
def test_muster_client_against_torch_server(python, dialect):
    assert STORE_TOOL, "MUSTER_STORE_TOOL is not set (run through ctest)"
    port = free_port()
    server = subprocess.Popen([python, PEER, "server", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout.readline().strip() == "READY"
        c = subprocess.run([STORE_TOOL, "client", "127.0.0.1", str(port), dialect], capture_output=True, text=True,
                           timeout=120)
        assert c.returncode == 0, c.stdout + c.stderr
        results = dict(line.split("=", 1) for line in c.stdout.splitlines())
        served, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert results["connect"] == "ok"
    assert results["get_theirs"] == "py"
    assert (results["add"], results["add_again"]) == ("5", "3")
    assert results["cas_swap"] == "swapped"
    assert results["cas_miss"] == "swapped"
    assert results["check_present"] == "true" and results["check_absent"] == "false"
    assert results["delete"] == "true" and results["delete_again"] == "false"
    assert results["wait_timeout"] == "timeout"
    assert results["done"] == "ok"
    assert results["multi_set"] == "ok"
    assert results["multi_get"] == "a,b"
    if dialect == "torch2":
        assert results["get_appended"] == "a+"
        assert results["after_timeout"] == "1"
    else:
        # 1.13 has no APPEND: refused before a byte is sent, the connection goes on.
        assert results["append"].startswith("error:") and "has no APPEND" in results["append"]
        assert results["get_appended"] == "a"
    seen = json.loads(served.strip().splitlines()[-1])
    assert (seen["ours"], seen["counter"], seen["theirs"]) == ("1", "3", "swapped")
    assert seen["temp_deleted"] is True
    assert seen["m1"] == ("a+" if dialect == "torch2" else "a")
