"""libmuster's process group and CPU collectives, driven by collectives_tool:
every collective, dtype and op on one node (shared memory), over TCP rings
only, hierarchical across two agents, and with nodes of different sizes; a
peer that dies or stalls makes the others fail, within a bound, with an error
that names it; set-up errors are clear; nothing is left in /dev/shm."""
import os
import subprocess
import time
from pathlib import Path

import pytest

from muster_testing import SLACK, base_env, free_port, run_muster, start_muster, wait_all

TOOL = os.environ.get("MUSTER_COLLECTIVES_TOOL", "")
pytestmark = pytest.mark.skipif(not TOOL, reason="MUSTER_COLLECTIVES_TOOL is not set (run through ctest)")


def shm_segments():
    return {p.name for p in Path("/dev/shm").glob("muster-*")}


@pytest.fixture(autouse=True)
def no_leftovers():
    before = shm_segments()
    yield
    assert shm_segments() - before == set(), "a shared-memory segment was left in /dev/shm"


def ok_ranks(out):
    return sorted(int(line.split("rank=")[1].split()[0]) for line in out.splitlines()
                  if line.startswith("collectives ok"))


def transports(out):
    return {line.split("transport=")[1].strip() for line in out.splitlines() if line.startswith("collectives ok")}


@pytest.mark.parametrize("nproc", [2, 4])
def test_one_node_shared_memory(nproc):
    r = run_muster([f"--nproc-per-node={nproc}", "--standalone", "--no-python", TOOL, "check"],
                   timeout=300 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ok_ranks(r.stdout) == list(range(nproc))
    assert transports(r.stdout) == {"shm"}


@pytest.mark.parametrize("slot", [4096, 65536])
def test_one_node_small_slots_many_chunks(slot):
    # Many chunks per call, so both banks take turns: 4 KiB slots go through
    # the one-wait path, 64 KiB ones through reduce-scatter + all-gather.
    env = base_env(MUSTER_SHM_SLOT_BYTES=slot)
    r = run_muster(["--nproc-per-node=3", "--standalone", "--no-python", TOOL, "check"], env=env, timeout=300 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ok_ranks(r.stdout) == [0, 1, 2]


def test_tcp_ring_only():
    env = base_env(MUSTER_CPU_TRANSPORT="tcp")
    r = run_muster(["--nproc-per-node=3", "--standalone", "--no-python", TOOL, "check"], env=env, timeout=300 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ok_ranks(r.stdout) == [0, 1, 2]
    assert transports(r.stdout) == {"tcp"}


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_named_groups_meet_whatever_order_ranks_make_them(transport):
    env = base_env(MUSTER_CPU_TRANSPORT=transport, MUSTER_TEST_TIMEOUT_MS=int(60000 * SLACK))
    r = run_muster(["--nproc-per-node=3", "--standalone", "--no-python", TOOL, "named"], env=env, timeout=300 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = sorted(int(line.split("rank=")[1]) for line in r.stdout.splitlines() if line.startswith("named groups ok"))
    assert ranks == [0, 1, 2]


def two_agents(nprocs, mode="check"):
    port = free_port()
    procs = []
    for node, nproc in enumerate(nprocs):
        env = base_env(MUSTER_NODE_ID=f"node{node}")
        procs.append(start_muster([f"--nnodes={len(nprocs)}", f"--node-rank={node}", f"--nproc-per-node={nproc}",
                                   "--master-addr=127.0.0.1", f"--master-port={port}", "--no-python", TOOL, mode],
                                  env=env))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300 * SLACK)
        assert p.returncode == 0, err[-3000:]
        outs.append(out)
    return "".join(outs)


def test_hierarchical_two_nodes_of_two():
    out = two_agents([2, 2])
    assert ok_ranks(out) == [0, 1, 2, 3]
    assert transports(out) == {"shm+tcp"}


def test_nodes_of_different_sizes_use_one_ring():
    out = two_agents([2, 1])
    assert ok_ranks(out) == [0, 1, 2]
    assert transports(out) == {"tcp"}


def test_topology_reported():
    out = two_agents([2, 2], mode="info")
    lines = sorted(line for line in out.splitlines() if line.startswith("rank="))
    assert lines == [f"rank={r} size=4 local_rank={r % 2} local_size=2 nodes=2 transport=shm+tcp" for r in range(4)]


def spawn_ranks(world, *args, extra=None):
    """Ranks started directly (no launcher, so nobody stops the others when
    one dies): rank 0 hosts the store, as torch's env:// does."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = base_env(RANK=rank, WORLD_SIZE=world, LOCAL_RANK=rank, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       **(extra or {}))
        procs.append(subprocess.Popen([TOOL, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120 * SLACK)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung: a dead or stalled peer must make the collective fail")
        results.append((p.returncode, out, err))
    return results


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_dead_peer_fails_the_collective(transport):
    start = time.monotonic()
    results = spawn_ranks(3, "die", "1", extra={"MUSTER_CPU_TRANSPORT": transport})
    elapsed = time.monotonic() - start
    assert results[1][0] == 9
    for rank in (0, 2):
        code, out, err = results[rank]
        assert code == 3, (code, out, err)
        assert "failed as expected" in out
        assert "all_reduce of 65536 float32 failed: " in out
        assert "unusable after an earlier failure" in out
    # The group's timeout is 30 minutes: only noticing the death ends it this soon.
    assert elapsed < 100 * SLACK
    # The direct witnesses name the rank that died.
    witnesses = [results[r][1] for r in (0, 2)]
    assert any("rank 1" in w for w in witnesses), witnesses


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_stalled_peer_times_out(transport):
    # Long enough that forming the group on a loaded machine stays well inside it;
    # the stalled rank sleeps three times as long.
    timeout_ms = int(2000 * SLACK)
    results = spawn_ranks(2, "stall", "1", str(3 * timeout_ms),
                          extra={"MUSTER_TEST_TIMEOUT_MS": timeout_ms, "MUSTER_CPU_TRANSPORT": transport})
    code, out, err = results[0]
    assert code == 4, (code, out, err)
    assert f"timed out after {timeout_ms} ms" in out


def test_missing_environment_is_a_clear_error():
    env = base_env(WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    r = subprocess.run([TOOL, "check"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "RANK is not set" in r.stderr and "muster or torchrun" in r.stderr


def test_unreachable_store_times_out():
    env = base_env(RANK=1, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(),
                   MUSTER_TEST_TIMEOUT_MS=int(1500 * SLACK))
    start = time.monotonic()
    r = subprocess.run([TOOL, "check"], env=env, capture_output=True, text=True, timeout=60 * SLACK)
    assert r.returncode == 1
    assert "cannot reach the store" in r.stderr
    assert time.monotonic() - start < 30 * SLACK


def test_ranks_that_disagree_on_the_segment_fail_cleanly():
    # Rank 1 expects a different segment size: it cannot open it, says why,
    # and the segment is removed (the autouse fixture checks /dev/shm).
    port = free_port()
    procs = []
    for rank, slot in ((0, 65536), (1, 131072)):
        env = base_env(RANK=rank, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       MUSTER_SHM_SLOT_BYTES=slot, MUSTER_TEST_TIMEOUT_MS=int(3000 * SLACK))
        procs.append(subprocess.Popen([TOOL, "check"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = [p.communicate(timeout=120 * SLACK) for p in procs]
    assert procs[1].returncode == 1, outs[1]
    assert "ranks disagree on MUSTER_SHM_SLOT_BYTES" in outs[1][1]
    assert procs[0].returncode == 1, outs[0]
    assert "rank 0" in outs[0][1]


def dynamic_symbols(library):
    out = subprocess.run(["nm", "-D", "-C", "--defined-only", str(library)], capture_output=True, text=True,
                         check=True, timeout=60 * SLACK).stdout
    # "<address> <type> <name>"; the name may hold spaces ("typeinfo for ...").
    return {line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2}


def test_libmuster_exports_its_public_api_and_nothing_else():
    library = Path(os.environ["MUSTER_BUILD_DIR"]) / "worker_runtime" / "libmuster.so"
    assert library.exists(), library
    names = dynamic_symbols(library)
    # What the public headers declare is there, with the exceptions' typeinfo
    # (a program catches muster::Error thrown inside the library).
    for wanted in ["muster::init_process_group(muster::ProcessGroupOptions const&)", "muster::get_rank()",
                   "muster::ProcessGroup::barrier()", "muster::DistributedSampler::indices() const",
                   "muster::randperm(long, unsigned long)", "muster::nccl_built()", "typeinfo for muster::Error",
                   "typeinfo for muster::TimeoutError", "vtable for muster::Error"]:
        assert wanted in names, f"libmuster.so does not export {wanted}"
    # Nothing else: each name belongs to a class or function of the public
    # headers (not muster_common's Status or Result, no Impl, no store
    # client), and no Boost.Asio or standard-library template instance.
    classes = ("ProcessGroup", "NcclCommunicator", "DistributedSampler", "Half", "BFloat16", "Error", "TimeoutError")
    functions = ("element_size", "data_type_name", "reduce_op_name", "init_process_group", "destroy_process_group",
                 "is_initialized", "default_group", "get_rank", "get_world_size", "get_local_rank", "randperm",
                 "nccl_built")

    def public(name):
        for kind in ("typeinfo name for ", "typeinfo for ", "vtable for "):
            if name.startswith(kind):
                return name[len(kind):] in (f"muster::{c}" for c in classes)
        qualified = name.split("(", 1)[0]
        if "::Impl" in qualified:
            return False
        return (any(qualified.startswith(f"muster::{c}::") for c in classes)
                or qualified in (f"muster::{f}" for f in functions))

    leaked = sorted(n for n in names if not public(n))
    assert leaked == [], f"libmuster.so exports {len(leaked)} names beyond its API, e.g. {[n[:120] for n in leaked[:5]]}"
