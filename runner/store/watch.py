"""Cheap change detection over a store: the view's live pages, and a live OpenTelemetry export
following the runs a worker or a suite drives.

A page being watched asks, a few times a second, for a *token*: a small value that changes
whenever something committed to the run (or to any run, for the list) changes: a save, a trace
event, a claim or release, a queued mark. Only when the token changes is the page rebuilt
and pushed. FileStore: `stat` of the run's few files (no reads). PostgresStore: one indexed
query on the runs row and the newest trace row id. A run shown as `running` also gets a
coarse clock in its token, so a driver that dies (nothing written) shows as `died` within
`DIED_CHECK_S`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Hashable
from pathlib import Path

from runner.store.base import RunStore
from runner.store.files import FileStore

DIED_CHECK_S = 3.0
"""How often a page re-reads a running run even when nothing was written, seconds."""
_RUN_FILES = ("journal.jsonl", "state.json", "trace.jsonl", "lock", "queued")


def run_token(store: RunStore, run_id: str, running: bool) -> Hashable:
    """A value that changes when run `run_id`'s committed state, trace or lease changes.

    Args:
        running: the run was shown as running at the last look (adds the coarse clock).
    """
    clock = int(time.monotonic() / DIED_CHECK_S) if running else 0
    if isinstance(store, FileStore):
        return clock, _stat_all(store.root / run_id)
    sql = getattr(store, "pool", None)
    if sql is not None:
        with sql.connection() as conn:
            row = conn.execute(
                "SELECT seq, status, owner, runnable, lease_expires_at, updated_at, "
                "(SELECT max(id) FROM trace_events WHERE run_id = %s) FROM runs WHERE run_id = %s",
                (run_id, run_id)).fetchone()
        return clock, tuple(str(v) for v in row) if row else None
    return clock, store.info(run_id).state.seq, len(store.read_trace(run_id))


def list_token(store: RunStore, any_running: bool) -> Hashable:
    """A value that changes when any run in the store is created, saved, traced, claimed,
    released or deleted."""
    clock = int(time.monotonic() / DIED_CHECK_S) if any_running else 0
    if isinstance(store, FileStore):
        root = store.root
        try:
            names = sorted(os.listdir(root))
        except FileNotFoundError:
            return clock, ()
        return clock, tuple((name, _stat_all(root / name)) for name in names)
    sql = getattr(store, "pool", None)
    if sql is not None:
        with sql.connection() as conn:
            row = conn.execute("SELECT count(*), max(updated_at), (SELECT max(id) FROM trace_events) FROM runs").fetchone()
        return clock, tuple(str(v) for v in row) if row else None
    return clock, tuple((i.state.run_id, i.state.seq, i.shown_status) for i in store.list_runs())


def _stat_all(folder: Path) -> tuple[tuple[int, int] | None, ...]:
    out: list[tuple[int, int] | None] = []
    for name in _RUN_FILES:
        try:
            st = os.stat(folder / name)
            out.append((st.st_mtime_ns, st.st_size))
        except (FileNotFoundError, NotADirectoryError):
            out.append(None)
    return tuple(out)


class RunWatch:
    """Which runs changed since the last look, for following every run of a store (a worker,
    a suite). The first `changed()` sets the baseline and returns nothing. FileStore: `stat`
    of each run's files; PostgresStore: trace rows past a cursor (the newest row id seen)."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._stats: dict[str, tuple[tuple[int, int] | None, ...]] | None = None
        self._cursor: int | None = None
        self._seqs: dict[str, int] | None = None

    def changed(self) -> list[str]:
        if isinstance(self.store, FileStore):
            root = self.store.root
            try:
                now = {name: _stat_all(root / name) for name in os.listdir(root) if not name.startswith(".")}
            except FileNotFoundError:
                now = {}
            before, self._stats = self._stats, now
            return [] if before is None else sorted(n for n, s in now.items() if before.get(n) != s and s[0] is not None)
        sql = getattr(self.store, "pool", None)
        if sql is not None:
            with sql.connection() as conn:
                if self._cursor is None:
                    row = conn.execute("SELECT coalesce(max(id), 0) FROM trace_events").fetchone()
                    self._cursor = int(row[0]) if row else 0
                    return []
                rows = conn.execute("SELECT run_id, max(id) FROM trace_events WHERE id > %s GROUP BY run_id",
                                    (self._cursor,)).fetchall()
            self._cursor = max([self._cursor, *(int(r[1]) for r in rows)])
            return sorted(str(r[0]) for r in rows)
        seqs = {i.state.run_id: i.state.seq for i in self.store.list_runs()}
        before_seqs, self._seqs = self._seqs, seqs
        return [] if before_seqs is None else sorted(r for r, s in seqs.items() if before_seqs.get(r) != s)
