"""The `RunStore` seam: what any place that keeps runs must do, and the errors it raises.

A store keeps, per run: the `RunState` (with a sequence number `seq`), its trace, and its
workspace. Every transition is one `save(state, events, lease)`: the state and that
transition's trace events are committed together, or not at all. A run is driven by one
process at a time: `claim` hands out a `Lease` (owner + epoch); saves carry the lease and are
refused when it is no longer the current one (fencing), and refused when the state does not
follow the stored sequence (an old copy cannot overwrite newer history).

Two stores implement it: `runner.store.files.FileStore` (the default, one folder per run,
`flock` per run) and `runner.store.postgres.PostgresStore` (many workers, SKIP LOCKED claims).
The shared helpers here (`Delta`, `event_line`) are how both write only what changed.
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from runner.errors import CorruptState, RunBusy, RunnerError, RunNotFound
from runner.state import RunState
from runner.trace import TraceEvent, Tracer, _Event

__all__ = ["CorruptState", "Lease", "LeaseLost", "RunBusy", "RunHandle", "RunInfo", "RunNotFound", "RunStore",
           "StaleState", "StoreError"]

ShownStatus = Literal["running", "completed", "failed", "max_turns_exceeded", "budget_exceeded",
                      "interrupted", "died", "queued"]
APPEND_ONLY = ("messages", "per_turn", "tool_runs")
"""RunState lists that only grow during a run: a save writes their new items, not the lists."""


class StoreError(RunnerError):
    """A run store problem that is not about one run's data (e.g. the database is unreachable)."""


class StaleState(CorruptState):
    """The state does not follow the stored one (its `seq` is behind): an old copy, or a
    writer that missed newer history. `--force` may override, and the override is traced."""


class LeaseLost(StoreError):
    """This process no longer holds the run's lease (another driver claimed it: a newer
    epoch); it must stop writing."""


