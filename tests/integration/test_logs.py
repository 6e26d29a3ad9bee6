"""Redirects, tee, prefixes, the log directory layout and the local-ranks filter."""
import re
from pathlib import Path

from muster_testing import DATA, base_env, run_muster

CHATTY = str(DATA / "chatty.py")


def run_dir(logs, run_id):
    dirs = list(Path(logs).glob(f"{run_id}_*"))
    assert len(dirs) == 1, dirs
    assert re.fullmatch(rf"{run_id}_[a-z0-9_]{{8}}", dirs[0].name)
    return dirs[0]


def test_tee_all_prefixes_console_lines_and_writes_raw_files(tmp_path):
    r = run_muster(["--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-id=job", f"--log-dir={tmp_path}", "-t", "3",
                    CHATTY, "3", "5"])
    assert r.returncode == 0, r.stderr
    for rank in range(2):
        for n in range(3):
            assert f"[default{rank}]:{rank}:{n}:xxxxx\n" in r.stdout
        assert f"[default{rank}]:err {rank}\n" in r.stderr
        rank_dir = run_dir(tmp_path, "job") / "attempt_0" / str(rank)
        assert (rank_dir / "stdout.log").read_text() == "".join(f"{rank}:{n}:xxxxx\n" for n in range(3))
        assert (rank_dir / "stderr.log").read_text() == f"err {rank}\nloss=0.5 epoch=1\n"


def test_redirect_sends_output_to_files_only(tmp_path):
    r = run_muster(["--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-id=job", f"--log-dir={tmp_path}", "-r", "1",
                    CHATTY, "2", "1"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert "err 0" in r.stderr and "[default" not in r.stderr  # stderr untouched: raw, unprefixed
    for rank in range(2):
        path = run_dir(tmp_path, "job") / "attempt_0" / str(rank) / "stdout.log"
        assert path.read_text() == f"{rank}:0:x\n{rank}:1:x\n"


def test_per_rank_maps_choose_streams_per_local_rank(tmp_path):
    r = run_muster(["--nproc-per-node=2", f"--log-dir={tmp_path}", "-t", "0:1", "-r", "1:2", CHATTY, "1", "1"])
    assert r.returncode == 0, r.stderr
    assert "[default0]:0:0:x" in r.stdout
    assert "1:0:x" in r.stdout and "[default1]" not in r.stdout  # rank 1 stdout raw
    assert "err 1" not in r.stderr  # rank 1 stderr redirected to its file


def test_rank_directories_exist_without_redirects_and_error_file_points_there(tmp_path):
    r = run_muster(["--nproc-per-node=3", "--rdzv-backend=c10d", "--rdzv-id=plain", f"--log-dir={tmp_path}",
                    "--no-python", "sh", "-c", "echo $TORCHELASTIC_ERROR_FILE"])
    assert r.returncode == 0, r.stderr
    attempt = run_dir(tmp_path, "plain") / "attempt_0"
    assert sorted(p.name for p in attempt.iterdir()) == ["0", "1", "2"]
    assert sorted(r.stdout.split()) == [str(attempt / str(i) / "error.json") for i in range(3)]


def test_default_log_dir_is_a_new_torchelastic_dir_in_tmpdir(tmp_path):
    r = run_muster(["--no-python", "sh", "-c", "echo $TORCHELASTIC_ERROR_FILE"], env=base_env(TMPDIR=tmp_path))
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path.parent.parent.name == "attempt_0"
    assert re.fullmatch(r"torchelastic_[a-z0-9_]{8}", path.parents[3].name)
    assert path.parents[4] == tmp_path


def test_log_dir_dev_null_writes_nothing_and_empties_the_error_file_variable(tmp_path):
    r = run_muster(["--log-dir=/dev/null", "-t", "3", "--no-python", "sh", "-c", 'echo "[$TORCHELASTIC_ERROR_FILE]"'],
                   env=base_env(TMPDIR=tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[default0]:[]\n"
    assert list(tmp_path.iterdir()) == []


def test_local_ranks_filter_hides_other_ranks_but_keeps_their_files(tmp_path):
    r = run_muster(["--nproc-per-node=3", "--rdzv-backend=c10d", "--rdzv-id=f", f"--log-dir={tmp_path}", "-t", "3",
                    "--local-ranks-filter=1", CHATTY, "2", "1"])
    assert r.returncode == 0, r.stderr
    assert "[default1]:1:0:x" in r.stdout
    assert "[default0]" not in r.stdout + r.stderr and "[default2]" not in r.stdout + r.stderr
    for rank in range(3):
        assert (run_dir(tmp_path, "f") / "attempt_0" / str(rank) / "stdout.log").read_text() == \
            f"{rank}:0:x\n{rank}:1:x\n"
    # Without tee, filtered-out ranks go to /dev/null.
    r2 = run_muster(["--nproc-per-node=2", "--local-ranks-filter=0", "--no-python", "sh", "-c", "echo r$RANK"])
    assert r2.stdout.split() == ["r0"]


def test_tee_lines_never_interleave_mid_line(tmp_path):
    lines, width = 2000, 3000
    r = run_muster(["--nproc-per-node=4", f"--log-dir={tmp_path}", "-t", "1", CHATTY, str(lines), str(width)],
                   timeout=300)
    assert r.returncode == 0, r.stderr
    body = "x" * width
    seen = {rank: 0 for rank in range(4)}
    for line in r.stdout.splitlines():
        m = re.fullmatch(r"\[default(\d)\]:(\d):(\d+):(x*)", line)
        assert m, line[:80]
        rank = int(m.group(1))
        assert int(m.group(2)) == rank and m.group(4) == body
        assert int(m.group(3)) == seen[rank]  # in order, none lost
        seen[rank] += 1
    assert seen == {rank: lines for rank in range(4)}


def test_a_last_line_without_newline_is_still_shown(tmp_path):
    r = run_muster([f"--log-dir={tmp_path}", "-t", "1", CHATTY, "1", "1", "partial"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("[default0]:tail-without-newline-0\n")


def test_prefix_template_from_the_environment(tmp_path):
    r = run_muster(["--nproc-per-node=2", "-t", "1", CHATTY, "1", "1"],
                   env=base_env(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="<${role_name}|${rank}|${local_rank}> "))
    assert r.returncode == 0, r.stderr
    assert "<default|1|1> 1:0:x" in r.stdout


def test_duplicate_filters_copy_matching_tee_lines(tmp_path):
    r = run_muster(["--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-id=d", f"--log-dir={tmp_path}", "-t", "3",
                    "--duplicate-stderr-filters=loss=", CHATTY, "1", "1"])
    assert r.returncode == 0, r.stderr
    filtered = (run_dir(tmp_path, "d") / "attempt_0" / "filtered_stderr.log").read_text().splitlines()
    assert sorted(filtered) == ["[default0]:loss=0.5 epoch=1", "[default1]:loss=0.5 epoch=1"]


def test_everything_a_failing_worker_wrote_comes_before_the_report(tmp_path):
    script = tmp_path / "burst.py"
    script.write_text("import sys\nfor i in range(20000):\n    print(f'line {i}')\nsys.exit(4)\n")
    for _ in range(3):
        r = run_muster([f"--log-dir={tmp_path}", "-t", "3", str(script)])
        assert r.returncode == 1
        lines = r.stdout.splitlines()
        assert lines == [f"[default0]:line {i}" for i in range(20000)]
