"""Where runs live: the `RunStore` seam and its two backends.

`open_store(value)` picks the backend from one string (`--store`, $RUNNER_STORE, else the runs
directory): a `postgresql://` URL opens a `PostgresStore`, anything else is a directory for a
`FileStore`. The module-level `save`/`load`/`list_runs`/`trace_path`/`workspace_path` are the
FileStore's, kept for scripts and tests that work on a runs directory directly.
"""

from __future__ import annotations

import contextlib
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runner.errors import UsageError
from runner.state import RunState
from runner.store.base import (
    DEFAULT_DURABILITY,
    DEFAULT_RUNS_DIR,
    DURABILITIES,
    POSTGRES_SCHEMES,
    CorruptState,
    DamagedRun,
    DiskFull,
    Durability,
    Lease,
    LeaseLost,
    RepairReport,
    RunBusy,
    RunHandle,
    RunInfo,
    RunNotFound,
    RunStore,
    ShownStatus,
    StaleState,
    StoreError,
    crash_point,
    default_owner,
    durability_of,
    expanded,
    is_postgres,
    shown_url,
    store_options,
)
from runner.store.files import FileStore

__all__ = [
    "DEFAULT_DURABILITY", "DEFAULT_RUNS_DIR", "DURABILITIES", "POSTGRES_SCHEMES", "CorruptState", "DamagedRun",
    "DiskFull", "Durability", "FileStore", "Lease", "LeaseLost", "RepairReport", "RunBusy", "RunHandle", "RunInfo",
    "RunNotFound", "RunStore", "ShownStatus", "StaleState", "StoreAt", "StoreError", "crash_point", "default_owner",
    "durability_of", "is_postgres", "list_runs", "load", "make_runs_dir", "open_for_reading", "open_store", "prune",
    "run_dir", "runs_dir", "save", "select", "settings_rows", "shown_url", "store_options", "trace_path", "workspace_path"
]


def runs_dir(value: str | Path | None = None) -> Path:
    """The runs directory: the argument, else $RUNNER_RUNS_DIR, else ./runs (`~` expanded)."""
    return expanded(Path(value or os.environ.get("RUNNER_RUNS_DIR") or DEFAULT_RUNS_DIR))


def _lease_s_from_environment() -> float | None:
    """$RUNNER_LEASE_S as seconds, None when unset.

    Raises:
        UsageError: not a number of at least 0.1 seconds.
    """
    text = os.environ.get("RUNNER_LEASE_S") or None
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0.1:  # NaN too
        raise UsageError(f"$RUNNER_LEASE_S must be a lease length in seconds, at least 0.1; got {text!r}")
    return value


def open_for_reading(value: str | Path | None = None, *, runs: str | Path | None = None) -> RunStore:
    """`open_store` for a command that only reads runs (or deletes them): $RUNNER_DURABILITY,
    which only says how commits are flushed, is not consulted, so a bad value of it does not
    keep anyone from looking at their runs."""
    return open_store(value, runs=runs, durability=DEFAULT_DURABILITY)


def open_store(value: str | Path | None = None, *, runs: str | Path | None = None,
               lease_s: float | None = None, durability: str | None = None,
               given_as: str = "--store") -> RunStore:
    """The store named by `value`, else $RUNNER_STORE, else a FileStore on `runs_dir(runs)`.

    Args:
        value: a postgresql:// URL or a runs directory.
        runs: the runs directory (`--runs-dir`) when neither `value` nor $RUNNER_STORE names a store.
        given_as: what the user gave `value` as, for an error that asks for another folder
            (a value equal to $RUNNER_STORE is taken to come from there).
        lease_s: PostgreSQL lease length, seconds (default $RUNNER_LEASE_S, else 30; renewed
            every third of it while a run is driven).
        durability: "process" or "power" (see `Durability`); default $RUNNER_DURABILITY,
            else "process".

    Raises:
        StoreError: the database cannot be reached or migrated.
        UsageError: an unknown durability, a URL of a scheme runner does not know, a runs
            directory that is a file, or a $RUNNER_LEASE_S that is no lease length.
    """
    chosen = value or os.environ.get("RUNNER_STORE") or None
    level = durability_of(durability or os.environ.get("RUNNER_DURABILITY"))
    if is_postgres(str(chosen) if chosen else None):
        from runner.store.postgres import DEFAULT_LEASE_S, PostgresStore

        lease_s = lease_s or _lease_s_from_environment()
        pg: RunStore = PostgresStore(str(chosen), lease_s=lease_s or DEFAULT_LEASE_S, durability=level)
        return pg
    root = _runs_root(str(chosen or runs_dir(runs)))
    return FileStore(root, durability=level, named_by=_named_by(value, runs, given_as))


