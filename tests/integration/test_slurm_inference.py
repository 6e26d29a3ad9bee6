"""Inside a Slurm step (srun's SLURM_* variables, given here to two agents on
this machine as srun would give them on two nodes), a plain muster command
line forms one job over the step; torchrun's own options keep torchrun's
behaviour; a step muster cannot serve is refused with what to do. (A test on
a real Slurm cluster is test_slurm.py.)"""
import json

from muster_testing import DATA, SLACK, base_env, finish_all, port_open, run_muster, slurm_port, start_muster

DUMP = str(DATA / "dump_env.py")


def free_step():
    """A job id whose step-0 port nothing here listens on."""
    for job in range(7001, 8000):
        if not port_open("127.0.0.1", slurm_port(job, 0)):
            return job
    raise AssertionError("no free step port")


def step_env(job, node_id, nodes=2, tasks=None, **extra):
    return base_env(SLURM_JOB_ID=job, SLURM_STEP_ID=0, SLURM_STEP_NUM_NODES=nodes, SLURM_NODEID=node_id,
                    SLURM_STEP_NUM_TASKS=tasks if tasks is not None else nodes,
                    SLURM_STEP_NODELIST="localhost,localhost", **extra)


def ranks(out):
    return {int(p.stem.split("_")[1]): json.loads(p.read_text())["env"] for p in out.glob("rank_*.json")}


def test_a_step_of_two_nodes_is_one_job(tmp_path):
    job = free_step()
    agents = [start_muster(["--nproc-per-node=2", DUMP, str(tmp_path)], env=step_env(job, n)) for n in (0, 1)]
    results = finish_all(agents, 120 * SLACK)
    for rc, err in results:
        assert rc == 0, err[-3000:]
    assert all(f"muster: Slurm step {job}.0: one job over its 2 node(s)" in err for _, err in results)
    envs = ranks(tmp_path)
    assert sorted(envs) == [0, 1, 2, 3]
    for rank, env in envs.items():
        assert env["WORLD_SIZE"] == "4" and env["GROUP_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(rank // 2)  # node rank = SLURM_NODEID
        assert env["MASTER_ADDR"] == "localhost" and env["MASTER_PORT"] == str(slurm_port(job, 0))
        assert env["TORCHELASTIC_RUN_ID"] == f"slurm-{job}.0"


def test_torchrun_s_own_options_keep_torchrun_s_behaviour(tmp_path):
    # --nnodes=1 on each node: two unrelated one-node jobs, as under torchrun.
    job = free_step()
    for n in (0, 1):
        out = tmp_path / str(n)
        out.mkdir()
        r = run_muster(["--nnodes=1", "--nproc-per-node=2", DUMP, str(out)], env=step_env(job, n), timeout=120 * SLACK)
        assert r.returncode == 0, r.stderr
        assert "Slurm step" not in r.stderr
        assert {e["WORLD_SIZE"] for e in ranks(out).values()} == {"2"}


def test_a_step_with_several_tasks_per_node_is_refused(tmp_path):
    r = run_muster(["--nproc-per-node=1", DUMP, str(tmp_path)], env=step_env(free_step(), 0, nodes=1, tasks=4))
    assert r.returncode == 1
    assert "the step runs 4 tasks on 1 node(s)" in r.stderr and "srun --ntasks-per-node=1" in r.stderr
    assert not list(tmp_path.glob("rank_*.json"))


def test_slurm_backend_outside_slurm_is_an_error(tmp_path):
    r = run_muster(["--rdzv-backend=slurm", DUMP, str(tmp_path)])
    assert r.returncode == 1 and "this is not a Slurm step" in r.stderr
