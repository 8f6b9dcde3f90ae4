"""`PostgresStore`: runs in PostgreSQL, for many workers on one or many machines.

Tables (created by the migrations below, recorded in `runner_migrations`):

    runs             one row per run: status, seq, the state as JSONB (without its append-only
                     lists), the lease (owner, epoch, leased_since, lease_expires_at), runnable
    run_items        the append-only lists (messages, per_turn, tool_runs), one row per item
    trace_events     the trace, one row per event (with the seq, epoch and owner that wrote it)
    workspace_files  the run's workspace, so a run that moves to another worker sees its files

A save is one statement and one implicit transaction: the runs row (only if its epoch and seq
are the caller's: fencing and ordering in one `UPDATE ... WHERE`), the new list items and the
trace events, as data-modifying CTEs over arrays. The loop's saves, its events and the release
go down a pipeline (`_Pipeline`: one connection in libpq's pipeline mode, statements prepared
once): each is sent at once, so it is in the operating system before the run moves on, and its
result is read before the next effect (`sync`: a paid model request, a tool that may write),
so the writes between two effects cost one wait for the server. A 3-turn run makes 11
statements in 4 round trips. A save that rewrites the lists, is forced, or carries workspace
files changed since the last save takes a transaction of several statements on a pooled
connection instead. Claims take a run whose lease is free or expired (`SELECT ... FOR UPDATE
SKIP LOCKED` for workers) and bump its epoch; a background thread renews every lease this
process holds in one statement, off the saves' path, and a lease that cannot be renewed is
marked lost.

Any database works: connections set `client_encoding` to UTF8 (a SQL_ASCII database, the
default of `initdb --no-locale`, would otherwise hand text parameters over as bytes). The server
may restart or be unreachable for a while (`retry_s`, default 30 s): every operation is retried
on a fresh connection, and a write that may have committed before its connection broke is
recognised by the token it wrote (`runs.last_write`), so a retried commit is neither lost nor
made twice. psycopg 3 with a `psycopg_pool.ConnectionPool` in autocommit mode.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, ClassVar, Collection, Iterable, Sequence, TypeVar

from pydantic import TypeAdapter, ValidationError

from runner.errors import CorruptState, LeaseLost, RunBusy, RunNotFound, StaleState, StoreError
from runner.state import FORMAT_VERSION, RunState
from runner.store.base import (
    APPEND_ONLY,
    DEFAULT_DURABILITY,
    Durability,
    Lease,
    RunHandle,
    RunInfo,
    RunStore,
    Written,
    _HandleTracer,
    crash_point,
    default_owner,
    delta,
    event_line,
    shown_url,
)
from runner.trace import StateForced, TraceEvent, Tracer, _Event

DEFAULT_LEASE_S = 30.0
DEFAULT_RETRY_S = 30.0
"""How long an operation keeps trying to reach a database that restarts or is unreachable."""
_T = TypeVar("_T")
_MIGRATION_LOCK = 0x72756E6E  # pg_advisory_xact_lock key: one migrator at a time
_EVENTS: TypeAdapter[TraceEvent] = TypeAdapter(TraceEvent)

MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        """CREATE TABLE runs (
            run_id text PRIMARY KEY,
            parent_run_id text,
            created_at double precision NOT NULL,
            status text NOT NULL,
            seq bigint NOT NULL,
            state jsonb NOT NULL,
            epoch bigint NOT NULL DEFAULT 0,
            owner text,
            leased_since timestamptz,
            lease_expires_at timestamptz,
            runnable boolean NOT NULL DEFAULT false,
            updated_at timestamptz NOT NULL DEFAULT now())""",
        "CREATE INDEX runs_newest ON runs (created_at DESC)",
        "CREATE INDEX runs_claimable ON runs (created_at) WHERE runnable OR status = 'running'",
        """CREATE TABLE run_items (
            run_id text NOT NULL REFERENCES runs ON DELETE CASCADE,
            kind text NOT NULL,
            idx integer NOT NULL,
            item jsonb NOT NULL,
            PRIMARY KEY (run_id, kind, idx))""",
        """CREATE TABLE trace_events (
            id bigserial PRIMARY KEY,
            run_id text NOT NULL REFERENCES runs ON DELETE CASCADE,
            seq bigint,
            epoch bigint,
            owner text,
            event jsonb NOT NULL)""",
        "CREATE INDEX trace_events_run ON trace_events (run_id, id)",
        """CREATE TABLE workspace_files (
            run_id text NOT NULL REFERENCES runs ON DELETE CASCADE,
            path text NOT NULL,
            data bytea NOT NULL,
            mode integer NOT NULL,
            PRIMARY KEY (run_id, path))""",
    ]),
    (2, ["ALTER TABLE runs ADD COLUMN last_write text"]),  # the token of the last write (retries)
]

_SHOWN = """CASE WHEN runnable AND (lease_expires_at IS NULL OR lease_expires_at < now()) THEN 'queued'
             WHEN status = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < now()) THEN 'died'
             ELSE status END"""


@dataclass
class _Head:
    """A run this process holds: its lease, what is saved of its lists, its local workspace."""

    lease: Lease
    written: Written | None = None
    ws_dir: Path | None = None
    ws_seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Workspace files as last synced: relative path -> (size, mtime_ns)."""
    created: bool = False
    """Created by this process: it has no workspace files and no events but those written here."""
    has_events: bool = False
    refused: Exception | None = None
    """Why a write sent down the pipeline was refused (raised by the run's next operation)."""