def _named_by(value: str | Path | None, runs: str | Path | None, given_as: str) -> str:
    """The option or variable a runs directory came from (see `open_store`)."""
    from_env = {name: os.environ.get(name) or None for name in ("RUNNER_STORE", "RUNNER_RUNS_DIR")}
    if value:  # the CLI's --store falls back to $RUNNER_STORE: the same value came from there
        return "$RUNNER_STORE" if from_env["RUNNER_STORE"] == str(value) else given_as
    if from_env["RUNNER_STORE"]:
        return "$RUNNER_STORE"
    if runs:  # the same for --runs-dir and $RUNNER_RUNS_DIR
        env_runs = from_env["RUNNER_RUNS_DIR"]
        return "$RUNNER_RUNS_DIR" if env_runs and Path(env_runs) == Path(runs) else "--runs-dir"
    return "--runs-dir or $RUNNER_RUNS_DIR"


def _runs_root(value: str) -> Path:
    """`value` (a --store, --runs-dir or their variable, not a postgresql:// URL) as the runs
    directory a FileStore keeps runs in, `~` expanded.

    Raises:
        UsageError: a URL of a scheme runner does not know, a `~user` of no user, or a runs
            directory that is a file.
    """
    if "://" in value:
        raise UsageError(f"the store {value} has a URL scheme runner does not know; give a "
                         f"{' or '.join(POSTGRES_SCHEMES)} URL or a runs directory")
    root = expanded(Path(value))
    if root.exists() and not root.is_dir():
        raise UsageError(f"the runs directory {root} is a file, not a directory")
    return root


def _check_store(value: str | None) -> None:
    """Raise what `open_store` would for `value` as the store, without opening it (whether a
    database answers is not asked). Raises UsageError, as `_runs_root`."""
    if value is not None and not is_postgres(value):
        _runs_root(value)


def settings_rows() -> list[tuple[str, str, str]]:
    """(setting, value, source) of each setting that decides where and how runs are kept, as
    `runner config show` prints them: the runs directory, the store (a URL's password shown as
    ***), the durability and the PostgreSQL lease. Each comes from the command line of the
    command that keeps runs, else its environment variable, else the default; a value the
    environment gives that such a command would refuse is marked "(refused)"."""
    from runner.store.postgres import DEFAULT_LEASE_S

    checks: dict[str, Callable[[str | None], object]] = {
        "durability": durability_of, "lease_s": lambda _: _lease_s_from_environment(),
        "store": _check_store, "runs_dir": lambda v: _runs_root(str(runs_dir(v)))}
    rows = []
    for name, env, default in (("runs_dir", "RUNNER_RUNS_DIR", f"./{DEFAULT_RUNS_DIR}"),
                               ("store", "RUNNER_STORE", "(the runs directory)"),
                               ("durability", "RUNNER_DURABILITY", DEFAULT_DURABILITY),
                               ("lease_s", "RUNNER_LEASE_S", f"{DEFAULT_LEASE_S:g} (PostgreSQL only)")):
        given = os.environ.get(env) or None
        shown = shown_url(given) if given else default
        try:
            checks[name](given)
        except UsageError:
            shown += " (refused)"
        rows.append((name, shown, f"env {env}" if given else "default"))
    return rows


@dataclass(frozen=True)
class StoreAt:
    """Where a store is and what its commits survive, as plain data (it is shipped to Ray
    actors): a runs directory or a postgresql:// URL, and a durability."""

    location: str
    durability: Durability = "process"

    def open(self) -> RunStore:
        """The store, opened (see `open_store`)."""
        return open_store(self.location, durability=self.durability, given_as="--runs-dir or --store")

    @property
    def is_postgres(self) -> bool:
        return is_postgres(self.location)


