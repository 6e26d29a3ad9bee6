"""--event-log-handler=console under muster and under torch 2.13's torchrun,
side by side: the same events in the same order, each line written exactly as
Python's json.dumps writes it, with the same fields and values except those
that differ from run to run (pids, run ids, durations)."""
import json
import subprocess

import pytest

from muster_testing import MUSTER, SLACK, base_env, torchrun_path

COMMANDS = {
    "success": ["--nproc-per-node=2", "--event-log-handler=console", "--no-python", "sh", "-c", "exit 0"],
    # Rank 1 fails only once rank 0 has exited 0 (its pid gone), in each attempt: rank 0 ends
    # SUCCEEDED-then-TERMINATED under both launchers, whatever the machine's load.
    "restart then failure": ["--nproc-per-node=2", "--max-restarts=1", "--event-log-handler=console", "--no-python",
                             "sh", "-c",
                             'f="{out}/r0_$TORCHELASTIC_RESTART_COUNT"; '
                             'if [ $LOCAL_RANK = 0 ]; then echo $$ > "$f.tmp" && mv "$f.tmp" "$f"; exit 0; fi; '
                             'i=0; while [ $i -lt 1200 ]; do '
                             'if [ -f "$f" ] && ! kill -0 "$(cat "$f")" 2>/dev/null; then exit 1; fi; '
                             'i=$((i+1)); sleep 0.05; done; exit 9'],
    # Rank 0 still runs when rank 1 fails: the agent stops it (torch 2.13 reports it FAILED, -15).
    "a peer stopped": ["--nproc-per-node=2", "--event-log-handler=console", "--no-python", "sh", "-c",
                       "if [ $LOCAL_RANK = 1 ]; then exit 3; fi; sleep 60"],
}


def events(launcher, args, out):
    args = [a.replace("{out}", str(out)) for a in args]
    env = base_env()
    env.pop("LOGLEVEL", None)  # torch's event loggers print at INFO, their default
    r = subprocess.run([launcher, *args], env=env, capture_output=True, text=True, timeout=180 * SLACK)
    lines = [line for line in r.stderr.splitlines() if line.startswith('{"name": "torchelastic.')]
    for line in lines:
        assert json.dumps(json.loads(line)) == line, line  # Python's own formatting, byte for byte
    return r.returncode, [json.loads(line) for line in lines]


def normalized(event):
    """The event without what changes between runs: pids, the run id, durations (kept as their type)."""
    md = dict(event["metadata"])
    pid = md["worker_id"]
    inner = json.loads(md["metadata"])
    if inner.get("worker_pid") not in (None, [None]):
        assert inner["worker_pid"] == [int(pid)]
        inner["worker_pid"] = ["<pid>"]
    md["metadata"] = inner
    md["worker_id"] = None if pid is None else "<pid>"
    md["run_id"] = "<run id>"
    md["duration_ms"] = type(md["duration_ms"]).__name__
    md["total_run_time"] = type(md["total_run_time"]).__name__  # whole seconds: a slow run may cross one
    return event["name"], event["source"], event["timestamp"], list(md.items())


@pytest.mark.parametrize("case", sorted(COMMANDS))
def test_console_events_are_torchrun_s(case, tmp_path):
    torchrun = torchrun_path()
    assert torchrun, "torch 2.x's torchrun is not next to the test's Python (scripts/install-deps.sh makes .venv)"
    (tmp_path / "m").mkdir()
    (tmp_path / "t").mkdir()
    rc_m, ours = events(MUSTER, COMMANDS[case], tmp_path / "m")
    rc_t, theirs = events(torchrun, COMMANDS[case], tmp_path / "t")
    assert rc_m == rc_t
    assert theirs, "torchrun printed no event"
    assert [normalized(e) for e in ours] == [normalized(e) for e in theirs]


def test_null_and_dynamic_rendezvous_print_no_event(tmp_path):
    for handler in ("null", "dynamic_rendezvous"):
        rc, found = events(MUSTER, [f"--event-log-handler={handler}", "--no-python", "true"], tmp_path)
        assert rc == 0 and found == []
