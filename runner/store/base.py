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

import functools
import getpass
import os
import re
import shlex
import signal
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Literal, Sequence

from runner.errors import (
    CorruptState,
    DamagedRun,
    DiskFull,
    LeaseLost,
    RunBusy,
    RunNotFound,
    StaleState,
    StoreError,
    UsageError,
)
from runner.state import RunState
from runner.trace import TraceEvent, Tracer, _Event

__all__ = ["CorruptState", "DamagedRun", "DiskFull", "Durability", "Lease", "LeaseLost", "RepairReport", "RunBusy", "RunHandle",
           "RunInfo", "RunNotFound", "RunStore", "StaleState", "StoreError"]

ShownStatus = Literal["running", "completed", "failed", "max_turns_exceeded", "budget_exceeded",
                      "interrupted", "died", "queued", "damaged"]
Durability = Literal["process", "power"]
"""What a committed transition survives, as databases let you choose:

- "process" (the default): a kill of the driving process, at any point (SIGKILL included).
  The commit is in the operating system before the run moves on (FileStore: written, not
  fsync'ed; PostgreSQL: `synchronous_commit = off`, the server has it). An OS crash or power
  loss may lose the last transitions; the run then resumes from an earlier one and may repeat
  what followed it (a turn paid again, a tool call run again).
- "power": also an OS crash or power loss. Every commit is flushed to the disk first (FileStore:
  fsync of the journal line, and of the folder after a file is created or replaced;
  PostgreSQL: `synchronous_commit = on`). Costs one disk flush per transition (see the README's
  performance table for the figure on this machine).
"""
DURABILITIES: tuple[Durability, ...] = ("process", "power")
DEFAULT_DURABILITY: Durability = "process"
APPEND_ONLY = ("messages", "per_turn", "tool_runs")
"""RunState lists that only grow during a run: a save writes their new items, not the lists."""


@dataclass
class RepairReport:
    """What `RunStore.repair` did to one run.

    Attributes:
        kept_seq: the last good save the repaired state is rebuilt from.
        new_seq: the repaired state's sequence number (after every save the trace witnessed).
        dropped: one line per transition dropped (committed after the damage, now lost).
        outside: one line per thing that may have happened outside the kept state (a tool
            started, a turn paid after the last good record).
        notes: other facts (where the damaged journal was kept, cost carried over).
        status: the repaired run's status (a final one has nothing to resume).
    """

    run_id: str
    kept_seq: int
    new_seq: int
    dropped: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: str = ""


def default_owner() -> str:
    """Who is driving: `user@host pid N` (shown by `runner runs` and recorded in verdicts)."""
    return _owner(os.getpid())


