"""The command line as a user meets it: usage errors, help, PET_ defaults."""
from muster_testing import base_env, run_muster


def test_a_bad_command_line_prints_usage_and_exits_2():
    for args, message in [
        ([], "muster: error: the following arguments are required: training_script, training_script_args"),
        (["--bogus", "x.py"], "muster: error: unrecognized arguments: --bogus"),
        (["--nproc", "2", "x.py"], "muster: error: ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node"),
        (["--nnodes=a:b", "x.py"], "muster: error: nnodes=a:b"),
        (["--rdzv-conf=k", "x.py"], "muster: error: The rendezvous configuration option 'k' must have a value specified."),
        (["--nproc-per-node=gpu", "x.py"], "muster: error: --nproc-per-node=gpu: no NVIDIA GPU"),
        (["--run-path", "x.py"], "muster: error: --run-path"),
    ]:
        r = run_muster(args)
        assert r.returncode == 2, args
        assert r.stderr.startswith("usage: muster "), args
        assert message in r.stderr, (args, r.stderr)


def test_help_exits_0():
    r = run_muster(["--help"])
    assert r.returncode == 0
    assert "--nproc-per-node NPROC_PER_NODE, --nproc_per_node NPROC_PER_NODE" in r.stdout
    assert "training_script" in r.stdout


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
