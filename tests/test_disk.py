"""The FileStore on a disk that fills up mid-run (a real 2 MB tmpfs, mounted for the test;
skipped where mounting is not permitted): the run stops `interrupted` with one line naming the
disk, every committed transition stays readable, and it resumes once space is freed. And a
runs directory that cannot exist is one clear line, not an errno."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import cli, cli_json, one_error


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(path: Path) -> None:
    """Write zeros to `path` until the disk is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                os.write(fd, bytes(64 * 1024))
            except OSError:
                try:
                    while True:
                        os.write(fd, b"\0" * 512)
                except OSError:
                    return
    finally:
        os.close(fd)


def test_a_disk_that_fills_mid_run_stops_it_interrupted_and_it_resumes(small_disk: Path) -> None:
    runs = small_disk / "runs"
    env = {**os.environ, "RUNNER_RUNS_DIR": str(runs)}
    proc = subprocess.Popen([sys.executable, "-m", "runner", "run", "--scenario", "plan", "--latency-ms", "700"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any('"type":"turn"' in p.read_text() for p in runs.glob("*/trace.jsonl")):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    filler = small_disk / "filler"
    _fill(filler)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, (out, err)
    assert "status=interrupted" in out and "Traceback" not in err
    stopped = " ".join(out.split("   stopped:", 1)[1].split())  # the reason, wrapped to the terminal
    assert f"the disk holding {runs} (mounted at {small_disk}" in stopped and "is full" in stopped

    code, listed = cli_json("runs", runs_dir=runs)
    assert code == 0 and [r["status"] for r in listed] == ["interrupted"]
    run_id, turns_before = listed[0]["run_id"], listed[0]["turns"]
    assert 1 <= turns_before < 3

    filler.unlink()
    code, done = cli_json("resume", run_id, runs_dir=runs)
    assert code == 0 and done["status"] == "completed" and done["turns"] == 3
    events = [json.loads(line) for line in (runs / run_id / "trace.jsonl").read_text().splitlines() if line]
    assert [e["turn"] for e in events if e["type"] == "turn"] == [1, 2, 3]  # no turn lost or paid twice
    assert [e["status"] for e in events if e["type"] == "run_stopped"] == ["interrupted", "completed"]


def test_a_runs_directory_that_cannot_exist_is_one_clear_line(tmp_path: Path) -> None:
    proc = cli("run", "--scenario", "plan", runs_dir=Path("/proc/nope"))
    assert proc.returncode == 1
    assert one_error(proc.stderr) == ("error: cannot keep runs in /proc/nope: No such file or directory "
                                   "(choose another folder with $RUNNER_RUNS_DIR)")  # where `cli` puts it
    assert "Errno" not in proc.stderr


def test_one_reserve_per_process_removed_at_exit_or_by_the_next_process(provider: str, runs: Path) -> None:
    """A process keeps one reserve however many runs it drives, removes it when it exits, and
    a killed process's reserve is removed by the next process that claims a run there."""
    from runner.store import FileStore
    from tests.conftest import cli_process, drive, scripted_run

    store = FileStore(runs)
    for _ in range(3):
        assert drive(scripted_run("plan"), provider, store).status == "completed"
    host = os.uname().nodename
    assert [p.name for p in (runs / ".reserve").iterdir()] == [f"{host}-{os.getpid()}"]
    assert (runs / ".reserve" / f"{host}-{os.getpid()}").stat().st_blocks * 512 >= 32 * 1024

    finished = cli_process("run", "--scenario", "plan", "--base-url", provider, runs_dir=runs)
    assert finished.returncode == 0, finished.stderr
    assert [p.name for p in (runs / ".reserve").iterdir()] == [f"{host}-{os.getpid()}"]  # the child's is gone

    killed = cli_process("run", "--scenario", "plan", "--base-url", provider, runs_dir=runs,
                         env={"RUNNER_CRASH_AT": "reply:2"})
    assert killed.returncode == -9
    left = sorted(p.name for p in (runs / ".reserve").iterdir())
    assert len(left) == 2 and f"{host}-{os.getpid()}" in left  # the killed child's stays for now
    again = cli_process("run", "--scenario", "plan", "--base-url", provider, runs_dir=runs)
    assert again.returncode == 0, again.stderr
    assert [p.name for p in (runs / ".reserve").iterdir()] == [f"{host}-{os.getpid()}"]
    assert len(cli_json("runs", runs_dir=runs)[1]) == 6  # the reserve is no run
