"""The launcher a stdio MCP server runs under: it starts the server as its child, in the process
group the MCP client gave the launcher, and stops that whole group (grandchildren included:
SIGTERM, then SIGKILL after `STOP_GRACE_S`) when the process that started it dies (even by
SIGKILL: `procs.die_with`), on SIGTERM, SIGHUP or SIGINT, and when the server exits.

It reports on its stderr, which the client reads from a file, in lines of its own
("@runner-mcp ..."): first ``pid=SERVER launcher=OWN``, written by the server's process
before it execs the server (so it is there once the server has answered anything), then
``exit=CODE`` once the server has ended (a negative code: killed by that signal), always
before the launcher exits itself.

Run as ``python -S .../runner/mcp_launcher.py PARENT_PID COMMAND [ARG...]`` (`command`
builds that line): by its path, so the launcher imports the very runner that started it.
It sends nothing on stdout and reads nothing on stdin: those are the server's.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable
from typing import NoReturn

STOP_GRACE_S = 2.0
"""How long the server's group has between SIGTERM and SIGKILL when the launcher is stopped."""

PREFIX = "@runner-mcp "
"""How the launcher's own lines on stderr begin (the client leaves them out of the server's)."""


def command(python: str, parent_pid: int, argv: list[str]) -> list[str]:
    """The command line that runs `argv` under this launcher for the process `parent_pid`."""
    return [python, "-S", os.path.abspath(__file__), str(parent_pid), *argv]


def _say(line: str) -> None:
    sys.stderr.write(PREFIX + line + "\n")
    sys.stderr.flush()


def _group(sig: signal.Signals) -> None:
    """Send `sig` to the launcher's process group, ignoring SIGTERM itself from now on."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(0, sig)
    except OSError:
        pass


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def _stop(child: int) -> NoReturn:
    """Stop the group: SIGTERM, the server's exit reported if it came within the grace, then
    SIGKILL (the launcher included)."""
    _group(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        try:
            pid, status = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            _say(f"exit={_exit_code(status)}")
            break
        time.sleep(0.02)
    _group(signal.SIGKILL)
    os._exit(128 + signal.SIGKILL)


def _start(argv: list[str], mask: Iterable[int]) -> int:
    """Fork and exec the server with the signal mask `mask`; returns its pid (a child that
    cannot exec says why and exits 127)."""
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _say(f"pid={os.getpid()} launcher={os.getppid()}")  # before the server runs: there once it answers
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            sys.stderr.write(f"cannot run {argv[0]}: {exc.strerror}\n")
            sys.stderr.flush()
        os._exit(127)
    return child


def _ended(child: int) -> int | None:
    """The server's exit code once it has ended (reaped here), else None."""
    try:
        pid, status = os.waitpid(child, os.WNOHANG)
    except ChildProcessError:
        return 0
    return _exit_code(status) if pid else None


def main(argv: list[str]) -> NoReturn:
    """`argv`: the parent's pid, then the server's command line. The signals the launcher acts
    on are blocked and taken one at a time (`sigtimedwait`), so a stop never interrupts the
    report of an exit, nor the other way round."""
    from runner.procs import die_with

    parent, server = int(argv[0]), argv[1:]
    die_with(parent, signal.SIGTERM)()  # SIGTERM (so: stop the group) when runner dies; gone already: exit
    watched = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGCHLD}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    child = _start(server, before)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    while True:
        got = signal.sigtimedwait(watched, 1.0)
        code = _ended(child)
        if code is not None:
            _say(f"exit={code}")
            _group(signal.SIGTERM)
            os._exit(code if code >= 0 else 128 - code)
        if got is not None and got.si_signo != signal.SIGCHLD:
            _stop(child)


if __name__ == "__main__":
    if not __package__:  # run by its path: import runner from the folder that holds this one
        sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    main(sys.argv[1:])