@functools.lru_cache(maxsize=4)  # per pid (a forked child is another owner); the user lookup costs ~25 µs
def _owner(pid: int) -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {pid}"


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
    `queued` (waiting for a worker), or `damaged` (a bad journal record: the state shown is
    the last good one; `runner repair` first)."""
    driver: str | None = None
    """`owner since ISO-time` when a live process drives it."""
    damage: str | None = None
    """With status `damaged`: where the journal is damaged, and how to repair it."""


DEFAULT_RUNS_DIR = Path("runs")
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(value: str | Path | None) -> bool:
    return isinstance(value, str) and value.startswith(POSTGRES_SCHEMES)


def shown_url(url: str) -> str:
    """`url` as it may be printed: a password in it (`user:PASSWORD@` or `password=` in the
    query) replaced by `***`."""
    url = re.sub(r"([?&]password=)[^&#]*", r"\1***", url)
    return re.sub(r"^([a-z]+://[^:@/?#]*):[^@/?#]*@", r"\1:***@", url)


def store_options(location: str | Path) -> str:
    """What a command runner prints for a person to type needs to find the runs at `location`
    (a runs directory or a postgresql:// URL): nothing when a command given no option finds
    them ($RUNNER_STORE, else $RUNNER_RUNS_DIR, else ./runs), else " --runs-dir DIR", or
    " --store URL" for a database, its password shown as *** (never printed)."""
    text = str(location)
    found = os.environ.get("RUNNER_STORE") or os.environ.get("RUNNER_RUNS_DIR") or str(DEFAULT_RUNS_DIR)
    if text == found or (not is_postgres(found) and Path(text) == _expanded_or_same(Path(found))):
        return ""
    if is_postgres(text):
        return f" --store {shlex.quote(shown_url(text))}"
    return f" --runs-dir {shlex.quote(text)}"


def expanded(path: Path) -> Path:
    """`path` with a leading `~` or `~user` expanded.

    Raises:
        UsageError: no such user, or no home folder to expand `~` to.
    """
    try:
        return path.expanduser()
    except RuntimeError:
        raise UsageError(f"cannot tell whose home folder {str(path).split('/')[0]} is (in {path})") from None


def _expanded_or_same(path: Path) -> Path:
    try:
        return expanded(path)
    except UsageError:  # ~name of no user: not where any store is
        return path


def durability_of(value: str | None) -> Durability:
    """`value` (a --durability or $RUNNER_DURABILITY string) as a `Durability`; None or empty:
    the default.

    Raises:
        UsageError: not one of "process", "power".
    """
    if not value:
        return DEFAULT_DURABILITY
    for choice in DURABILITIES:
        if value.strip().lower() == choice:
            return choice
    raise UsageError(f"--durability (or $RUNNER_DURABILITY) must be one of {', '.join(DURABILITIES)}; got {value!r}")


def event_line(event: _Event) -> str:
    """One trace line (no newline): the event's JSON without null fields, costs rounded so a
    trace shows 0.00147, not 0.0014680000000000001."""
    if hasattr(event, "costUsd"):
        event.costUsd = round(event.costUsd, 9)
    return event.model_dump_json(exclude_none=True)


@dataclass
class Delta:
    """What one save writes, as JSON text made by pydantic (no dict round trip): the state
    minus its append-only lists and `seq` (`rest`, small), and the items appended to each
    list since the last save (`added`), or None when a list changed in some other way and the
    whole state must be rewritten."""

    rest: str
    added: dict[str, list[str]] | None
    start: dict[str, int]
    """Length of each list before `added` (checked on replay)."""


@dataclass
class Written:
    """How much of each append-only list is saved, and the JSON of the last saved item of each
    (compared at the next save, so an item edited in place forces a full rewrite, never a
    silent loss)."""

    lengths: dict[str, int]
    last: dict[str, str | None]

    @classmethod
    def of(cls, state: RunState) -> Written:
        return cls({k: len(getattr(state, k)) for k in APPEND_ONLY},
                   {k: _last(getattr(state, k)) for k in APPEND_ONLY})

    def advanced(self, added: dict[str, list[str]] | None, state: RunState) -> Written:
        """The marks after a save that wrote `added` (reusing the JSON just made)."""
        if added is None:
            return Written.of(state)
        return Written({k: self.lengths[k] + len(added[k]) for k in APPEND_ONLY},
                       {k: added[k][-1] if added[k] else self.last[k] for k in APPEND_ONLY})


def _last(items: list[Any]) -> str | None:
    return items[-1].model_dump_json() if items else None


_NOT_REST = {*APPEND_ONLY, "seq"}


def delta(state: RunState, written: Written | None) -> Delta:
    """Split `state` into what changed since `written` (None: nothing known, full rewrite)."""
    rest = state.model_dump_json(exclude=_NOT_REST)
    start = {k: len(getattr(state, k)) for k in APPEND_ONLY}
    if written is None:
        return Delta(rest, None, start)
    added: dict[str, list[str]] = {}
    for key in APPEND_ONLY:
        items, n = getattr(state, key), written.lengths[key]
        if len(items) < n or (n and items[n - 1].model_dump_json() != written.last[key]):
            return Delta(rest, None, start)
        added[key] = [item.model_dump_json() for item in items[n:]]
        start[key] = n
    return Delta(rest, added, start)


class RunStore(ABC):
    """Where runs live. Every method may raise `StoreError` subclasses as documented.

    Implementations: `FileStore` (a runs directory) and `PostgresStore` (a database URL);
    `runner.store.open_store` picks one from a `--store` value.
    """

    url: str
    """How to reach this store again (a directory path or a postgresql:// URL)."""
    durability: Durability = DEFAULT_DURABILITY
    """What a committed save survives (see `Durability`)."""

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
    def claim_next(self, owner: str, skip: Collection[str] = ()) -> Lease | None:
        """Claim the oldest runnable run (queued, given a verdict or a resume, or `running`
        with no live driver) whose id is not in `skip`; None when there is none. Never hands
        one run to two owners."""

    def sync(self, lease: Lease) -> None:  # noqa: B027 - a store that flushes every commit has nothing to do
        """Make every commit of the run so far as durable as `durability` promises. A store may
        coalesce flushes: the loop calls this before each effect outside the store (a model
        request, which is paid; a tool that may write), and `release` calls it."""

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
    def existing_workspace(self, run_id: str, lease: Lease | None = None) -> Path | None:
        """The run's copy of the workspace if it has one (as `workspace` returns it), else
        None: a run that never ran a tool that may write has none (see `runner.tools.Workspace`)."""

    def own_folder(self, run_id: str) -> Path | None:
        """A folder of the run's own on this machine, outside any workspace, where its tools
        keep records (the write tools' ledger when they act on a folder of the user's); None
        when the store keeps none (the ledger then lasts as long as the process)."""
        return None

    @abstractmethod
    def delete(self, lease: Lease) -> None:
        """Remove the claimed run: its state, trace and workspace. Claiming first is what keeps
        a run that some process is driving from being deleted under it (`claim` raises RunBusy)."""

    def repair(self, run_id: str) -> RepairReport:
        """Rebuild a damaged run from its last good record and its trace (see `RepairReport`).

        Raises:
            UsageError: this store has nothing to repair (PostgreSQL checks its own WAL).
        """
        raise UsageError(f"runner repair works on a runs directory's journals; {self.url} keeps its runs in a "
                         "database, which checks and replays its own log")

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

    def sync(self) -> None:
        """Before an effect: the commits so far are as durable as promised (`RunStore.sync`)."""
        self.store.sync(self.lease)

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


@functools.cache  # read once: the hooks sit on every save, and os.environ costs ~3 µs a look
def _crash_spec() -> tuple[str, int] | None:
    spec = os.environ.get("RUNNER_CRASH_AT")
    if not spec:
        return None
    point, _, nth = spec.partition(":")
    return point, int(nth or 1)


def crash_armed(name: str) -> bool:
    """True when RUNNER_CRASH_AT names this crash point (a test is running)."""
    spec = _crash_spec()
    return spec is not None and spec[0] == name


def crash_point(name: str) -> None:
    """Test hook for the kill-and-resume tests: with RUNNER_CRASH_AT="name:N" set, the
    process SIGKILLs itself the N-th time it reaches `name`: reply (a model reply saved),
    tool_start (about to run a tool; writes are marked started), tool_done (a tool returned,
    result not yet saved), tool_result (a result saved), save (a save half written: part of
    the record is on disk, not committed). Does nothing otherwise."""
    spec = _crash_spec()
    if spec is None or spec[0] != name:
        return
    _crash_counts[name] += 1
    if _crash_counts[name] == spec[1]:
        os.kill(os.getpid(), signal.SIGKILL)
