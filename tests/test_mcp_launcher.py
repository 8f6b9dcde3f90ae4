"""The launcher a stdio MCP server runs under, as real processes: it reports the server's pid
and its exit, and a stop ends the server's whole process group, grandchildren included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from runner import mcp_launcher


def _launch(tmp_path: Path, *argv: str) -> tuple[subprocess.Popen[bytes], Path]:
    """The launcher in a session of its own (as the MCP client starts it), its stderr in a file."""
    err = tmp_path / "stderr"
    with err.open("wb") as f:
        proc = subprocess.Popen(mcp_launcher.command(sys.executable, os.getpid(), list(argv)), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=f, start_new_session=True)
    return proc, err


def _wait_for(what: Callable[[], object], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_it_reports_the_servers_pid_first_and_its_exit_code_last_and_exits_with_it(tmp_path: Path) -> None:
    proc, err = _launch(tmp_path, "sh", "-c", "echo oops >&2; exit 3")
    assert proc.wait(timeout=20) == 3
    lines = err.read_text().splitlines()
    assert lines[0].startswith(mcp_launcher.PREFIX + "pid=") and f"launcher={proc.pid}" in lines[0]
    assert lines[1:] == ["oops", mcp_launcher.PREFIX + "exit=3"]


def test_a_server_that_cannot_run_says_why_and_exits_127(tmp_path: Path) -> None:
    proc, err = _launch(tmp_path, str(tmp_path / "no-such-server"))
    assert proc.wait(timeout=20) == 127
    text = err.read_text()
    assert f"cannot run {tmp_path / 'no-such-server'}: No such file or directory" in text
    assert text.endswith(mcp_launcher.PREFIX + "exit=127\n")


def test_sigterm_stops_the_whole_group_grandchildren_included(tmp_path: Path) -> None:
    """A server that started a child of its own and ignores SIGTERM: both are gone after the
    grace, the launcher too, and the server's end is reported when it came within the grace."""
    grandchild = tmp_path / "grandchild.pid"
    script = f"sleep 60 & echo $! > {grandchild}; trap '' TERM; while :; do sleep 0.1; done"
    proc, err = _launch(tmp_path, "sh", "-c", script)
    _wait_for(lambda: grandchild.exists() and grandchild.read_text().strip())
    server = int(err.read_text().split("pid=", 1)[1].split()[0])
    sleeper = int(grandchild.read_text())
    assert _alive(server) and _alive(sleeper)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == -signal.SIGKILL  # the group's SIGKILL ends the launcher too
    _wait_for(lambda: not _alive(server) and not _alive(sleeper))
