"""The command line as a user meets it: usage errors, help, PET_ defaults."""
import shutil
from pathlib import Path
import subprocess

from muster_testing import MUSTER, SLACK, base_env, run_muster


def test_a_bad_command_line_prints_usage_and_exits_2():
    # What torchrun's argparse refuses: usage, then the error, exit 2.
    for args, message in [
        ([], "muster: error: the following arguments are required: training_script, training_script_args"),
        (["--bogus", "x.py"], "muster: error: unrecognized arguments: --bogus"),
        (["--nproc", "2", "x.py"], "muster: error: ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node"),
        (["--max-restarts=x", "x.py"], "muster: error: argument --max-restarts/--max_restarts: invalid int value: 'x'"),
    ]:
        r = run_muster(args)
        assert r.returncode == 2, args
        assert r.stderr.startswith("usage: muster "), args
        assert message in r.stderr, (args, r.stderr)


def test_a_command_line_that_cannot_run_exits_1_without_usage():
    # What torchrun accepts but then raises on (config_from_args): exit 1.
    for args, message in [
        (["--nnodes=a:b", "x.py"], "muster: error: nnodes=a:b"),
        (["--rdzv-conf=k", "x.py"], "muster: error: The rendezvous configuration option 'k' must have a value specified."),
        (["--nproc-per-node=gpu", "x.py"], "muster: error: --nproc-per-node=gpu: no NVIDIA GPU"),
        (["--logs-specs=nope", "x.py"], "muster: error: Could not find entrypoint under 'torchrun.logs_specs[nope]' key"),
        (["--metrics-listen=127.0.0.1:http", "x.py"], "muster: error: --metrics-listen"),
    ]:
        r = run_muster(args)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr.startswith(message), (args, r.stderr)


def test_nproc_cpu_counts_the_cpus_the_agent_may_use():
    r = subprocess.run(["taskset", "-c", "0", MUSTER, "--nproc-per-node=cpu", "--no-python", "sh", "-c",
                        "echo $WORLD_SIZE"], env=base_env(), capture_output=True, text=True, timeout=60 * SLACK)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1"]


def test_logs_specs_default_is_torchrun_s_default():
    r = run_muster(["--logs-specs=default", "--no-python", "true"])
    assert r.returncode == 0, r.stderr


def test_a_failure_names_the_full_path_of_the_python_that_ran_it(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("import sys\nsys.exit(3)\n")
    env = base_env()
    r = run_muster([str(script)], env=env)
    assert r.returncode == 1
    python = shutil.which("python3", path=env["PATH"])
    assert "(exitcode: 3) local_rank: 0 (pid: " in r.stderr and f") of binary: {python}\n" in r.stderr, r.stderr


def test_help_exits_0():
    r = run_muster(["--help"])
    assert r.returncode == 0
    assert "--nproc-per-node NPROC_PER_NODE, --nproc_per_node NPROC_PER_NODE" in r.stdout
    assert "training_script" in r.stdout
    # muster's own options come after torchrun's, under a heading of their own, and the text names all of them.
    torchrun_part, own_part = r.stdout.split("\nmuster's own options (not torchrun's):\n")
    own = ["--auth-key-file", "--metrics-listen", "--worker-timeout", "--health-check", "--health-check-timeout",
           "--health-check-interval", "--exclude-exit-code", "--hostfile", "--hosts", "--include", "--exclude", "--export", "--from-launcher"]
    assert "muster's own (" + ", ".join(own) + ")" in " ".join(torchrun_part.split())
    assert [line.split()[0].rstrip(",") for line in own_part.splitlines() if line.startswith("  --")] == own
    assert "--numa-binding NUMA_BINDING" in torchrun_part and "--auth-key-file" not in torchrun_part.split("options:")[1]


def test_pet_defaults_apply_and_the_command_line_wins():
    r = run_muster(["--no-python", "sh", "-c", "echo $WORLD_SIZE"], env=base_env(PET_NPROC_PER_NODE="3"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3"] * 3
    r = run_muster(["--nproc_per_node=1", "--no-python", "sh", "-c", "echo $WORLD_SIZE"],
                   env=base_env(PET_NPROC_PER_NODE="3"))
    assert r.stdout.split() == ["1"]


def test_a_static_node_rank_outside_the_job_is_refused():
    r = run_muster(["--nnodes=2", "--node-rank=2", "--master-addr=127.0.0.1", "--master-port=29999",
                    "--no-python", "true"])
    assert r.returncode == 1
    assert "muster: error: --node-rank=2 is outside [0, 2) for --nnodes=2" in r.stderr


def test_unknown_signal_names_are_warned_about_not_fatal():
    r = run_muster(["--signals-to-handle=SIGTERM,SIGNOPE", "--no-python", "true"])
    assert r.returncode == 0
    assert "Failed to register signal handler for SIGNOPE" in r.stderr


def test_every_script_answers_help_at_once_and_does_nothing_else(tmp_path):
    # The comment at a script's top is its help; nothing is built, installed or run.
    scripts = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.sh"))
    assert len(scripts) >= 10
    for script in scripts:
        for flag in ("--help", "-h"):
            r = subprocess.run([str(script), flag], cwd=tmp_path, capture_output=True, text=True,
                               timeout=10 * SLACK, env=base_env())
            assert r.returncode == 0, (script.name, r.stderr)
            assert r.stdout.strip() and not r.stdout.startswith("#"), script.name
            assert r.stderr == "", (script.name, r.stderr)
    assert list(tmp_path.iterdir()) == []
    r = subprocess.run([str(scripts[0].parent / "fuzz.sh"), "soon"], capture_output=True, text=True,
                       timeout=10 * SLACK, env=base_env())
    assert r.returncode == 2 and "SECONDS must be a whole number" in r.stderr