class PostgresStore(RunStore):
    """Runs in a PostgreSQL database (see the module docstring).

    Args:
        url: a libpq URL, e.g. postgresql:///runner?host=/var/run/postgresql.
        lease_s: how long a claim lasts without renewal, seconds; renewed every lease_s/3.
        pool_max: most connections this process opens.
        durability: "process" (commits with `synchronous_commit = off`: the server has the
            commit when it returns, so any kill of this process keeps it; a server crash may
            lose the last fraction of a second of them) or "power" (`synchronous_commit = on`:
            the commit is on the server's disk first). See `runner.store.base.Durability`.
        retry_s: how long an operation keeps retrying while the server restarts or cannot be
            reached, seconds; past it, `StoreError`.

    Raises:
        StoreError: the database cannot be reached or migrated.
    """

    def __init__(self, url: str, *, lease_s: float = DEFAULT_LEASE_S, pool_max: int = 8,
                 durability: Durability = DEFAULT_DURABILITY, retry_s: float = DEFAULT_RETRY_S) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool, PoolTimeout

        self.url, self.lease_s, self.durability, self.retry_s = url, lease_s, durability, retry_s
        self.shown = shown_url(url)
        """The URL as messages print it: its password as ***."""
        synchronous_commit = "on" if durability == "power" else "off"
        settings = {"autocommit": True, "client_encoding": "UTF8"}

        def configure(conn: Any) -> None:
            conn.execute(f"SET synchronous_commit TO {synchronous_commit}")  # one of two literals

        self._psycopg = psycopg
        self._transient: tuple[type[BaseException], ...] = (psycopg.OperationalError, PoolTimeout)
        try:  # one plain connection first: a bad URL fails in seconds with the server's own words
            psycopg.connect(url, connect_timeout=5, **settings).close()  # type: ignore[arg-type]
        except psycopg.Error as exc:
            cause = " ".join(str(exc).split()) or type(exc).__name__
            raise StoreError(f"cannot reach the run store at {self.shown}: {cause}") from None
        try:
            self.pool = ConnectionPool(url, min_size=1, max_size=pool_max, open=True, timeout=30,
                                       name="runner", configure=configure, kwargs=settings)
            self.pool.wait(timeout=30)
        except (psycopg.Error, Exception) as exc:  # PoolTimeout is not a psycopg.Error
            raise StoreError(f"cannot reach the run store at {self.shown}: {exc}") from None
        self._heads: dict[str, _Head] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        _sweep_workspaces()
        self._ws_root = Path(tempfile.gettempdir()) / f"{_WS_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}"

        def connect() -> Any:
            conn = psycopg.connect(url, connect_timeout=5, application_name=_pipeline_name(os.getpid()),
                                   **settings)  # type: ignore[arg-type]
            configure(conn)
            return conn

        self._pipe = _Pipeline(connect)
        self._migrate()

    # --- reaching the server -------------------------------------------------------------

    def _retry(self, work: Callable[[Any, int], _T], *, patience_s: float | None = None, drain: bool = True,
               attempt: int = 0) -> _T:
        """`work(conn, attempt)` on a pooled connection; on a broken connection or a server
        that is restarting or unreachable, again on a fresh one (attempt 1, 2, ...) until
        `patience_s` (default `retry_s`) has passed. `work` must be safe to repeat: a write
        checks, on attempt > 0, whether its earlier attempt committed (its token). With
        `drain`, the pipeline's writes are read first (what is read here sees them)."""
        if drain:
            self._pipe.drain()
        deadline = time.monotonic() + (self.retry_s if patience_s is None else patience_s)
        while True:
            try:
                with self.pool.connection(timeout=max(0.5, deadline - time.monotonic())) as conn:
                    return work(conn, attempt)
            except self._transient as exc:
                if time.monotonic() >= deadline:
                    cause = " ".join(str(exc).split()) or type(exc).__name__
                    raise StoreError(f"lost the run store at {self.shown} for {self.retry_s:.0f} s: {cause}") from None
                if attempt == 0:
                    self.pool.check()  # drop the idle connections the restart broke, reconnect
                attempt += 1
                time.sleep(min(0.05 * 2 ** attempt, 1.0))

    # --- schema --------------------------------------------------------------------------

    def _migrate(self) -> None:
        def work(conn: Any, attempt: int) -> None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                conn.execute("CREATE TABLE IF NOT EXISTS runner_migrations (version integer PRIMARY KEY, "
                             "applied_at timestamptz NOT NULL DEFAULT now())")
                done = {row[0] for row in conn.execute("SELECT version FROM runner_migrations")}
                for version, statements in MIGRATIONS:
                    if version in done:
                        continue
                    for sql in statements:
                        conn.execute(sql)  # static SQL, no parameters
                    conn.execute("INSERT INTO runner_migrations (version) VALUES (%s)", (version,))

        self._retry(work)

    # --- reading -------------------------------------------------------------------------

    def _states(self, rows: list[tuple[Any, ...]]) -> dict[str, RunState]:
        """States for (run_id, seq, state text) rows, with their lists, in one query."""
        ids = [row[0] for row in rows]
        lists: dict[str, dict[str, list[str]]] = {i: {k: [] for k in APPEND_ONLY} for i in ids}
        if ids:
            found = self._retry(lambda conn, _: conn.execute(
                "SELECT run_id, kind, item::text FROM run_items WHERE run_id = ANY(%s) "
                "ORDER BY run_id, kind, idx", (ids,)).fetchall())
            for run_id, kind, item in found:
                lists[run_id][kind].append(item)
        states = {}
        for run_id, seq, rest in rows:
            parts = ",".join(f'"{k}":[{",".join(lists[run_id][k])}]' for k in APPEND_ONLY)
            text = rest[:-1] + f',"seq":{seq},' + parts + "}"
            try:
                state = RunState.model_validate_json(text)
            except ValidationError as exc:
                raise CorruptState(f"run {run_id} in {self.shown} is not a valid run state: "
                                   f"{exc.errors()[0]['msg']}") from None
            if state.format_version > FORMAT_VERSION:
                raise CorruptState(f"run {run_id} has format_version {state.format_version}; "
                                   f"this runner reads <= {FORMAT_VERSION}")
            states[run_id] = state
        return states

    def _one(self, sql: str, params: Any) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._retry(lambda conn, _: conn.execute(sql, params).fetchone())
        return row

    def load(self, run_id: str, *, force: bool = False) -> RunState:
        row = self._one("SELECT run_id, seq, state::text FROM runs WHERE run_id = %s", (run_id,))
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in {self.shown}")
        state = self._states([row])[run_id]
        head = self._heads.get(run_id)
        if head is not None:
            head.written = Written.of(state)
        return state

    def list_runs(self, *, status: str | None = None, limit: int | None = None, offset: int = 0) -> list[RunInfo]:
        where, params, page = "", [], (limit, offset)
        if status in ("running", "died"):  # a live lease held by a dead local pid is `died`: decided below
            where, page = "WHERE status = 'running'", (None, 0)
        elif status is not None:
            where, params = f"WHERE {_SHOWN} = %s", [status]
        rows = self._retry(lambda conn, _: conn.execute(
            f"SELECT run_id, seq, state::text, {_SHOWN}, owner, leased_since FROM runs {where} "
            "ORDER BY created_at DESC, run_id LIMIT %s OFFSET %s", (*params, *page)).fetchall())
        states = self._states([row[:3] for row in rows])
        infos = [self._info(states[r[0]], r) for r in rows]
        if status in ("running", "died"):
            infos = [i for i in infos if i.shown_status == status]
            infos = infos[offset: None if limit is None else offset + limit]
        return infos

    def info(self, run_id: str) -> RunInfo:
        row = self._one(f"SELECT run_id, seq, state::text, {_SHOWN}, owner, leased_since FROM runs "
                        "WHERE run_id = %s", (run_id,))
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in {self.shown}")
        return self._info(self._states([row[:3]])[run_id], row)

    @staticmethod
    def _info(state: RunState, row: tuple[Any, ...]) -> RunInfo:
        shown, owner, since = row[3], row[4], row[5]
        if shown == "running" and _dead_pid_here(owner) is not None:
            return RunInfo(state, "died")
        return RunInfo(state, shown, f"{owner} since {_iso(since)}" if shown == "running" else None)

    def read_trace(self, run_id: str) -> list[TraceEvent]:
        def work(conn: Any, attempt: int) -> tuple[list[Any], bool]:
            rows = conn.execute("SELECT event::text FROM trace_events WHERE run_id = %s ORDER BY id",
                                (run_id,)).fetchall()
            exists = bool(rows) or conn.execute("SELECT 1 FROM runs WHERE run_id = %s", (run_id,)).fetchone() is not None
            return rows, exists

        rows, exists = self._retry(work)
        if not exists:
            raise RunNotFound(f"no trace for run {run_id!r} in {self.shown}")
        try:
            return [_EVENTS.validate_json(row[0]) for row in rows]
        except ValidationError as exc:
            raise CorruptState(f"run {run_id}: a trace event is not valid: {exc.errors()[0]['msg']}") from None

    def trace_rows(self, run_id: str) -> list[tuple[int, int, str, dict[str, Any]]]:
        """(seq, epoch, owner, event) per trace row: who wrote each event (tests, audits)."""
        rows = self._retry(lambda conn, _: conn.execute(
            "SELECT seq, epoch, owner, event::text FROM trace_events WHERE run_id = %s ORDER BY id",
            (run_id,)).fetchall())
        return [(r[0], r[1], r[2], json.loads(r[3])) for r in rows]

    def has_events(self, run_id: str) -> bool:
        head = self._heads.get(run_id)
        if head is not None and (head.created or head.has_events):
            return head.has_events
        row = self._one("SELECT EXISTS (SELECT 1 FROM trace_events WHERE run_id = %s)", (run_id,))
        return bool(row and row[0])

    # --- claiming ------------------------------------------------------------------------

    def _held(self, lease: Lease, row: tuple[Any, ...] | None) -> Lease:
        assert row is not None
        lease.epoch, lease.since = int(row[0]), float(row[1])
        lease.expires_at = time.time() + self.lease_s
        with self._lock:
            self._heads[lease.run_id] = _Head(lease)
        self._start_renewer()
        return lease

    _CLAIM_SET = ("epoch = runs.epoch + 1, owner = %(owner)s, leased_since = now(), "
                  "lease_expires_at = now() + make_interval(secs => %(lease_s)s), runnable = false, "
                  "updated_at = now(), last_write = %(token)s")
    _CLAIMED = "SELECT epoch, extract(epoch FROM leased_since), run_id FROM runs WHERE last_write = %s"
    _CLAIM = (f"WITH c AS (UPDATE runs SET {_CLAIM_SET} WHERE run_id = %(run_id)s "
              "AND (lease_expires_at IS NULL OR lease_expires_at < now()) "
              "RETURNING epoch, extract(epoch FROM leased_since) AS since) "
              "SELECT epoch, since, NULL, NULL::timestamptz, NULL::timestamptz FROM c UNION ALL "
              "SELECT NULL, NULL, owner, leased_since, lease_expires_at FROM runs "
              "WHERE run_id = %(run_id)s AND NOT EXISTS (SELECT 1 FROM c)")

    def claim(self, run_id: str, owner: str | None = None) -> Lease:
        owner = owner or default_owner()
        args = {"owner": owner, "lease_s": self.lease_s, "run_id": run_id, "token": uuid.uuid4().hex}
        held = self._one("SELECT owner FROM runs WHERE run_id = %s AND lease_expires_at IS NOT NULL", (run_id,))
        if held is not None:  # a dead driver's last writes may still be on the way, expired or not
            self._await_pipeline_of(held[0])

        def work(conn: Any, attempt: int) -> tuple[Any, Any]:
            if attempt and (done := conn.execute(self._CLAIMED, (args["token"],)).fetchone()) is not None:
                return done, None  # the earlier attempt's claim committed
            row = conn.execute(self._CLAIM, args, prepare=True).fetchone()  # one round trip: claimed, busy or none
            if row is None:
                return None, None
            if row[0] is not None:
                return row[:2], None
            if row[4] is None or row[4].timestamp() < time.time():  # lost a race: that snapshot predates the winner
                return None, conn.execute("SELECT owner, leased_since, lease_expires_at FROM runs WHERE run_id = %s",
                                          (run_id,)).fetchone()
            return None, row[2:]

        row, busy = self._retry(work)
        if row is None:
            if busy is None:
                raise RunNotFound(f"no run {run_id!r} in {self.shown}")
            if _dead_pid_here(busy[0]) is not None:  # its driver was on this machine and is gone: no need to wait
                self._await_pipeline_of(busy[0])
                row = self._retry(lambda conn, attempt: (
                    attempt and conn.execute(self._CLAIMED, (args["token"],)).fetchone()) or conn.execute(
                    f"UPDATE runs SET {self._CLAIM_SET} WHERE run_id = %(run_id)s AND owner = %(dead)s "
                    "RETURNING epoch, extract(epoch FROM leased_since)", {**args, "dead": busy[0]}).fetchone())
                if row is not None:
                    return self._held(Lease(run_id=run_id, owner=owner, epoch=0), row)
            raise RunBusy(f"run {run_id} is being driven by {busy[0]} since {_iso(busy[1])} "
                          f"(lease until {_iso(busy[2])})")
        return self._held(Lease(run_id=run_id, owner=owner, epoch=0), row)

    def _await_pipeline_of(self, owner: str) -> None:
        """If `owner` is a dead driver on this machine, wait (up to 5 s) until the server has
        run the statement it left in flight down its pipeline (its connection's backend runs
        it, then exits). A takeover before that would fence that write out, and lose it."""
        pid = _dead_pid_here(owner)
        if pid is None:
            return
        name = _pipeline_name(pid)
        deadline = time.monotonic() + 5.0
        alive = "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = %s)"
        while self._one(alive, (name,)) == (True,):
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)

    _CLAIMABLE = ("(runnable OR status = 'running') AND parent_run_id IS NULL "
                  "AND (lease_expires_at IS NULL OR lease_expires_at < now())")

    def claim_next(self, owner: str, skip: Collection[str] = ()) -> Lease | None:
        """The oldest top-level run that is queued, or saved `running` with an expired lease
        (its driver died), and not in `skip`. Child runs are driven only through their parents."""
        token = uuid.uuid4().hex
        skipped = list(skip)
        held = self._one(f"SELECT owner FROM runs WHERE {self._CLAIMABLE} AND lease_expires_at IS NOT NULL "
                         "AND run_id <> ALL(%s) ORDER BY created_at LIMIT 1", (skipped,))
        if held is not None:  # its lease lapsed, maybe just before it was killed
            self._await_pipeline_of(held[0])

        def work(conn: Any, attempt: int) -> Any:
            if attempt and (done := conn.execute(self._CLAIMED, (token,)).fetchone()) is not None:
                return done
            return conn.execute(
                f"WITH next AS (SELECT run_id FROM runs WHERE {self._CLAIMABLE} AND run_id <> ALL(%(skip)s) "
                "ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED) "
                f"UPDATE runs SET {self._CLAIM_SET} FROM next WHERE runs.run_id = next.run_id "
                "RETURNING epoch, extract(epoch FROM leased_since), runs.run_id",
                {"owner": owner, "lease_s": self.lease_s, "token": token, "skip": skipped}).fetchone()

        row = self._retry(work)
        if row is None:
            return None
        return self._held(Lease(run_id=row[2], owner=owner, epoch=0), row)

    def renew(self, lease: Lease) -> None:
        self._renew([lease], patience_s=self.retry_s)

    def _renew(self, leases: list[Lease], *, patience_s: float) -> None:
        """Extend all of `leases` in one statement; those taken over raise (one) LeaseLost after
        the others are renewed, and are marked lost."""
        ids, epochs = [x.run_id for x in leases], [x.epoch for x in leases]
        rows = self._retry(lambda conn, _: conn.execute(
            "UPDATE runs SET lease_expires_at = now() + make_interval(secs => %s) "
            "FROM unnest(%s::text[], %s::bigint[]) AS l(run_id, epoch) "
            "WHERE runs.run_id = l.run_id AND runs.epoch = l.epoch RETURNING runs.run_id",
            (self.lease_s, ids, epochs)).fetchall(), patience_s=patience_s, drain=False)
        kept = {row[0] for row in rows}
        lost = [x for x in leases if x.run_id not in kept]
        for lease in leases:
            if lease.run_id in kept:
                lease.expires_at = time.time() + self.lease_s
        if lost:
            raise _Lost(lost)

    def _start_renewer(self) -> None:
        if self._renewer is None or not self._renewer.is_alive():
            self._renewer = threading.Thread(target=self._renew_loop, name="runner-lease-renewer", daemon=True)
            self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            with self._lock:
                leases = [h.lease for h in self._heads.values() if not h.lease.lost.is_set()]
            if not leases:
                continue
            try:
                self._renew(leases, patience_s=self.lease_s / 4)
            except _Lost as exc:
                for lease in exc.leases:
                    lease.lost.set()
                    if lease.on_lost is not None:
                        lease.on_lost()
            except StoreError:
                pass  # the database is unreachable for now: try again next round

    def release(self, lease: Lease, *, runnable: bool = False) -> None:
        with self._lock:
            head = self._heads.pop(lease.run_id, None)
        if head is not None and head.ws_dir is not None:
            shutil.rmtree(head.ws_dir, ignore_errors=True)
            _rmdir_if_empty(self._ws_root)
        params = [_bool(runnable), lease.run_id.encode(), _int(lease.epoch)]
        self._pipe.send(_Statement("release", self._RELEASE, params, lambda _: None, self._redo))
        self._pipe.drain()  # released on return: another process may claim the run now

    _RELEASE = ("UPDATE runs SET lease_expires_at = NULL, runnable = $1, updated_at = now() "
                "WHERE run_id = $2 AND epoch = $3")

    def delete(self, lease: Lease) -> None:
        with self._lock:
            head = self._heads.pop(lease.run_id, None)
        if head is not None and head.ws_dir is not None:
            shutil.rmtree(head.ws_dir, ignore_errors=True)
            _rmdir_if_empty(self._ws_root)

        def work(conn: Any, attempt: int) -> int:  # run_items, trace_events, workspace_files cascade
            deleted = conn.execute("DELETE FROM runs WHERE run_id = %s AND epoch = %s",
                                   (lease.run_id, lease.epoch)).rowcount
            if attempt and not deleted:  # the earlier attempt may have deleted it
                gone = conn.execute("SELECT 1 FROM runs WHERE run_id = %s", (lease.run_id,)).fetchone() is None
                return 1 if gone else 0
            return int(deleted)

        if self._retry(work) != 1:
            raise LeaseLost(f"run {lease.run_id} was claimed by another process; not deleted")

    def _head(self, lease: Lease) -> _Head:
        head = self._heads.get(lease.run_id)
        if head is not None and head.refused is not None:
            raise head.refused
        if head is None or head.lease is not lease or lease.lost.is_set():
            raise LeaseLost(f"run {lease.run_id}: lease epoch {lease.epoch} of {lease.owner} is no longer held")
        return head

    # --- writing -------------------------------------------------------------------------

    def create(self, state: RunState, *, owner: str | None = None) -> Lease | None:
        state.seq = 1
        rest = state.model_dump_json(exclude={*APPEND_ONLY, "seq"})
        items = [(key, i, item.model_dump_json()) for key in APPEND_ONLY for i, item in enumerate(getattr(state, key))]
        token = uuid.uuid4().hex
        params = [state.run_id.encode(), None if state.parent_run_id is None else state.parent_run_id.encode(),
                  repr(state.created_at).encode(), state.status.encode(), rest.encode(), _int(1 if owner else 0),
                  None if owner is None else owner.encode(), _bool(owner is not None), repr(self.lease_s).encode(),
                  _bool(owner is None), token.encode(), _texts([i[0] for i in items]), _ints([i[1] for i in items]),
                  _texts([i[2] for i in items])]
        rows: list[_Row] = []
        try:
            self._pipe.drain()
            crash_point("save")  # the kill tests: die with the commit not sent
            self._pipe.send(_Statement("create", self._CREATE, params, rows.extend, self._redo_create,
                                       run_id=state.run_id, token=token))
            self._pipe.drain()
            if not rows:
                raise StaleState(f"run {state.run_id} already exists in {self.shown}")
        except BaseException:
            state.seq = 0
            raise
        if owner is None:
            return None
        lease = self._held(Lease(run_id=state.run_id, owner=owner, epoch=0), rows[0])
        head = self._heads[state.run_id]
        head.written, head.created = Written.of(state), True
        return lease

    def _redo_create(self, statement: _Statement) -> list[_Row]:
        def work(conn: Any, attempt: int) -> list[_Row]:
            if (done := conn.execute(self._CLAIMED, (statement.token,)).fetchone()) is not None:
                return [(str(done[0]).encode(), str(done[1]).encode())]  # the earlier attempt committed
            return _rows(_execute(conn, statement.sql, statement.params))

        return self._retry(work, drain=False, attempt=1)

    _CREATE = (  # one statement: the run's row, then its items only if the row was new
        "WITH r AS (INSERT INTO runs (run_id, parent_run_id, created_at, status, seq, state, epoch, owner, "
        "leased_since, lease_expires_at, runnable, last_write) VALUES ($1, $2, $3::double precision, "
        "$4, 1, $5::jsonb, $6::bigint, $7, CASE WHEN $8::boolean THEN now() END, "
        "CASE WHEN $8::boolean THEN now() + make_interval(secs => $9::double precision) END, $10::boolean, $11) "
        "ON CONFLICT (run_id) DO NOTHING RETURNING epoch, extract(epoch FROM coalesce(leased_since, now())) AS since), "
        "i AS (INSERT INTO run_items (run_id, kind, idx, item) SELECT $1, t.kind, t.idx, t.item::jsonb "
        "FROM r, unnest($12::text[], $13::int[], $14::text[]) AS t(kind, idx, item)) "
        "SELECT epoch, since FROM r")

    _SAVE = (  # one statement: fenced update, then the new items and events only if it matched
        "WITH u AS (UPDATE runs SET seq = seq + 1, status = $1, state = $2::jsonb, updated_at = now(), "
        "last_write = $3 WHERE run_id = $4 AND epoch = $5::bigint AND seq = $6::bigint RETURNING seq), "
        "i AS (INSERT INTO run_items (run_id, kind, idx, item) SELECT $4, t.kind, t.idx, t.item::jsonb "
        "FROM u, unnest($7::text[], $8::int[], $9::text[]) AS t(kind, idx, item)), "
        "e AS (INSERT INTO trace_events (run_id, seq, epoch, owner, event) "
        "SELECT $4, u.seq, $5::bigint, $10, t.event::jsonb "
        "FROM u, unnest($11::text[]) WITH ORDINALITY AS t(event, n) ORDER BY t.n) "
        "SELECT seq FROM u")

    def save(self, state: RunState, events: Sequence[_Event] = (), lease: Lease | None = None,
             *, force: bool = False) -> None:
        if lease is None:
            try:
                lease = self.claim(state.run_id)
            except RunNotFound:
                lease = self.create(state, owner=default_owner())
                assert lease is not None
                for event in events:
                    self.emit(state.run_id, event, lease)
                self.release(lease)
                return
            try:
                return self.save(state, events, lease, force=force)
            finally:
                self.release(lease)
        head = self._head(lease)
        seq, written = state.seq, head.written
        try:
            self._commit(state, events, lease, force=force)
            self.sync(lease)
        except BaseException:  # not saved: the state is as it was; a refusal is raised here, once
            state.seq, head.written, head.refused = seq, written, None
            raise

    def _commit(self, state: RunState, events: Sequence[_Event], lease: Lease, *, force: bool = False) -> None:
        """Save `state` and `events`. The usual save (the new list items, no workspace change)
        is one statement sent down the pipeline: its result is read by the run's next `sync`
        (before any effect) or the store's next read, and a refusal is raised then."""
        head = self._head(lease)
        lines = [event_line(e) for e in events]
        change = delta(state, None if force else head.written)
        ws = self._workspace_changes(head, state.run_id)
        token = uuid.uuid4().hex
        if change.added is not None and not force and ws is None:
            self._save_one(state, lease, head, change.added, change.start, change.rest, lines, token)
            state.seq += 1  # the statement only applies on top of state.seq (or is refused)
        else:
            state.seq = self._save_tx(state, lease, change.added, change.start, change.rest, lines, token, force, ws)
        head.has_events = head.has_events or bool(lines)
        head.written = head.written.advanced(change.added, state) if head.written and not force else Written.of(state)
        if ws is not None:
            head.ws_seen = ws[2]

    def _committed(self, conn: Any, run_id: str, token: str) -> int | None:
        """On a retry: the new seq if the earlier attempt of this write committed, else None."""
        row = conn.execute("SELECT seq, last_write FROM runs WHERE run_id = %s", (run_id,)).fetchone()
        return int(row[0]) if row is not None and row[1] == token else None

    def _save_one(self, state: RunState, lease: Lease, head: _Head, added: dict[str, list[str]],
                  start: dict[str, int], rest: str, lines: list[str], token: str) -> None:
        kinds, idxs, items = [], [], []
        for key in APPEND_ONLY:
            for i, item in enumerate(added[key]):
                kinds.append(key)
                idxs.append(start[key] + i)
                items.append(item)
        run_id, seq = state.run_id, state.seq
        params = [state.status.encode(), rest.encode(), token.encode(), run_id.encode(), _int(lease.epoch), _int(seq),
                  _texts(kinds), _ints(idxs), _texts(items), lease.owner.encode(), _texts(lines)]

        def check(rows: list[_Row]) -> None:
            if not rows:
                head.refused = self._refusal(run_id, seq, lease)

        crash_point("save")  # the kill tests: die with the commit not sent
        self._pipe.send(_Statement("save", self._SAVE, params, check, self._redo, run_id=run_id, token=token,
                                   commit=True))

    def _redo(self, statement: _Statement) -> list[_Row]:
        """`statement` again on a pooled connection, after the pipeline's connection broke
        with it in flight: a write that carries a token is not made twice."""
        def work(conn: Any, attempt: int) -> list[_Row]:
            if statement.token and (done := self._committed(conn, statement.run_id, statement.token)) is not None:
                return [(str(done).encode(),)]
            return _rows(_execute(conn, statement.sql, statement.params))

        return self._retry(work, drain=False, attempt=1)

    def _save_tx(self, state: RunState, lease: Lease, added: dict[str, list[str]] | None, start: dict[str, int],
                 rest: str, lines: list[str], token: str, force: bool,
                 ws: tuple[list[tuple[str, bytes, int]], list[str], dict[str, tuple[int, int]]] | None) -> int:
        """A save of several statements in one transaction: the lists rewritten, a forced state,
        or workspace files changed."""
        if added is not None:
            items = [(state.run_id, key, start[key] + i, item) for key in APPEND_ONLY for i, item in enumerate(added[key])]
        else:
            items = [(state.run_id, key, i, item.model_dump_json()) for key in APPEND_ONLY
                     for i, item in enumerate(getattr(state, key))]

        def work(conn: Any, attempt: int) -> int:
            if attempt and (done := self._committed(conn, state.run_id, token)) is not None:
                return done
            events = list(lines)
            with conn.transaction():
                row = conn.execute(
                    "UPDATE runs SET seq = seq + 1, status = %(status)s, state = %(rest)s::jsonb, updated_at = now(), "
                    "last_write = %(token)s WHERE run_id = %(id)s AND epoch = %(epoch)s AND (seq = %(seq)s OR %(force)s) "
                    "RETURNING seq",
                    {"status": state.status, "rest": rest, "id": state.run_id, "epoch": lease.epoch, "seq": state.seq,
                     "force": force, "token": token}).fetchone()
                if row is None:
                    raise self._refusal(state.run_id, state.seq, lease, conn)
                new_seq = int(row[0])
                if force and new_seq != state.seq + 1:
                    events.append(event_line(StateForced(runId=state.run_id, fromSeq=state.seq, storedSeq=new_seq - 1,
                                                         by=lease.owner)))
                with conn.cursor() as cur:
                    if added is None:
                        cur.execute("DELETE FROM run_items WHERE run_id = %s", (state.run_id,))
                    if items:
                        cur.executemany("INSERT INTO run_items (run_id, kind, idx, item) VALUES (%s, %s, %s, %s::jsonb)",
                                        items)
                    if events:
                        cur.executemany("INSERT INTO trace_events (run_id, seq, epoch, owner, event) "
                                        "VALUES (%s, %s, %s, %s, %s::jsonb)",
                                        [(state.run_id, new_seq, lease.epoch, lease.owner, line) for line in events])
                    if ws is not None:
                        changed, gone, _ = ws
                        if gone:
                            cur.execute("DELETE FROM workspace_files WHERE run_id = %s AND path = ANY(%s)",
                                        (state.run_id, gone))
                        if changed:
                            cur.executemany(
                                "INSERT INTO workspace_files (run_id, path, data, mode) VALUES (%s, %s, %s, %s) "
                                "ON CONFLICT (run_id, path) DO UPDATE SET data = EXCLUDED.data, mode = EXCLUDED.mode",
                                [(state.run_id, *c) for c in changed])
                crash_point("save")  # the kill tests: die inside the transaction, before its commit
            return new_seq

        return self._retry(work)

    def _refusal(self, run_id: str, seq: int, lease: Lease, conn: Any = None) -> Exception:
        """Why a save of `run_id` at `seq` under `lease` matched no row (the lease is marked
        lost if it was taken over)."""
        sql = "SELECT epoch, seq, owner FROM runs WHERE run_id = %s"
        if conn is not None:
            row = conn.execute(sql, (run_id,)).fetchone()
        else:
            row = self._retry(lambda c, _: c.execute(sql, (run_id,)).fetchone(), drain=False)
        if row is None:
            return RunNotFound(f"no run {run_id!r} in {self.shown}")
        if int(row[0]) != lease.epoch:
            lease.lost.set()
            return LeaseLost(f"run {run_id}: lease epoch {lease.epoch} of {lease.owner} was taken over "
                             f"by {row[2]} (epoch {row[0]}); this process must not write")
        return StaleState(f"run {run_id}: this state is at seq {seq} but the store holds seq {row[1]}; "
                          "it is an old copy (or missed newer history) and would undo it. "
                          "Resume with --force to replace the stored state anyway.")

    def emit(self, run_id: str, event: _Event, lease: Lease | None = None) -> None:
        self._emit(run_id, [event_line(event)], lease)
        self._pipe.drain()

    def _emit(self, run_id: str, lines: list[str], lease: Lease | None) -> None:
        """Append `lines` (sent down the pipeline); under a lease, only while it is the run's
        current one (a driver fenced out by a takeover writes nothing after the new driver's
        events)."""
        head = self._heads.get(run_id)
        if head is not None:
            head.has_events = True
        params = [run_id.encode(), None if lease is None else _int(lease.epoch),
                  None if lease is None else lease.owner.encode(), _texts(lines)]
        self._pipe.send(_Statement("emit_fenced" if lease else "emit", self._EMIT[bool(lease)], params,
                                   lambda _: None, self._redo_emit))

    _EMIT: ClassVar[dict[bool, str]] = {fenced: (
        "INSERT INTO trace_events (run_id, epoch, owner, event) SELECT $1, $2::bigint, $3, t.event::jsonb "
        "FROM unnest($4::text[]) WITH ORDINALITY AS t(event, n) "
        + ("WHERE EXISTS (SELECT 1 FROM runs r WHERE r.run_id = $1 AND r.epoch = $2::bigint) " if fenced else "")
        + "ORDER BY t.n") for fenced in (False, True)}

    def _redo_emit(self, statement: _Statement) -> list[_Row]:
        """An emit again after the pipeline's connection broke: the earlier attempt may have
        committed, so only events the run does not hold yet (never the same event twice)."""
        once = "NOT EXISTS (SELECT 1 FROM trace_events e WHERE e.run_id = $1 AND e.event = t.event::jsonb)"
        sql = statement.sql.replace("ORDER BY t.n", ("AND " if "WHERE" in statement.sql else "WHERE ") + once
                                    + " ORDER BY t.n")
        return self._retry(lambda conn, _: _rows(_execute(conn, sql, statement.params)), drain=False, attempt=1)

    def sync(self, lease: Lease) -> None:
        """Read the answer of the write still in flight down the pipeline (so it is on the
        server, and on its disk at "power"); raise a refusal of one of this run's saves. At
        "process" an event alone (no state change, nothing to refuse) is left in flight: the
        server runs it even if this process is killed next."""
        if self.durability == "power" or self._pipe.commit_in_flight():
            self._pipe.drain()
        head = self._heads.get(lease.run_id)
        if head is not None and head.refused is not None:
            raise head.refused

    def handle(self, lease: Lease) -> RunHandle:
        return _PipelinedHandle(self, lease)

    # --- workspace -----------------------------------------------------------------------

    def workspace(self, run_id: str, template: Path, lease: Lease | None = None) -> Path:
        folder = self._local_workspace(run_id, lease, template)
        assert folder is not None  # with a template there is always a folder
        return folder

    def existing_workspace(self, run_id: str, lease: Lease | None = None) -> Path | None:
        return self._local_workspace(run_id, lease, None)

    def _local_workspace(self, run_id: str, lease: Lease | None, template: Path | None) -> Path | None:
        """The run's files from the database in a local folder; with no files saved, a copy of
        `template` (uploaded with the next save), or None without a template."""
        head = self._heads.get(run_id) if lease is not None else None
        if head is not None and head.ws_dir is not None:
            return head.ws_dir
        if head is not None and head.created:  # made here: no files saved yet
            rows = []
        else:
            rows = self._retry(lambda conn, _: conn.execute(
                "SELECT path, data, mode FROM workspace_files WHERE run_id = %s", (run_id,)).fetchall())
        if not rows and template is None:
            return None
        folder = self._ws_root / f"{run_id}.{lease.epoch if lease else uuid.uuid4().hex[:6]}"
        shutil.rmtree(folder, ignore_errors=True)
        seen: dict[str, tuple[int, int]] = {}
        if rows:
            for path, data, mode in rows:
                target = folder / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                os.chmod(target, mode)
                st = target.stat()
                seen[path] = (st.st_size, st.st_mtime_ns)
        else:  # first use: the template's files, uploaded with the next save
            assert template is not None
            shutil.copytree(template, folder, symlinks=True)
        if head is not None:
            head.ws_dir, head.ws_seen = folder, seen
        return folder

    @staticmethod
    def _scan(folder: Path) -> dict[str, tuple[int, int]]:
        files = {}
        for dirpath, _, names in os.walk(folder):
            for name in names:
                path = Path(dirpath) / name
                if path.is_symlink() or not path.is_file():
                    continue
                st = path.stat()
                files[str(path.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
        return files

    def _workspace_changes(self, head: _Head, run_id: str
                           ) -> tuple[list[tuple[str, bytes, int]], list[str], dict[str, tuple[int, int]]] | None:
        """The workspace files changed since the last save ((path, data, mode) each), those
        gone, and the new scan; None when there is no local copy or nothing changed."""
        if head.ws_dir is None:
            return None
        now = self._scan(head.ws_dir)
        changed = [p for p, sig in now.items() if head.ws_seen.get(p) != sig]
        gone = [p for p in head.ws_seen if p not in now]
        if not changed and not gone:
            return None
        rows = []
        for p in changed:
            path = head.ws_dir / p
            rows.append((p, path.read_bytes(), path.stat().st_mode & 0o7777))
        return rows, gone, now

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            leases = [h.lease for h in self._heads.values()]
        for lease in leases:
            try:
                self.release(lease)
            except (self._psycopg.Error, StoreError):
                pass
        self._pipe.close()
        self.pool.close()
        shutil.rmtree(self._ws_root, ignore_errors=True)


@dataclass
class _Statement:
    """One write for the pipeline: a named statement ($1... placeholders), its parameters in
    text form, what to do with its result, and how to do it again on a pooled connection."""

    name: str
    sql: str
    params: Sequence[bytes | None]
    check: Callable[[list[_Row]], None]
    """Called with the rows it returned once they are read."""
    redo: Callable[[_Statement], list[_Row]]
    run_id: str = ""
    token: str = ""
    """The write's `runs.last_write` token: a redo that finds it committed does nothing."""
    commit: bool = False
    """A state change (a save): `PostgresStore.sync` reads its result before an effect."""


class _Pipeline:
    """The driving path's writes, on a connection of their own in libpq's pipeline mode.

    Each statement is sent with a sync of its own (so it is its own implicit transaction),
    prepared once, and at most one is unanswered at a time: a server whose client is gone
    (a kill of this process) still runs the statement its socket holds, but ends the session
    at the first reply it cannot deliver, so a second one sent behind it would be lost. Over
    a Unix socket the answer is read when the next statement goes, before an effect
    (`PostgresStore.sync`) or before any read through the pool, so the run moves on while the
    server runs it. Over TCP a kill with an answer unread resets the connection, which may
    drop what the server has not read yet: there a commit's answer is read as soon as it is
    sent (an event between commits may still be lost with the kill; never a commit). If the
    connection breaks, the statement in flight is done again through the pool
    (`_Statement.redo`; a write's token keeps it from being made twice).
    """

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._conn: Any = None
        self._prepared: set[str] = set()
        self._in_flight: list[_Statement] = []
        self._lock = threading.RLock()
        self._socket = True
        """The server is reached over a Unix socket (see the class)."""

    def send(self, statement: _Statement) -> None:
        from psycopg import OperationalError

        with self._lock:
            self.drain()  # one unanswered statement at most (see the class)
            try:
                pg = self._pgconn()
                if statement.name not in self._prepared:
                    pg.send_prepare(statement.name.encode(), statement.sql.encode())
                    self._sent(pg, _Statement("", "", [], lambda _: None, lambda _: []))
                    self.drain()
                    self._prepared.add(statement.name)
                pg.send_query_prepared(statement.name.encode(), statement.params)
                self._sent(pg, statement)
            except OperationalError:
                if not self._in_flight or self._in_flight[-1] is not statement:
                    self._in_flight.append(statement)
                self._broken()
                return
            if statement.commit and not self._socket:
                self.drain()

    def commit_in_flight(self) -> bool:
        return any(s.commit for s in self._in_flight)

    def _sent(self, pg: Any, statement: _Statement) -> None:
        """`statement`, just queued, closed by a sync and put in the server's socket."""
        pg.pipeline_sync()
        self._in_flight.append(statement)
        while pg.flush():  # blocking mode: returns 0 once all is in the socket
            pass

    def drain(self) -> None:
        """Read the result of every statement in flight, oldest first, and pass it on."""
        from psycopg import Error, OperationalError

        with self._lock:
            while self._in_flight:
                try:
                    result = self._read_one(self._conn.pgconn)
                except OperationalError:  # the connection broke (or the server shut it)
                    self._broken()
                    return
                except Error:  # the statement failed: it is done with
                    self._in_flight.pop(0)
                    raise
                self._in_flight.pop(0).check(_rows(result))

    def close(self) -> None:
        with self._lock:
            try:
                self.drain()
            finally:
                if self._conn is not None:
                    self._conn.close()
                self._conn, self._prepared = None, set()

    def _pgconn(self) -> Any:
        if self._conn is None:
            self._conn = self._connect()
            self._socket = _over_a_socket(self._conn)
            self._conn.pgconn.nonblocking = 0
            self._conn.pgconn.enter_pipeline_mode()
        return self._conn.pgconn

    @staticmethod
    def _read_one(pg: Any) -> Any:
        """The first result (None for a prepare) of the oldest statement in flight, up to its
        sync. Raises OperationalError if the connection broke."""
        from psycopg import OperationalError, pq
        from psycopg.errors import error_from_result

        first = None
        while True:
            while pg.is_busy():
                readable = select.poll()
                readable.register(pg.socket, select.POLLIN)
                readable.poll()
                pg.consume_input()
            result = pg.get_result()
            if result is None:
                if pg.status == pq.ConnStatus.BAD:
                    raise OperationalError(pg.get_error_message())
                continue
            if result.status == pq.ExecStatus.PIPELINE_SYNC:
                break
            if first is None:
                first = result
        if first is not None and first.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
            raise error_from_result(first, encoding="utf-8")
        return first

    def _broken(self) -> None:
        """The connection broke with statements in flight: do them again through the pool."""
        if self._conn is not None:
            self._conn.close()
        self._conn, self._prepared = None, set()
        in_flight, self._in_flight = self._in_flight, []
        for statement in in_flight:
            if statement.name:
                statement.check(statement.redo(statement))


class _PipelinedHandle(RunHandle):
    """A run as the loop writes it on PostgreSQL: commits and events go down the pipeline,
    and `sync` (before each effect) reads their results."""

    store: PostgresStore

    def commit(self, state: RunState, events: Iterable[_Event] = ()) -> None:
        self.store._commit(state, list(events), self.lease)

    def tracer(self) -> Tracer:
        return _PipelinedTracer(self)


class _PipelinedTracer(_HandleTracer):
    handle: _PipelinedHandle

    def emit(self, event: _Event) -> None:  # fenced by the server: nothing to refuse here
        self.handle.store._emit(self.handle.lease.run_id, [event_line(event)], self.handle.lease)


_Row = tuple[bytes | None, ...]
"""A row as the server sent it (text format)."""


def _rows(result: Any) -> list[_Row]:
    """The rows of a libpq result (None: no rows)."""
    if result is None:
        return []
    return [tuple(result.get_value(r, c) for c in range(result.nfields)) for r in range(result.ntuples)]


def _execute(conn: Any, sql: str, params: Sequence[bytes | None]) -> Any:
    """Run `sql` with text parameters on a pooled connection; its libpq result."""
    from psycopg import OperationalError, pq
    from psycopg.errors import error_from_result

    result = conn.pgconn.exec_params(sql.encode(), params)
    if result.status in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
        return result
    if conn.pgconn.status == pq.ConnStatus.BAD:
        raise OperationalError(conn.pgconn.get_error_message())
    raise error_from_result(result, encoding="utf-8")


def _int(value: int) -> bytes:
    return str(value).encode()


def _bool(value: bool) -> bytes:
    return b"t" if value else b"f"


def _ints(values: list[int]) -> bytes:
    return ("{" + ",".join(map(str, values)) + "}").encode()


def _texts(values: list[str]) -> bytes:
    """A text[] literal."""
    return ("{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}").encode()


class _Lost(LeaseLost):
    """Renewal found these leases taken over."""

    def __init__(self, leases: list[Lease]) -> None:
        super().__init__(", ".join(f"run {x.run_id}: lease epoch {x.epoch} of {x.owner} was taken over" for x in leases))
        self.leases = leases


_WS_PREFIX = "runner-ws-"


def _sweep_workspaces() -> None:
    """Remove the local workspace folders of PostgresStores in processes that are gone (a
    process that exits without closing its store, e.g. `os._exit`, leaves its folder)."""
    root = Path(tempfile.gettempdir())
    try:
        folders = [p for p in root.iterdir() if p.name.startswith(_WS_PREFIX)]
    except OSError:
        return
    for folder in folders:
        match = re.match(rf"{_WS_PREFIX}(\d+)-", folder.name)
        if match is None:
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass


def _rmdir_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def _over_a_socket(conn: Any) -> bool:
    """Whether the connection reaches its server over a Unix socket (no address). Unknown: no."""
    try:
        return not conn.info.hostaddr
    except Exception:  # an old libpq cannot say
        return False


def _pipeline_name(pid: int) -> str:
    """The `application_name` of the pipeline connection of process `pid` on this machine."""
    return f"runner pipeline {pid} {uuid.uuid5(uuid.NAMESPACE_DNS, socket.gethostname()).hex[:12]}"


def _dead_pid_here(owner: str | None) -> int | None:
    """The pid of the process `owner` (see `default_owner`) names, if it was on this machine
    and is gone; else None."""
    match = re.match(r"^[^@]*@(\S+) pid (\d+)", owner or "")
    if match is None or match.group(1) != socket.gethostname():
        return None
    pid = int(match.group(2))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return pid
    except PermissionError:
        return None
    try:  # a killed process its parent has not reaped yet is gone too (a zombie: state Z)
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None
    return pid if state == "Z" else None


def _iso(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "?"
