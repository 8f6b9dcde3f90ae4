"""Durable runs: one folder per run under the runs directory.

    runs/<run_id>/state.json     the RunState, replaced atomically (temp file, fsync, rename)
    runs/<run_id>/trace.jsonl    the append-only trace
    runs/<run_id>/workspace/     the run's private copy of the task workspace

A reader never sees a half-written state file: a kill mid-save leaves the previous version.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections import Counter
from pathlib import Path

from pydantic import ValidationError

from runner.errors import CorruptState, RunNotFound
from runner.state import FORMAT_VERSION, RunState

__all__ = ["CorruptState", "RunNotFound", "list_runs", "load", "run_dir", "runs_dir", "save",
           "trace_path", "workspace_path"]

DEFAULT_RUNS_DIR = Path("runs")


def runs_dir(value: str | Path | None = None) -> Path:
    """The runs directory: the argument, else $RUNNER_RUNS_DIR, else ./runs."""
    return Path(value or os.environ.get("RUNNER_RUNS_DIR") or DEFAULT_RUNS_DIR)


def run_dir(root: Path, run_id: str) -> Path:
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise RunNotFound(f"not a run id: {run_id!r}")
    return root / run_id


def trace_path(root: Path, run_id: str) -> Path:
    return run_dir(root, run_id) / "trace.jsonl"


def workspace_path(root: Path, run_id: str, template: Path) -> Path:
    """The run's private workspace, copied from `template` on first use."""
    ws = run_dir(root, run_id) / "workspace"
    if not ws.exists():
        tmp = ws.with_name("workspace.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(template, tmp, symlinks=True)
        os.replace(tmp, ws)
    return ws


def save(state: RunState, root: Path) -> Path:
    """Write the state atomically; returns the state file's path."""
    folder = run_dir(root, state.run_id)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "state.json"
    tmp = folder / "state.json.tmp"
    data = state.model_dump_json(indent=1).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    crash_point("save")
    os.replace(tmp, target)
    return target


def load(root: Path, run_id: str) -> RunState:
    """Read a saved run.

    Raises:
        RunNotFound: no such run in `root`.
        CorruptState: the file is unreadable or of an unknown format version.
    """
    path = run_dir(root, run_id) / "state.json"
    if not path.exists():
        raise RunNotFound(f"no run {run_id!r} in {root}")
    try:
        state = RunState.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise CorruptState(f"{path} is not a valid run state: {exc.errors()[0]['msg']}") from None
    if state.format_version > FORMAT_VERSION:
        raise CorruptState(f"{path} has format_version {state.format_version}; this runner reads <= {FORMAT_VERSION}")
    return state


def list_runs(root: Path, problems: list[str] | None = None) -> list[RunState]:
    """Every readable run in `root`, oldest first.

    Args:
        problems: if given, one line per unreadable run is appended to it (they are skipped).
    """
    if not root.exists():
        return []
    states = []
    for folder in root.iterdir():
        if (folder / "state.json").exists():
            try:
                states.append(load(root, folder.name))
            except CorruptState as exc:
                if problems is not None:
                    problems.append(f"{folder.name}: {exc}")
    return sorted(states, key=lambda s: s.created_at)


_crash_counts: Counter[str] = Counter()


def crash_point(name: str) -> None:
    """Test hook for the kill-and-resume tests: with RUNNER_CRASH_AT="name:N" set, the
    process SIGKILLs itself the N-th time it reaches `name`: reply (a model reply saved),
    tool_start (about to run a tool; writes are marked started), tool_done (a tool returned,
    result not yet saved), tool_result (a result saved), save (temp file written, not yet
    renamed). Does nothing otherwise."""
    spec = os.environ.get("RUNNER_CRASH_AT")
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    _crash_counts[name] += 1
    if _crash_counts[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
