"""The environment every worker gets, checked on the real binary."""
import subprocess

import pytest

from muster_testing import DATA, PYTHON, base_env, read_json_files, run_muster, torchrun_path

TORCHRUN_VARS = {
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE",
}


def dump(tmp_path, nproc, extra_args=(), env=None, script_args=()):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    r = run_muster([f"--nproc-per-node={nproc}", *extra_args, str(DATA / "dump_env.py"), str(out), *script_args],
                   env=env)
    assert r.returncode == 0, r.stderr
    ranks = read_json_files(out)
    assert len(ranks) == nproc, r.stderr
    return [ranks[f"rank_{i}"] for i in range(nproc)], r


@pytest.mark.parametrize("nproc", [1, 3, 4])
def test_every_worker_gets_exactly_torchruns_variables(tmp_path, nproc):
    env = base_env()
    workers, r = dump(tmp_path, nproc, env=env)
    port = workers[0]["env"]["MASTER_PORT"]
    run_id = workers[0]["env"]["TORCHELASTIC_RUN_ID"]
    for i, w in enumerate(workers):
        e = w["env"]
        added = {k for k in e if k not in env}
        expected_added = set(TORCHRUN_VARS)
        if nproc > 1:
            expected_added.add("OMP_NUM_THREADS")
        # The Python interpreter itself may add LC_CTYPE (locale coercion).
        added.discard("LC_CTYPE")
        assert added == expected_added
        assert e["LOCAL_RANK"] == str(i)
        assert e["RANK"] == str(i)
        assert e["ROLE_RANK"] == str(i)
        assert e["GROUP_RANK"] == "0"
        assert e["ROLE_NAME"] == "default"
        assert e["LOCAL_WORLD_SIZE"] == e["WORLD_SIZE"] == e["ROLE_WORLD_SIZE"] == str(nproc)
        assert e["GROUP_WORLD_SIZE"] == "1"
        assert e["MASTER_PORT"] == port and 0 < int(port) < 65536
        assert e["TORCHELASTIC_RUN_ID"] == run_id and len(run_id) == 36  # a uuid4, as torchrun's
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert e["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert e["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
        assert e["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{i}/error.json")
        assert f"/{run_id}_" in e["TORCHELASTIC_ERROR_FILE"]
        if nproc > 1:
            assert e["OMP_NUM_THREADS"] == "1"
        # python -u, as torchrun runs it
        assert w["argv"][0].endswith("dump_env.py")
        # Each worker leads its own session, as under torchrun.
        assert w["pgid"] == w["pid"] == w["sid"]
    banner = "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default"
    assert (banner in r.stderr) == (nproc > 1)


def test_omp_num_threads_of_the_agent_is_kept_and_no_banner(tmp_path):
    workers, r = dump(tmp_path, 2, env=base_env(OMP_NUM_THREADS="4"))
    assert all(w["env"]["OMP_NUM_THREADS"] == "4" for w in workers)
    assert "OMP_NUM_THREADS" not in r.stderr


def test_static_backend_uses_master_addr_and_port(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    workers, _ = dump(tmp_path, 2, ["--master-addr=127.0.0.1", f"--master-port={port}", "--rdzv-id=job7"])
    for w in workers:
        assert w["env"]["MASTER_ADDR"] == "127.0.0.1"
        assert w["env"]["MASTER_PORT"] == str(port)
        assert w["env"]["TORCHELASTIC_RUN_ID"] == "job7"


def test_busy_master_port_is_a_clear_error(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_muster([f"--master-port={port}", "--no-python", "/bin/true"])
    assert r.returncode == 1
    assert f"cannot serve the workers' store on TCP port {port} (MASTER_PORT)" in r.stderr
    assert "--master-port" in r.stderr


def test_without_the_shared_store_worker_0_hosts_it(tmp_path):
    workers, _ = dump(tmp_path, 2, env=base_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1"))
    assert all(w["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "False" for w in workers)
    assert workers[0]["env"]["MASTER_PORT"] == workers[1]["env"]["MASTER_PORT"]


def test_local_rank_macros_in_arguments(tmp_path):
    workers, _ = dump(tmp_path, 2, script_args=["--rank=$local_rank", "${local_rank}", "$$x", "$other"])
    for i, w in enumerate(workers):
        assert w["argv"][2:] == [f"--rank={i}", str(i), "$x", "$other"]


def test_role_and_max_restarts_and_nccl_variable(tmp_path):
    workers, _ = dump(tmp_path, 2, ["--role=trainer", "--max-restarts=4"],
                      env=base_env(TORCH_NCCL_ASYNC_ERROR_HANDLING="2"))
    for w in workers:
        assert w["env"]["ROLE_NAME"] == "trainer"
        assert w["env"]["TORCHELASTIC_MAX_RESTARTS"] == "4"
        assert w["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"


def test_virtual_local_rank_splits_cuda_visible_devices(tmp_path):
    workers, _ = dump(tmp_path, 2, ["--virtual-local-rank"], env=base_env(CUDA_VISIBLE_DEVICES="3,5"))
    assert [w["env"]["LOCAL_RANK"] for w in workers] == ["0", "0"]
    assert [w["env"]["RANK"] for w in workers] == ["0", "1"]
    assert [w["env"]["CUDA_VISIBLE_DEVICES"] for w in workers] == ["3", "5"]


def test_no_python_runs_the_program_found_on_path(tmp_path):
    r = run_muster(["--nproc-per-node=2", "--no-python", "sh", "-c", 'echo "w$RANK"'])
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["w0", "w1"]


def test_module_mode_runs_python_dash_m(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hello.py").write_text("import os, sys; print('module', os.environ['RANK'], sys.argv[1:])\n")
    r = run_muster(["-m", "pkg.hello", "a"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "module 0 ['a']"


@pytest.mark.skipif(torchrun_path() is None, reason="torch's torchrun is not installed next to this Python")
def test_same_variables_and_values_as_torchrun(tmp_path):
    env = base_env()
    (tmp_path / "m").mkdir()
    muster_workers, _ = dump(tmp_path / "m", 3, env=env)
    out = tmp_path / "t"
    out.mkdir()
    r = subprocess.run([torchrun_path(), "--nproc-per-node=3", str(DATA / "dump_env.py"), str(out)],
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    torch_ranks = read_json_files(out)
    # Values that differ by design: random ports and ids, the log directory.
    differ = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "LC_CTYPE"}
    for i in range(3):
        m = muster_workers[i]["env"]
        t = torch_ranks[f"rank_{i}"]["env"]
        assert set(m) - differ == set(t) - differ
        for k in set(t) - differ:
            assert m[k] == t[k], k
        assert m["TORCHELASTIC_ERROR_FILE"].split("/")[-3:] == t["TORCHELASTIC_ERROR_FILE"].split("/")[-3:]