def make_runs_dir(store: RunStore) -> Path | None:
    """Create a FileStore's runs directory if it is missing; returns it when made here. One
    that cannot be made is left to the store, whose error says why in one line."""
    if not isinstance(store, FileStore) or store.root.exists():
        return None
    try:
        store.root.mkdir(parents=True)
    except OSError:
        return None
    with contextlib.suppress(OSError):  # as venv and pytest mark their folders: not the user's files
        (store.root / ".gitignore").write_text(RUNS_DIR_GITIGNORE)
    return store.root


RUNS_DIR_GITIGNORE = "# runner's runs: kept out of version control, and out of what its folder tools show\n*\n"
"""Written into a runs directory runner makes: git and the folder tools (`runner.tools.Folder`)
leave out a folder whose `.gitignore` ignores everything."""


def unmake_runs_dir(store: RunStore, made: Path) -> None:
    """Remove the runs directory `make_runs_dir` made, if no run is in it (this process's
    disk-full reserve goes first)."""
    if isinstance(store, FileStore):
        store.drop_reserve()
    with contextlib.suppress(OSError):
        if (made / ".gitignore").read_text() == RUNS_DIR_GITIGNORE:
            (made / ".gitignore").unlink()
    with contextlib.suppress(OSError):
        made.rmdir()


def select(store: RunStore, status: str | None = None, limit: int | None = None, offset: int = 0) -> list[RunInfo]:
    """`store.list_runs`, with `status` checked first.

    Raises:
        UsageError: `status` is not a status runs are shown with (`ShownStatus`).
    """
    shown = typing.get_args(ShownStatus)
    if status is not None and status not in shown:
        raise UsageError(f"--status must be one of {', '.join(shown)}; got {status!r}")
    return store.list_runs(status=status, limit=limit, offset=offset)


def prune(store: RunStore, status: str | None = None, dry_run: bool = False, limit: int | None = None,
          offset: int = 0) -> tuple[list[str], list[str]]:
    """Delete the runs `runner runs` lists with the same `status`, `limit` and `offset`: of
    those, the final ones (completed, failed), or all of them with `status`; never one that is
    being driven. Returns (ids deleted, or that would be with `dry_run`; "id: why" of those
    skipped).

    Raises:
        UsageError: as `select`.
    """
    chosen = [i for i in select(store, status, limit, offset)
              if (i.shown_status == status if status else i.shown_status in ("completed", "failed"))]
    deleted, skipped = [], []
    for info in chosen:
        run_id = info.state.run_id
        try:
            if dry_run and info.shown_status == "running":
                raise RunBusy(f"run {run_id} is being driven by {info.driver or 'another process'}")
            if not dry_run:
                store.delete(store.claim(run_id))
            deleted.append(run_id)
        except (RunBusy, LeaseLost, RunNotFound) as exc:
            skipped.append(f"{run_id}: {exc}")
    return deleted, skipped


def run_dir(root: Path, run_id: str) -> Path:
    return FileStore(root).run_dir(run_id)


def trace_path(root: Path, run_id: str) -> Path:
    return FileStore(root).trace_path(run_id)


def workspace_path(root: Path, run_id: str, template: Path) -> Path:
    """The run's private workspace under `root`, copied from `template` on first use."""
    return FileStore(root).workspace(run_id, template)


def save(state: RunState, root: Path) -> None:
    """Save `state` in the runs directory `root` (create it, or commit the next save).

    Raises:
        StaleState: `state` does not follow the saved one. RunBusy: a process drives the run.
    """
    FileStore(root).save(state)


def load(root: Path, run_id: str) -> RunState:
    """The run's latest state from the runs directory `root`.

    Raises:
        RunNotFound: no such run. CorruptState: unreadable, of an unknown format, or an old copy.
    """
    return FileStore(root).load(run_id)


def list_runs(root: Path, problems: list[str] | None = None) -> list[RunState]:
    """Every readable run in `root`, oldest first.

    Args:
        problems: if given, one line per unreadable run is appended to it (they are skipped).
    """
    store = FileStore(root)
    states = [info.state for info in reversed(store.list_runs())]
    if problems is not None:
        problems.extend(store.problems)
    return states