def default_owner() -> str:
    """Who is driving: `user@host pid N` (shown by `runner runs` and recorded in verdicts)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


@dataclass
class Lease:
    """The right to drive one run: held by `owner`, fenced by `epoch` (bumped by every claim).

    Attributes:
        expires_at: Unix seconds when the lease lapses unless renewed (None: held as long as
            the process lives, the FileStore's flock).
        lost: set when a renewal finds the lease taken; `on_lost` is called then (the harness
            cancels the run).
    """

    run_id: str
    owner: str
    epoch: int
    since: float = field(default_factory=time.time)
    expires_at: float | None = None
    lost: threading.Event = field(default_factory=threading.Event)
    on_lost: Callable[[], None] | None = None


@dataclass
class RunInfo:
    """One row of `RunStore.list`: the state, the status to show, and who drives it."""

    state: RunState
    shown_status: ShownStatus
    """The state's status, or `died` (saved as running, no live driver: resumable), or
    `queued` (waiting for a worker)."""
    driver: str | None = None
    """`owner since ISO-time` when a live process drives it."""


def event_line(event: _Event) -> str:
    """One trace line (no newline): the event's JSON without null fields, costs rounded so a
    trace shows 0.00147, not 0.0014680000000000001."""
    if hasattr(event, "costUsd"):
        event.costUsd = round(event.costUsd, 9)
    return event.model_dump_json(exclude_none=True)


@dataclass
class Delta:
    """What one save writes: the state minus its append-only lists (`rest`, small), and the
    items appended to each list since the last save (`added`), or None when a list changed in
    some other way and the whole state must be rewritten."""

    rest: dict[str, Any]
    added: dict[str, list[dict[str, Any]]] | None
    start: dict[str, int]
    """Length of each list before `added` (checked on replay)."""


@dataclass
class Written:
    """How much of each append-only list is saved, and the last saved item of each (compared
    at the next save, so an item edited in place forces a full rewrite, never a silent loss)."""

    lengths: dict[str, int]
    last: dict[str, Any]

    @classmethod
    def of(cls, state: RunState) -> Written:
        return cls({k: len(getattr(state, k)) for k in APPEND_ONLY},
                   {k: _last(getattr(state, k)) for k in APPEND_ONLY})


def _last(items: list[Any]) -> Any:
    return items[-1].model_dump(mode="json") if items else None


def delta(state: RunState, written: Written | None) -> Delta:
    """Split `state` into what changed since `written` (None: nothing known, full rewrite)."""
    rest = state.model_dump(mode="json", exclude=set(APPEND_ONLY))
    start = {k: len(getattr(state, k)) for k in APPEND_ONLY}
    if written is None:
        return Delta(rest, None, start)
    added: dict[str, list[dict[str, Any]]] = {}
    for key in APPEND_ONLY:
        items, n = getattr(state, key), written.lengths[key]
        if len(items) < n or (n and items[n - 1].model_dump(mode="json") != written.last[key]):
            return Delta(rest, None, start)
        added[key] = [item.model_dump(mode="json") for item in items[n:]]
        start[key] = n
    return Delta(rest, added, start)


class RunStore(ABC):
    """Where runs live. Every method may raise `StoreError` subclasses as documented.

    Implementations: `FileStore` (a runs directory) and `PostgresStore` (a database URL);
    `runner.store.open_store` picks one from a `--store` value.
    """

    url: str
    """How to reach this store again (a directory path or a postgresql:// URL)."""

    @abstractmethod
    def create(self, state: RunState, *, owner: str | None = None) -> Lease | None:
        """Save a new run (its `seq` becomes 1). With `owner`, the run is created claimed by it
        and the lease is returned; without, it is queued for a worker (`runner run --detach`).

        Raises:
            StaleState: a run with that id already exists.
        """

    @abstractmethod
    def load(self, run_id: str, *, force: bool = False) -> RunState:
        """The run's latest committed state.

        Args:
            force: return an old copy found on disk instead of refusing it (FileStore).

        Raises:
            RunNotFound: no such run. CorruptState / StaleState: unreadable, or an old copy.
        """

    @abstractmethod
    def list_runs(self, *, status: str | None = None, limit: int | None = None,
             offset: int = 0) -> list[RunInfo]:
        """Runs newest first, optionally only those whose shown status is `status`; paged by
        `limit`/`offset`. Unreadable runs are skipped (FileStore: listed in `problems`)."""

    @abstractmethod
    def info(self, run_id: str) -> RunInfo:
        """One run as `list` shows it (status `died` when saved running with no live driver).

        Raises:
            RunNotFound, CorruptState: as `load`.
        """

    @abstractmethod
    def save(self, state: RunState, events: Sequence[_Event] = (), lease: Lease | None = None,
             *, force: bool = False) -> None:
        """Commit one transition: the state and these trace events, together.

        `state.seq` must equal the stored sequence; on success it is incremented. Without a
        lease, the run is claimed for the duration of the save (refused if someone drives it).

        Args:
            force: accept a state that does not follow the stored sequence (it replaces the
                stored one; a `state_forced` event records it).

        Raises:
            StaleState: `state.seq` does not follow the stored one.
            LeaseLost: `lease` is not the current lease (another driver claimed the run).
            RunBusy: no lease given, and another process drives the run.
            RunNotFound: no such run (use `create`).
        """

    @abstractmethod
    def emit(self, run_id: str, event: _Event, lease: Lease | None = None) -> None:
        """Append an event that goes with no state change (run_started, tool_progress...)."""

    @abstractmethod
    def read_trace(self, run_id: str) -> list[TraceEvent]:
        """Every committed event of the run, oldest first.

        Raises:
            RunNotFound: no such run. CorruptState: a damaged trace.
        """

    @abstractmethod
    def has_events(self, run_id: str) -> bool:
        """True if the run's trace holds any event (an earlier process worked on it)."""

    @abstractmethod
    def claim(self, run_id: str, owner: str | None = None) -> Lease:
        """Claim one run for driving (a new epoch); held until `release`.

        Raises:
            RunBusy: another live process holds it ("run X is being driven by ... since ...").
            RunNotFound: no such run.
        """

    @abstractmethod
    def claim_next(self, owner: str) -> Lease | None:
        """Claim the oldest runnable run (queued, given a verdict or a resume, or `running`
        with no live driver); None when there is none. Never hands one run to two owners."""

    @abstractmethod
    def renew(self, lease: Lease) -> None:
        """Extend the lease. Raises LeaseLost if it was taken over."""

    @abstractmethod
    def release(self, lease: Lease, *, runnable: bool = False) -> None:
        """Give the run up; `runnable` queues it for a worker (a verdict given, resume asked)."""

    @abstractmethod
    def workspace(self, run_id: str, template: Path, lease: Lease | None = None) -> Path:
        """The run's own copy of the workspace on this machine (copied from `template` on
        first use). A run that moves to another worker sees the files as its last committed
        save left them."""

    @abstractmethod
    def delete(self, lease: Lease) -> None:
        """Remove the claimed run: its state, trace and workspace. Claiming first is what keeps
        a run that some process is driving from being deleted under it (`claim` raises RunBusy)."""

    def close(self) -> None:  # noqa: B027 - optional for a store that holds nothing
        """Release connections and locks held by this object."""

    def handle(self, lease: Lease) -> RunHandle:
        """The claimed run as the loop sees it: commit and emit for `lease.run_id`."""
        return RunHandle(self, lease)

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RunHandle:
    """One claimed run, bound to its store and lease: what `loop.Runtime` writes through."""

    def __init__(self, store: RunStore, lease: Lease) -> None:
        self.store, self.lease = store, lease

    def commit(self, state: RunState, events: Iterable[_Event] = ()) -> None:
        """Save `state` and these events together (see `RunStore.save`)."""
        self.store.save(state, list(events), self.lease)

    def tracer(self) -> Tracer:
        """A `Tracer` whose events go to this run's trace in the store."""
        return _HandleTracer(self)


class _HandleTracer(Tracer):
    """Tracer for events with no state change, written through a claimed run's store."""

    def __init__(self, handle: RunHandle) -> None:
        super().__init__(None)
        self.handle = handle

    def emit(self, event: _Event) -> None:
        self.handle.store.emit(self.handle.lease.run_id, event, self.handle.lease)

    def has_events(self) -> bool:
        return self.handle.store.has_events(self.handle.lease.run_id)


_crash_counts: Counter[str] = Counter()


def crash_armed(name: str) -> bool:
    """True when RUNNER_CRASH_AT names this crash point (a test is running)."""
    spec = os.environ.get("RUNNER_CRASH_AT") or ""
    return spec.partition(":")[0] == name


def crash_point(name: str) -> None:
    """Test hook for the kill-and-resume tests: with RUNNER_CRASH_AT="name:N" set, the
    process SIGKILLs itself the N-th time it reaches `name`: reply (a model reply saved),
    tool_start (about to run a tool; writes are marked started), tool_done (a tool returned,
    result not yet saved), tool_result (a result saved), save (a save half written: part of
    the record is on disk, not committed). Does nothing otherwise."""
    spec = os.environ.get("RUNNER_CRASH_AT")
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    _crash_counts[name] += 1
    if _crash_counts[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
