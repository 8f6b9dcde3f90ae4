"""`FileStore`: runs as folders under a runs directory (the embedded default).

    runs/<run_id>/journal.jsonl  the saves: one line per transition (the first holds the whole
                                 new run), after the snapshot's if there is one
    runs/<run_id>/state.json     a snapshot of the RunState (seq S), written when the run is
                                 created (save 1) and when the journal is folded into it
                                 (compaction), replaced atomically
    runs/<run_id>/trace.jsonl    the trace, one event per line
    runs/<run_id>/workspace/     the run's private copy of the task workspace (sandbox "copy")
    runs/<run_id>/ledger.jsonl   what write tools did in a folder of the user's (sandbox "none")
    runs/<run_id>/lock           flock'ed by the process driving the run; says who and since when
    runs/<run_id>/queued         present while the run waits for a worker
    runs/.reserve/<host>-<pid>   space a process driving runs keeps aside for a full disk

A save appends one journal line holding what changed (the small part of the state, and the
messages, turn records and tool runs appended since the last save) plus that transition's
trace events: that line is the commit. With durability "process" (the default) it is written
to the OS, which keeps it through any kill of this process; with "power" it is also fsync'ed,
so it survives an OS crash or power loss (see `runner.store.base.Durability`). The events are
then appended to trace.jsonl; a kill between the two is repaired at the next claim from the
journal. Creating a run writes one journal line with the whole state, then the same state as
the snapshot: a journal damaged anywhere, even in its first bytes, never hides the run. When
the journal outgrows 256 KiB and the snapshot, a new snapshot is written
and the journal restarts (compaction), so a save costs what changed, not the transcript.

A kill at any point leaves a loadable run: a torn journal line is ignored (and cut at the next
claim), a torn snapshot write never replaces state.json. A `state.json` older than the journal's
base (a restored backup) is refused (`StaleState`) unless loaded with `force`. A `state.json`
that is not a JSON object makes the run damaged when the journal holds it from its first save
(`runner repair` writes a new one from the journal), and unreadable after a compaction.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import functools
import json
import os
import re
import shutil
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

from pydantic import ConfigDict, TypeAdapter, ValidationError

from runner.errors import CorruptState, DamagedRun, DiskFull, LeaseLost, RunBusy, RunNotFound, StaleState, StoreError
from runner.state import FORMAT_VERSION, RepairedInterruption, RunState, call_signature
from runner.store.base import (
    APPEND_ONLY,
    DEFAULT_DURABILITY,
    Delta,
    Durability,
    Lease,
    RepairReport,
    RunInfo,
    RunStore,
    Written,
    crash_armed,
    crash_point,
    default_owner,
    delta,
    event_line,
    store_options,
)
from runner.trace import RunRepaired, StateForced, TraceEvent, _Event, read_trace

_TRACE: TypeAdapter[TraceEvent] = TypeAdapter(TraceEvent, config=ConfigDict(defer_build=True))  # built on first use
RESERVE_NAME = ".reserve"
RESERVE_BYTES = 32 * 1024
"""Space a process driving runs keeps aside in the runs directory (`.reserve/<host>-<pid>`,
allocated at its first claim, removed when it exits), freed when the disk is full so its runs
can still commit that they stopped. One file per process, not per run: creating and freeing
an allocated file costs more than a whole run's commits on some disks."""
_HOST = os.uname().nodename
_RESERVES: dict[Path, tuple[int, Path]] = {}
"""Runs directory -> (pid, this process's reserve in it)."""
COMPACT_MIN_BYTES = 256 * 1024
"""The journal is folded into a new snapshot once it is larger than this and the snapshot."""


@dataclass
class _Replay:
    """A run read from disk: the state as a dict, and where its files stand."""

    data: dict[str, Any]
    seq: int
    snapshot_bytes: int
    journal_valid_bytes: int
    """Bytes of the journal up to the last complete line (a torn tail is beyond)."""
    journal_bytes: int
    last_records: list[Any] = field(default_factory=list)
    """The last committed save's events as the journal holds them (see `last_events`)."""
    last_trace_at: int | None = None
    last_trace_to: int | None = None
    """Where the trace ended after the last committed save's events (repair point)."""
    journal_seq: int = 0
    """The newest sequence number the journal knows (its base or its last record)."""
    base: int = 0
    """The save the journal starts after (its header; > 0 once it was folded into state.json)."""
    stale: str | None = None
    """Why the snapshot is an old copy, if it is."""
    damage: str | None = None
    """Where and why the journal is damaged (a whole record that fails its checksum, is not
    JSON, or does not follow the one before it); the replay stops at the last good record."""
    damage_brief: str = ""
    """`damage` without the path, for a table."""
    snapshot_damage: str | None = None
    """Why state.json could not be read, when the journal holds the run from its first save
    (the run is then damaged: `runner repair` writes a new state.json from the journal)."""
    damaged_lines: list[bytes] = field(default_factory=list)
    """The whole lines from the damaged record on (what a repair drops)."""
    events: list[str] | None = None
    """Every committed event the journal holds, oldest first (collected on request)."""

    @property
    def last_events(self) -> list[str]:
        """The last committed save's events, one JSON line each (made when asked: a replay
        that only reads the state never needs them)."""
        return [json.dumps(e, separators=(",", ":")) for e in self.last_records]


@dataclass
class _Head:
    """A run claimed by this process: its lock, open files, and the last committed save."""

    lease: Lease
    lock_fd: int
    journal_fd: int
    trace_fd: int
    seq: int
    written: Written | None
    journal_bytes: int
    snapshot_bytes: int
    trace_bytes: int
    unflushed: bool = False
    """Durability "power": commits written since the last flush (made at the next `sync`)."""
    new_names: bool = False
    """Durability "power": the run's folder and files are new; their names are flushed with
    the next `sync`."""


def _write_atomic(path: Path, data: bytes, *, sync: bool, name_synced_later: bool = False) -> None:
    """Write `data` to `path` via a temp file unique to this writer and a rename (a kill
    leaves the old file or the new one, never half). With `sync`, the file is fsync'ed before
    the rename and its folder after it (unless `name_synced_later`: a folder flush to come
    covers the name), so the new file also survives power loss."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync and not name_synced_later:
        _sync_dir(path.parent)


def _sync_dir(folder: Path) -> None:
    """fsync a folder, so the names created or replaced in it survive power loss."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStore(RunStore):
    """Runs under one directory; see the module docstring for the layout.

    Args:
        root: the runs directory (created on first save).
        durability: "process" (a commit is written to the OS: survives any kill of this
            process) or "power" (also fsync'ed: survives an OS crash or power loss; costs one
            disk flush per transition). See `runner.store.base.Durability`.
        named_by: the option or variable `root` came from, as an error that asks for another
            folder names it (e.g. "--store").
    """

    def __init__(self, root: str | Path, *, durability: Durability = DEFAULT_DURABILITY,
                 named_by: str = "--runs-dir or $RUNNER_RUNS_DIR") -> None:
        self.root = Path(root)
        self.named_by = named_by
        self.url = str(self.root)
        self.durability = durability
        self._sync = durability == "power"
        self.problems: list[str] = []
        """One line per run `list` skipped as unreadable."""
        self._heads: dict[str, _Head] = {}

    # --- paths ---------------------------------------------------------------------------

    def run_dir(self, run_id: str) -> Path:
        """The run's folder. Raises RunNotFound for an id that is not a plain name."""
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise RunNotFound(f"not a run id: {run_id!r}")
        return self.root / run_id

    def trace_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "trace.jsonl"

    # --- reading -------------------------------------------------------------------------

    def _replay(self, run_id: str, *, events: bool = False) -> _Replay:
        """Read snapshot + journal, up to the last good record (see `_Replay.damage`).

        Args:
            events: also collect every committed event the journal holds (`_Replay.events`).

        Raises:
            RunNotFound: no such run. CorruptState: the snapshot is unreadable or missing
            while the journal starts after it (an unreadable one is damage when the journal
            holds the run from its first save). DamagedRun: not even the first record is good.
        """
        folder = self.run_dir(run_id)
        snapshot = folder / "state.json"
        missing = RunNotFound(f"no run {run_id!r} in {self.root}")
        unreadable: CorruptState | None = None
        try:
            raw, data = _read_snapshot(snapshot)
        except CorruptState as exc:  # the journal may still hold the run from its first save
            raw, data, unreadable = None, {}, exc
        seq = int(data.get("seq", 0))
        replay = _Replay(data, seq, len(raw or b""), 0, 0, events=[] if events else None)
        path = folder / "journal.jsonl"
        try:
            journal = path.read_bytes()
        except FileNotFoundError:
            if raw is None:
                raise (unreadable or missing) from None
            traced = _trace_seq(folder / "trace.jsonl")
            if traced > replay.seq:  # the saves after the snapshot went with the journal
                replay.journal_seq = traced
                replay.stale = f"journal.jsonl is missing: the trace records save {traced}, state.json holds save {seq}"
            return replay
        replay.journal_bytes = len(journal)
        try:
            self._read_records(replay, journal, path, raw is not None, snapshot)
        except CorruptState as exc:
            if unreadable is None:
                raise
            raise CorruptState(f"{unreadable}, and its journal starts after save {replay.base}: nothing else "
                               "holds the saves before") from exc
        if unreadable is not None:
            if replay.seq == 0:
                raise unreadable
            replay.snapshot_damage = str(unreadable)
            if not replay.damage:
                replay.damage, replay.damage_brief = str(unreadable), "state.json: " + str(unreadable).split(": ")[-1]
        if replay.seq == 0:
            if replay.damage:  # not one good record: nothing to rebuild a state from
                raise DamagedRun(f"run {run_id} is damaged beyond repair: {replay.damage}, and no earlier "
                                 "record or snapshot holds the run")
            raise missing  # created, but killed before its first line was whole: never committed
        _check_against_trace(replay, _trace_seq(folder / "trace.jsonl"), raw is not None)
        return replay

    def _read_records(self, replay: _Replay, journal: bytes, path: Path, has_snapshot: bool, snapshot: Path) -> None:
        """Apply the journal's whole lines to `replay`, up to the last record that follows.

        A damaged line (it fails its checksum, is not JSON, is two records run together) is
        noted (`_Replay.damage`, the first one) and passed over: a record after it that still
        follows the state (after a bad header or first record, whose state the snapshot
        written at creation holds; or the next one when the damage only cost a newline) is
        applied; the first that does not follow ends the replay. So one bad byte costs at most
        the record it hit, never the records before it."""
        pos = applied = 0
        lines = journal.split(b"\n")
        for number, line in enumerate(lines):
            end = pos + len(line) + 1
            if end > len(journal):  # no newline: a torn last line, never committed
                break
            records, why = _records_in(line)
            ended = False
            for record in records:
                behind = self._follow(replay, record, has_snapshot, snapshot)
                if behind:  # it does not follow the state so far: the replay ends here
                    why, ended = why or behind, True
                    break
            if records and not ended:
                applied = number + 1
            if why and not replay.damage:
                replay.damage = f"{path}:{number + 1}: {why}"
                replay.damage_brief = f"journal line {number + 1}: {why}"
            if ended:
                break
            pos = end
            replay.journal_valid_bytes = pos
        if replay.damage:
            replay.damaged_lines = [x for x in lines[applied:-1]]

    @staticmethod
    def _follow(replay: _Replay, record: dict[str, Any], has_snapshot: bool, snapshot: Path) -> str | None:
        """Apply one parsed journal record; None, or why it does not follow the state so far
        (the journal is then damaged at this record).

        Raises:
            CorruptState: the snapshot is missing though the journal starts after it.
        """
        if "base" in record:
            base = record["base"]
            if not isinstance(base, int):
                return "a header without a sequence number"
            replay.journal_seq, replay.base = max(replay.journal_seq, base), base
            if not has_snapshot and base > 0:
                raise CorruptState(f"{snapshot} is missing: the run's journal starts after save {base}")
            if base > replay.seq:
                replay.stale = f"state.json is an older copy (save {replay.seq}) than the journal (from save {base})"
            return None
        seq = record.get("seq")
        if not isinstance(seq, int):
            return "a record without a sequence number"
        replay.journal_seq = max(replay.journal_seq, seq)
        if replay.stale or seq <= replay.seq:
            return None
        if seq != replay.seq + 1:
            return f"save {seq} follows save {replay.seq}"
        try:
            if "full" in record:
                data = record["full"]
            else:
                for key in APPEND_ONLY:
                    have = len(replay.data.get(key, []))
                    if have != record["start"][key]:
                        return f"save {seq} appends {key} at {record['start'][key]}, the state has {have}"
                lists = {k: [*replay.data.get(k, []), *record["added"][k]] for k in APPEND_ONLY}
                data = {**record["rest"], **lists, "seq": seq}
        except (KeyError, TypeError):
            return f"save {seq} is not a journal record"
        replay.data, replay.seq = data, seq
        replay.last_records = record.get("events", [])
        if replay.events is not None:
            replay.events += replay.last_events
        replay.last_trace_at = record.get("trace_at")
        replay.last_trace_to = record.get("trace_to")
        return None

    def _state(self, replay: _Replay, run_id: str) -> RunState:
        path = self.run_dir(run_id) / "state.json"
        try:
            state = RunState.model_validate(replay.data)
        except ValidationError as exc:
            raise CorruptState(f"{path} is not a valid run state: {exc.errors()[0]['msg']}") from None
        if state.format_version > FORMAT_VERSION:
            raise CorruptState(f"{path} has format_version {state.format_version}; this runner reads <= {FORMAT_VERSION}")
        return state

    def load(self, run_id: str, *, force: bool = False) -> RunState:
        return self._loaded(self._replay(run_id), run_id, force=force)

    def _loaded(self, replay: _Replay, run_id: str, *, force: bool = False) -> RunState:
        if replay.damage:
            raise _damaged(run_id + store_options(self.root), replay)
        if replay.stale and not force:
            raise StaleState(f"{replay.stale}; repair with: runner repair {run_id}{store_options(self.root)} "
                             "(or resume with --force)")
        return self._state(replay, run_id)

    def list_runs(self, *, status: str | None = None, limit: int | None = None, offset: int = 0) -> list[RunInfo]:
        self.problems = []
        if not self.root.exists():
            return []
        infos: list[RunInfo] = []
        for folder in self.root.iterdir():
            if not _has_run(folder):
                continue
            try:
                replay = self._replay(folder.name)
                if replay.damage or replay.stale:  # listed, never hidden: as of its last good record
                    infos.append(self._damaged_info(replay, folder.name))
                    continue
                state = self._loaded(replay, folder.name)
            except RunNotFound:  # its creation was killed before the first line was whole: no run
                continue
            except CorruptState as exc:  # named once: the message may already say which run
                self.problems.append(str(exc) if folder.name in str(exc) else f"{folder.name}: {exc}")
                continue
            infos.append(self._info(state, folder))
        infos.sort(key=lambda i: i.state.created_at, reverse=True)
        if status is not None:
            infos = [i for i in infos if i.shown_status == status]
        return infos[offset: None if limit is None else offset + limit]

    def info(self, run_id: str) -> RunInfo:
        replay = self._replay(run_id)
        if replay.damage or replay.stale:
            return self._damaged_info(replay, run_id)
        return self._info(self._loaded(replay, run_id), self.run_dir(run_id))

    def _damaged_info(self, replay: _Replay, run_id: str) -> RunInfo:
        """A run whose journal is damaged, or behind its trace: shown as of its last good record."""
        return RunInfo(self._state(replay, run_id), "damaged",
                       damage=f"{replay.damage_brief or replay.stale}; repair: runner repair {run_id}"
                       f"{store_options(self.root)}")

    def _info(self, state: RunState, folder: Path) -> RunInfo:
        if state.status != "running":
            return RunInfo(state, "queued" if (folder / "queued").exists() else state.status)
        holder = self._holder(folder)
        if holder is not None:
            return RunInfo(state, "running", holder)
        return RunInfo(state, "queued" if (folder / "queued").exists() else "died")

    @staticmethod
    def _holder(folder: Path) -> str | None:
        """`owner since time` if a live process holds the run's lock, else None."""
        try:
            fd = os.open(folder / "lock", os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                info = _lock_info(fd)
                return f"{info.get('owner', '?')} since {_iso(info.get('since', 0))}"
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def read_trace(self, run_id: str) -> list[TraceEvent]:
        """The run's trace; when trace.jsonl is gone, the committed events its journal holds
        (with a line in `problems` saying what such a rebuild lacks)."""
        folder = self.run_dir(run_id)
        path = folder / "trace.jsonl"
        self.problems = []
        if not path.exists():
            if not _has_run(folder):
                raise RunNotFound(f"no trace for run {run_id!r} in {self.root}")
            replay = self._replay(run_id, events=True)
            lines = replay.events or []
            base = replay.base
            if replay.seq == 1 and not lines and not base:  # created (queued), never driven: no trace yet
                return []
            note = (f"{path} is missing: rebuilt from journal.jsonl ({len(lines)} committed events; events that "
                    "commit nothing, such as run_started, tool_progress and read-only tool starts, are not in it")
            self.problems.append(note + (f"; the journal was folded into state.json at save {base}, events before "
                                         "it are gone)" if base else ")"))
            try:
                return [_TRACE.validate_json(line) for line in lines]
            except ValidationError as exc:
                raise CorruptState(f"{folder / 'journal.jsonl'}: an event is not valid: {exc.errors()[0]['msg']}") from None
        try:
            return read_trace(path)
        except ValueError as exc:  # a pydantic error from an unexpected line
            raise CorruptState(f"{path}: {exc}") from None

    def has_events(self, run_id: str) -> bool:
        head = self._heads.get(run_id)
        if head is not None:
            return head.trace_bytes > 0
        path = self.trace_path(run_id)
        return path.exists() and path.stat().st_size > 0

    # --- claiming ------------------------------------------------------------------------

    def claim(self, run_id: str, owner: str | None = None) -> Lease:
        folder = self.run_dir(run_id)
        if not _has_run(folder):
            raise RunNotFound(f"no run {run_id!r} in {self.root}")
        return self._claim(folder, owner or default_owner())

    # --- a full disk -----------------------------------------------------------------------

    def _keep_reserve(self) -> None:
        """Set RESERVE_BYTES aside for this process (once per runs directory), and remove what
        processes of this host that are gone left behind."""
        pid, _ = _RESERVES.get(self.root, (0, None))
        if pid == os.getpid():
            return
        folder = self.root / RESERVE_NAME
        try:
            folder.mkdir(exist_ok=True)
            _drop_dead_reserves(folder)
            path = folder / f"{_HOST}-{os.getpid()}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError:
            return
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as exc:  # no room even for that (the next save says so), or not supported
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                try:
                    os.pwrite(fd, bytes(RESERVE_BYTES), 0)
                except OSError:
                    pass
        finally:
            os.close(fd)
        if not _RESERVES:
            atexit.register(_drop_reserves)
        _RESERVES[self.root] = (os.getpid(), path)

    def drop_reserve(self) -> None:
        """Remove this process's reserve in this runs directory (and the reserves' folder if
        that leaves it empty); the next claim sets one aside again."""
        pid, reserve = _RESERVES.pop(self.root, (0, None))
        if reserve is not None and pid == os.getpid():
            reserve.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                reserve.parent.rmdir()

    def _disk_full(self, exc: OSError, run_id: str) -> DiskFull:
        """Free this process's reserve and say which disk is full."""
        self.drop_reserve()
        mount = _mount_point(self.root)
        try:
            free = f", {shutil.disk_usage(mount).free:,} bytes free"
        except OSError:
            free = ""
        return DiskFull(f"the disk holding {self.root} (mounted at {mount}{free}) is full: {exc.strerror}; run {run_id} "
                        "stopped with every committed transition kept; free space, then: runner resume " + run_id
                        + store_options(self.root))

    def _write(self, fd: int, data: bytes, at: int, run_id: str) -> None:
        """Append `data` to the file `fd` (its size: `at`) whole, or not at all: on a full disk
        (or another write error) the file is cut back to `at` and `DiskFull` (`StoreError`)
        raised."""
        try:
            done = 0
            while done < len(data):
                done += os.write(fd, data[done:])
        except OSError as exc:
            try:
                os.ftruncate(fd, at)
            except OSError:
                pass
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._disk_full(exc, run_id) from None
            raise StoreError(f"cannot write run {run_id} in {self.root}: {exc.strerror or exc}") from None

    def _write_trace(self, head: _Head, data: bytes) -> None:
        """Append trace lines; on a full disk, free the reserve and try once more."""
        try:
            self._write(head.trace_fd, data, head.trace_bytes, head.lease.run_id)
        except DiskFull:
            self._write(head.trace_fd, data, head.trace_bytes, head.lease.run_id)
        head.trace_bytes += len(data)

    def _claim(self, folder: Path, owner: str, state: RunState | None = None) -> Lease:
        """Lock the run and open its head; with `state`, the run is being created: its files
        are written under the lock, the snapshot last."""
        run_id = folder.name
        if run_id in self._heads:
            head = self._heads[run_id]
            raise RunBusy(f"run {run_id} is being driven by {head.lease.owner} since {_iso(head.lease.since)}")
        fd, lease = _lock(folder, owner)
        try:
            (folder / "queued").unlink(missing_ok=True)
            self._keep_reserve()
            self._heads[run_id] = self._open_head(folder, lease, fd) if state is None else self._new_head(
                folder, lease, fd, state)
        except BaseException:
            os.close(fd)
            raise
        return lease

    def _new_head(self, folder: Path, lease: Lease, lock_fd: int, state: RunState) -> _Head:
        """The head of a run being created under its lock: nothing to read or repair. The
        commit is the journal's first line, holding the whole state (seq 1)."""
        trace_fd = os.open(folder / "trace.jsonl", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        journal_fd = os.open(folder / "journal.jsonl", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        head = _Head(lease=lease, lock_fd=lock_fd, journal_fd=journal_fd, trace_fd=trace_fd, seq=1,
                     written=Written.of(state), journal_bytes=0, snapshot_bytes=0,
                     trace_bytes=os.fstat(trace_fd).st_size)
        self._append_journal(head, _first_lines(state))
        head.snapshot_bytes = self._first_snapshot(folder, state)
        head.new_names = self._sync  # flushed with the first commit, before the run's first effect
        return head

    def _first_snapshot(self, folder: Path, state: RunState) -> int:
        """Write the new run's state (save 1) as its snapshot too, after the commit: a run
        whose journal is damaged from its first byte on is still there, as created. Replaced
        atomically, so never torn; with durability "power" its data is flushed now and its
        name with the run folder's at the first `sync`. Returns its size in bytes."""
        snapshot = state.model_dump_json().encode()
        _write_atomic(folder / "state.json", snapshot, sync=self._sync, name_synced_later=True)
        return len(snapshot)

    def _open_head(self, folder: Path, lease: Lease, lock_fd: int) -> _Head:
        """Repair what a killed writer left (torn journal line, trace missing its last
        committed events or ending in a torn line), then open the files for appending."""
        replay = self._replay(folder.name, events=True)
        if replay.damage:
            raise _damaged(folder.name + store_options(self.root), replay)
        journal = folder / "journal.jsonl"
        if replay.journal_valid_bytes < replay.journal_bytes:
            os.truncate(journal, replay.journal_valid_bytes)
        trace = folder / "trace.jsonl"
        rebuilt = not trace.exists() and bool(replay.events)
        if rebuilt:  # lost: write back what the journal committed
            _write_atomic(trace, "".join(line + "\n" for line in replay.events or ()).encode(), sync=self._sync)
        trace_fd = os.open(trace, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        size = os.fstat(trace_fd).st_size
        if rebuilt:
            pass
        elif (replay.last_trace_at is not None and replay.last_trace_to is not None
                and replay.last_trace_at <= size < replay.last_trace_to):
            # killed between the commit and the trace append: write the committed events again
            os.ftruncate(trace_fd, replay.last_trace_at)
            os.write(trace_fd, "".join(line + "\n" for line in replay.last_events).encode())
        else:
            if size and os.pread(trace_fd, 1, size - 1) != b"\n":
                os.write(trace_fd, b"\n")  # a torn event (a writer killed mid-line) stays, on its own line
            traced = _trace_seq(trace)
            if traced < replay.seq and replay.events:  # a full disk kept committed events out of it
                missing = [e for e in replay.events if int(json.loads(e).get("seq", 0)) > traced]
                os.write(trace_fd, "".join(e + "\n" for e in missing).encode())
        size = os.fstat(trace_fd).st_size
        journal_fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        state = None if replay.stale else self._state(replay, folder.name)
        return _Head(lease=lease, lock_fd=lock_fd, journal_fd=journal_fd, trace_fd=trace_fd,
                     seq=max(replay.seq, replay.journal_seq), written=Written.of(state) if state else None,
                     journal_bytes=os.fstat(journal_fd).st_size, snapshot_bytes=replay.snapshot_bytes,
                     trace_bytes=size)

    def claim_next(self, owner: str, skip: Collection[str] = ()) -> Lease | None:
        for info in reversed(self.list_runs()):  # oldest first
            if info.shown_status in ("queued", "died") and info.state.run_id not in skip:
                try:
                    return self._claim(self.run_dir(info.state.run_id), owner)
                except RunBusy:
                    continue
        return None

    def renew(self, lease: Lease) -> None:
        self._head(lease)  # a flock lasts as long as the process: nothing to extend

    def release(self, lease: Lease, *, runnable: bool = False) -> None:
        head = self._heads.get(lease.run_id)
        if head is None or head.lease is not lease:
            return
        self.sync(lease)  # the run stops being driven here: what it committed is flushed first
        del self._heads[lease.run_id]
        if runnable:
            (self.run_dir(lease.run_id) / "queued").touch()
        _write_lock(head.lock_fd, {"owner": lease.owner, "pid": os.getpid(), "since": lease.since,
                                   "epoch": lease.epoch, "held": False, "released": time.time()})
        for fd in (head.journal_fd, head.trace_fd, head.lock_fd):  # closing the lock fd unlocks
            os.close(fd)

    def delete(self, lease: Lease) -> None:
        folder = self.run_dir(lease.run_id)
        # Renamed under the lock, so no reader or claimer sees half a run; then removed.
        doomed = folder.with_name(f".deleting-{lease.run_id}-{os.getpid()}")
        os.replace(folder, doomed)
        self.release(lease)
        shutil.rmtree(doomed, ignore_errors=True)

    def _head(self, lease: Lease) -> _Head:
        head = self._heads.get(lease.run_id)
        if head is None or head.lease.epoch != lease.epoch or head.lease is not lease:
            raise LeaseLost(f"run {lease.run_id}: lease epoch {lease.epoch} of {lease.owner} is no longer held; "
                            "another process may drive the run")
        return head

    # --- writing -------------------------------------------------------------------------

    def create(self, state: RunState, *, owner: str | None = None) -> Lease | None:
        folder = self.run_dir(state.run_id)
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            if _has_run(folder):
                raise StaleState(f"run {state.run_id} already exists in {self.root}") from None
        except OSError as exc:
            raise StoreError(f"cannot keep runs in {self.root}: {exc.strerror or exc} (choose another folder with "
                             f"{self.named_by})") from None
        state.seq = 1
        if owner is not None:
            return self._claim(folder, owner, state)
        (folder / "queued").touch()
        fd = os.open(folder / "journal.jsonl", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        try:
            data = _first_lines(state)
            if crash_armed("save"):  # the kill tests: half the commit on disk, then die
                os.write(fd, data[: len(data) // 2])
                crash_point("save")
                data = data[len(data) // 2:]
            os.write(fd, data)
            if self._sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        self._first_snapshot(folder, state)
        if self._sync:
            _sync_dir(folder)
            _sync_dir(self.root)
        return None

    def save(self, state: RunState, events: Sequence[_Event] = (), lease: Lease | None = None,
             *, force: bool = False) -> None:
        if lease is None:
            created = not _has_run(self.run_dir(state.run_id))
            lease = self.create(state, owner=default_owner()) if created else self.claim(state.run_id)
            assert lease is not None
            try:
                if created:
                    for event in events:
                        self.emit(state.run_id, event, lease)
                    return
                return self.save(state, events, lease, force=force)
            finally:
                self.release(lease)
        head = self._head(lease)
        lines = [event_line(e) for e in events]
        if state.seq != head.seq:
            if not force:
                raise StaleState(
                    f"run {state.run_id}: this state is at seq {state.seq} but the store holds seq {head.seq}; "
                    "it is an old copy (or missed newer history) and would undo it. "
                    "Resume with --force to replace the stored state anyway.")
            lines.append(event_line(StateForced(runId=state.run_id, fromSeq=state.seq, storedSeq=head.seq,
                                                by=lease.owner)))
        old_seq, state.seq = state.seq, head.seq + 1
        try:
            change = delta(state, None if force else head.written)
            lines = [f'{line[:-1]},"seq":{state.seq}}}' for line in lines]  # the trace witnesses the seq
            trace = "".join(line + "\n" for line in lines).encode()
            self._append_journal(head, _record(state, change, head.trace_bytes, len(trace), lines))
        except BaseException:
            state.seq = old_seq
            raise
        head.seq = state.seq
        head.written = head.written.advanced(change.added, state) if head.written else Written.of(state)
        if lines:
            try:
                self._write_trace(head, trace)
            except StoreError:  # committed in the journal: the next claim writes these events again
                pass
        if force or head.journal_bytes > max(COMPACT_MIN_BYTES, head.snapshot_bytes):
            try:
                self._compact(head, state)
            except OSError as exc:  # no room for the snapshot: the journal keeps growing until there is
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or force:
                    raise

    def _append_journal(self, head: _Head, data: bytes) -> None:
        if crash_armed("save"):  # the kill tests: leave half a record on disk, then die
            os.write(head.journal_fd, data[: len(data) // 2])
            crash_point("save")
            os.write(head.journal_fd, data[len(data) // 2:])
        else:
            self._write(head.journal_fd, data, head.journal_bytes, head.lease.run_id)
        head.unflushed = self._sync  # flushed by `sync`, before the next effect
        head.journal_bytes += len(data)

    def sync(self, lease: Lease) -> None:
        """Durability "power": flush the commits made since the last flush (one fdatasync of the
        journal; for a new run, also its folder's and the runs directory's names), so they
        survive power loss before the run does something outside (asks the model, runs a
        tool that may write, returns). Nothing to do at "process" or when all is flushed."""
        head = self._heads.get(lease.run_id)
        if head is None or not head.unflushed:
            return
        os.fdatasync(head.journal_fd)  # the data and the file size: what a replay needs
        if head.new_names:
            _sync_dir(self.run_dir(lease.run_id))  # the new files' names, then the run folder's own
            _sync_dir(self.root)
        head.unflushed = head.new_names = False

    def _compact(self, head: _Head, state: RunState) -> None:
        """Fold the journal into a new snapshot; a kill in between leaves both readable."""
        folder = self.run_dir(state.run_id)
        snapshot = state.model_dump_json().encode()
        _write_atomic(folder / "state.json", snapshot, sync=self._sync)
        header = _seal(json.dumps({"base": state.seq}).encode())
        _write_atomic(folder / "journal.jsonl", header, sync=self._sync)
        os.close(head.journal_fd)
        head.journal_fd = os.open(folder / "journal.jsonl", os.O_WRONLY | os.O_APPEND)
        head.journal_bytes, head.snapshot_bytes = len(header), len(snapshot)

    def emit(self, run_id: str, event: _Event, lease: Lease | None = None) -> None:
        line = (event_line(event) + "\n").encode()
        head = self._heads.get(run_id)
        if head is not None:
            self._write_trace(head, line)
            return
        fd = os.open(self.trace_path(run_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def workspace(self, run_id: str, template: Path, lease: Lease | None = None) -> Path:
        ws = self.run_dir(run_id) / "workspace"
        if not ws.exists():
            tmp = ws.with_name(f"workspace.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
            shutil.copytree(template, tmp, symlinks=True, ignore=_skipping(self.root))
            try:
                os.rename(tmp, ws)
            except OSError as exc:  # another writer made it first
                shutil.rmtree(tmp, ignore_errors=True)
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            if self._sync:  # the copy's name; what tools write in it is theirs to flush
                _sync_dir(ws.parent)
        return ws

    def existing_workspace(self, run_id: str, lease: Lease | None = None) -> Path | None:
        ws = self.run_dir(run_id) / "workspace"
        return ws if ws.is_dir() else None

    def own_folder(self, run_id: str) -> Path | None:
        return self.run_dir(run_id)

    def repair(self, run_id: str) -> RepairReport:
        """Rebuild a damaged run from its last good record and its trace, under the run's lock.

        The damaged journal is kept beside it (`journal.jsonl.damaged-N`); the repaired state
        is written as a snapshot with a sequence number past every save the trace witnessed,
        and a `run_repaired` event records what was dropped. Write tools that started after
        the last good record and are still pending are marked in doubt (a resume asks before
        running them again); money the trace shows spent after it stays counted.

        Raises:
            RunNotFound, RunBusy; DamagedRun: not one good record to rebuild from.
        """
        folder = self.run_dir(run_id)
        if not _has_run(folder):
            raise RunNotFound(f"no run {run_id!r} in {self.root}")
        owner = default_owner()
        fd, _ = _lock(folder, owner)
        try:
            replay = self._replay(run_id, events=True)
            trace = folder / "trace.jsonl"
            if not replay.damage and not replay.stale:
                report = RepairReport(run_id, replay.seq, replay.seq, notes=["the journal is whole: nothing to repair"])
                if not trace.exists() and replay.events:
                    _write_atomic(trace, "".join(e + "\n" for e in replay.events).encode(), sync=True)
                    report.notes.append(f"{trace} was missing: rebuilt from the journal")
                return report
            state = self._state(replay, run_id)
            report = _losses(run_id, replay, state, _raw_trace(trace))
            journal_damaged = bool(replay.damage) and replay.damage != replay.snapshot_damage
            if state.status == "running":  # no process drives it: stopped, resumable, saying why
                source = (" of a damaged journal" if journal_damaged else
                          " of its journal (state.json was damaged)" if replay.snapshot_damage else
                          " (the saves after it were lost)")
                state.status, state.reason = "interrupted", (
                    f"repaired from save {replay.seq}{source}; resume to go on")
                state.interruption = RepairedInterruption(kept_seq=replay.seq, dropped=len(report.dropped))
            report.status = state.status
            report.notes[:0] = _keep_damaged(folder, replay, journal_damaged)
            if replay.stale:
                report.notes.insert(0, replay.stale)
            state.seq = report.new_seq = max(replay.seq, replay.journal_seq, _trace_seq(trace)) + 1
            _write_atomic(folder / "state.json", state.model_dump_json().encode(), sync=True)
            _write_atomic(folder / "journal.jsonl", _seal(json.dumps({"base": state.seq}).encode()), sync=True)
            if not trace.exists() and replay.events:
                _write_atomic(trace, "".join(e + "\n" for e in replay.events).encode(), sync=True)
            event = event_line(RunRepaired(runId=run_id, keptSeq=report.kept_seq, dropped=report.dropped,
                                           outside=report.outside, by=owner))
            tfd = os.open(trace, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                size = os.fstat(tfd).st_size
                torn = size and os.pread(tfd, 1, size - 1) != b"\n"
                os.write(tfd, (b"\n" if torn else b"") + f'{event[:-1]},"seq":{state.seq}}}\n'.encode())
                os.fsync(tfd)
            finally:
                os.close(tfd)
            return report
        finally:
            os.close(fd)

    def close(self) -> None:
        for head in list(self._heads.values()):
            self.release(head.lease)


def _skipping(root: Path) -> Callable[[str, list[str]], list[str]]:
    """A `shutil.copytree` ignore that leaves out the runs directory `root` when the folder
    copied holds it (a run on the current folder, its runs in ./runs): a copy never holds
    runner's own files, nor itself."""
    real = root.resolve()

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == real.name and Path(folder, n).resolve() == real]

    return ignore


def _lock(folder: Path, owner: str) -> tuple[int, Lease]:
    """flock the run's lock file for `owner` (a new epoch); returns the open fd and the lease.

    Raises:
        RunBusy: a live process holds it. StoreError: the lock file cannot be opened for
            writing (a read-only runs folder, one of another user's).
    """
    run_id = folder.name
    try:
        fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StoreError(f"run {run_id} cannot be driven from {folder.parent}: {exc.strerror or exc} "
                         f"({folder / 'lock'}); a run is driven where its folder can be written") from None
    for attempt in range(5):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            info = _lock_info(fd)
            if info.get("held") is not True and attempt < 4:  # a lister's brief probe: retry
                time.sleep(0.02)
                continue
            os.close(fd)
            raise RunBusy(f"run {run_id} is being driven by {info.get('owner', 'another process')} "
                          f"since {_iso(info.get('since', 0))}") from None
    try:
        epoch = int(_lock_info(fd).get("epoch", 0)) + 1
        lease = Lease(run_id=run_id, owner=owner, epoch=epoch)
        _write_lock(fd, {"owner": owner, "pid": os.getpid(), "since": lease.since, "epoch": epoch, "held": True})
    except BaseException:
        os.close(fd)
        raise
    return fd, lease


def _drop_dead_reserves(folder: Path) -> None:
    """Remove the reserves of this host's processes that no longer exist (killed ones)."""
    for entry in os.scandir(folder):
        host, _, pid = entry.name.rpartition("-")
        if host != _HOST or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            Path(entry.path).unlink(missing_ok=True)
        except OSError:
            pass


def _drop_reserves() -> None:
    """At exit: remove this process's reserves (a child forked after a claim keeps none)."""
    for pid, path in _RESERVES.values():
        if pid == os.getpid():
            path.unlink(missing_ok=True)
    _RESERVES.clear()


def _mount_point(path: Path) -> Path:
    path = path.resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def _has_run(folder: Path) -> bool:
    """The folder holds a run's files (a snapshot, or a journal: a new run has only that)."""
    return (folder / "journal.jsonl").exists() or (folder / "state.json").exists()


def _first_lines(state: RunState) -> bytes:
    """A new run's journal: the header, then the commit holding the whole state (seq 1)."""
    return _seal(b'{"base":0}') + _seal(b'{"seq":1,"trace_at":0,"trace_to":0,"full":'
                                       + state.model_dump_json().encode() + b',"events":[]}')


def _record(state: RunState, change: Delta, trace_at: int, trace_len: int, events: list[str]) -> bytes:
    """One journal line: {"seq", "trace_at", "rest", "added", "start" (or "full": the whole
    state), "trace_to", "events"}, put together from JSON pydantic already made, sealed."""
    head = f'{{"seq":{state.seq},"trace_at":{trace_at},'
    if change.added is None:
        body = f'"full":{state.model_dump_json()}'
    else:
        added = ",".join(f'"{k}":[{",".join(items)}]' for k, items in change.added.items())
        body = f'"rest":{change.rest},"added":{{{added}}},"start":{json.dumps(change.start, separators=(",", ":"))}'
    return _seal(f'{head}{body},"trace_to":{trace_at + trace_len},"events":[{",".join(events)}]}}'.encode())


def _seal(body: bytes) -> bytes:
    """A journal line: the record's JSON, a tab, its CRC-32 in 8 hex digits, a newline. JSON
    text never holds a raw tab, so the tab marks the checksum; lines written before checksums
    existed have none and are read as they are."""
    return b"%s\t%08x\n" % (body, zlib.crc32(body))


def _records_in(line: bytes) -> tuple[list[dict[str, Any]], str]:
    """The records a journal line holds, and why it is damaged ("" for a good line). A good
    line holds one. A damaged one may still hold whole sealed records: two lines run
    together by a lost or changed newline (each part found by its own checksum)."""
    record, why = _parse_record(line)
    if record is not None:
        return [record], ""
    parts = []
    start = 0
    for found in re.finditer(rb"\t([0-9a-f]{8})(?=[^0-9a-f]|$)", line):
        for begin in (start, start + 1):  # a newline lost, or turned into another byte
            body = line[begin:found.start()]
            if body.startswith(b"{") and b"%08x" % zlib.crc32(body) == found.group(1):
                try:
                    parsed = json.loads(body)
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    parts.append(parsed)
                    start = found.end()
                    break
    if parts:
        return parts, f"{why}; {len(parts)} whole record(s) run together in it were read"
    return [], why


CACHED_LINE_BYTES = 32 * 1024
"""Journal lines up to this long are parsed once per process (`_parse_record`)."""


def _parse_record(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """A journal line (without its newline) as a record, or None and why it is not one.
    Lines read again (a runs list, the view re-listing runs as they change; a replay costs
    ~1.5 ms of JSON for a 5-turn run, ~0.5 ms with its lines parsed before) come from a
    small cache: a record is read, never changed, by whoever gets it."""
    return _parse_cached(line) if len(line) <= CACHED_LINE_BYTES else _parse_line(line)


@functools.lru_cache(maxsize=256)  # at most 256 lines of 32 KiB
def _parse_cached(line: bytes) -> tuple[dict[str, Any] | None, str]:
    return _parse_line(line)


def _parse_line(line: bytes) -> tuple[dict[str, Any] | None, str]:
    body = line
    if len(line) > 9 and line[-9:-8] == b"\t":
        body = line[:-9]
        if b"%08x" % zlib.crc32(body) != line[-8:]:
            return None, "the record fails its checksum"
    try:
        record = json.loads(body)
    except ValueError:
        return None, "not a journal record (not JSON)"
    if not isinstance(record, dict):
        return None, "not a journal record"
    return record, ""


def _raw_trace(path: Path) -> list[dict[str, Any]]:
    """The trace's whole lines as dicts (with the `seq` of committed events); torn or
    unreadable lines are skipped: a repair reads what it can."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    events = []
    for line in data.split(b"\n"):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _losses(run_id: str, replay: _Replay, state: RunState, trace: list[dict[str, Any]]) -> RepairReport:
    """What a repair back to `state` (save `replay.seq`) drops, and what may have happened
    outside it, from the dropped journal lines and the trace; marks pending write calls that
    started after it as in doubt, and keeps the money spent after it counted."""
    kept = replay.seq
    report = RepairReport(run_id, kept, kept)
    after = 0  # the trace's events after the last one committed at or before the kept save
    for i, event in enumerate(trace):
        if isinstance(event.get("seq"), int) and event["seq"] <= kept:
            after = i + 1
    later = trace[after:]
    by_seq: dict[int, list[dict[str, Any]]] = {}
    for event in later:
        if isinstance(event.get("seq"), int):
            by_seq.setdefault(event["seq"], []).append(event)
    journal_seqs = []
    for line in replay.damaged_lines:
        record, _ = _parse_record(line)
        seq = record.get("seq") if record else None
        journal_seqs.append(seq if isinstance(seq, int) and seq > kept else None)
    seqs = sorted({*by_seq, *(s for s in journal_seqs if s is not None)})
    for seq in seqs:
        what = "; ".join(_describe(e) for e in by_seq.get(seq, [])) or "a state change with no event"
        report.dropped.append(f"save {seq}: {what}")
    unreadable = journal_seqs.count(None)
    if unreadable:
        report.notes.append(f"{unreadable} unreadable journal line(s) after save {kept}"
                              + (" (their saves are listed above from the trace)" if seqs else ""))
    answered = {m.tool_call_id for m in state.messages if m.role == "tool"}
    pending = {c.id: c for m in state.messages[-1:] if m.role == "assistant" for c in m.tool_calls or ()}
    spent = state.cost_usd
    for event in later:
        kind = event.get("type")
        if kind == "turn":
            spent = max(spent, float(event.get("costUsd", 0.0)))
            report.outside.append(f"turn {event.get('turn')} was paid (the run had spent ${float(event.get('costUsd', 0)):.6f} "
                                  "by then) and its reply is lost: a resume asks the model again")
        elif kind == "tool_start" and event.get("callId") not in answered:
            name, call_id = event.get("toolName", "?"), str(event.get("callId", "?"))
            writes = isinstance(event.get("seq"), int)  # only a write tool's start is committed
            said = f"{name} (call {call_id}) was started after save {kept} and may have run"
            if writes and call_id in pending:
                state.started[call_id] = call_signature(name, str(event.get("args", "")))
                said += (": it may have changed the workspace; it is marked in doubt (a resume runs it again only "
                         "if the tool is idempotent, else asks for approval first)")
            elif writes:
                said += ": it may have changed the workspace (the reply that asked for it is dropped)"
            else:
                said += " (read-only: nothing changed)"
            report.outside.append(said)
    if spent > state.cost_usd:
        report.notes.append(f"cost kept: ${spent:.6f} as the trace records (the state at save {kept} had "
                            f"${state.cost_usd:.6f}); money spent stays spent")
        state.cost_usd = spent
    return report


def _describe(event: dict[str, Any]) -> str:
    kind = event.get("type", "?")
    if kind == "turn":
        prompt = event.get("promptTokens", event.get("prompt_tokens"))  # trace format 2, then 1
        completion = event.get("completionTokens", event.get("completion_tokens"))
        return f"turn {event.get('turn')} ({prompt} + {completion} tokens)"
    if kind in ("tool_start", "tool_result"):
        return f"{kind} {event.get('toolName')} (call {event.get('callId')})"
    if kind == "run_stopped":
        return f"run_stopped {event.get('status')}"
    return str(kind)


def _keep_damaged(folder: Path, replay: _Replay, journal_damaged: bool) -> list[str]:
    """Keep copies of a run's damaged state.json and journal (or one behind its trace) beside
    them before a repair replaces them; a note saying where each is."""
    notes = []
    if replay.snapshot_damage:
        kept = folder / f"state.json.damaged-{replay.seq}"
        shutil.copyfile(folder / "state.json", kept)
        notes.append(f"the damaged state.json is kept as {kept}; a new one is written from the journal")
    if journal_damaged or (replay.stale and (folder / "journal.jsonl").exists()):
        kept = folder / f"journal.jsonl.damaged-{replay.seq}"
        shutil.copyfile(folder / "journal.jsonl", kept)
        notes.append(f"the {'damaged ' if journal_damaged else ''}journal is kept as {kept}")
    return notes


def _damaged(run_args: str, replay: _Replay) -> DamagedRun:
    """The error of a damaged run (`run_args`: its id and the options that find its store)."""
    return DamagedRun(f"the run is damaged at {replay.damage_brief} (last good: save {replay.seq}); "
                      f"repair with: runner repair {run_args}")


def _trace_seq(path: Path) -> int:
    """The seq of the last committed event in a trace file (0: none), read from its tail."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            chunk = 64 * 1024
            while True:
                start = max(0, size - chunk)
                f.seek(start)
                lines = f.read(size - start).split(b"\n")
                for line in reversed(lines[1:] if start else lines):
                    if b'"seq":' in line:
                        try:
                            return int(json.loads(line)["seq"])
                        except (ValueError, KeyError, TypeError):
                            continue
                if start == 0:
                    return 0
                chunk *= 4
    except FileNotFoundError:
        return 0


def _lock_info(fd: int) -> dict[str, Any]:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return info if isinstance(info, dict) else {}
    except ValueError:
        return {}


_LOCK_BYTES = 256


def _write_lock(fd: int, info: dict[str, Any]) -> None:
    # Padded with spaces (JSON allows them), so a shorter record rarely needs a truncate (which
    # changes the inode: ~10 µs, where fstat costs ~1).
    data = json.dumps(info).encode().ljust(_LOCK_BYTES - 1) + b"\n"  # a line: `cat lock` ends it
    os.pwrite(fd, data, 0)
    if os.fstat(fd).st_size > len(data):
        os.ftruncate(fd, len(data))


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "?"


def _read_snapshot(snapshot: Path) -> tuple[bytes | None, dict[str, Any]]:
    """The snapshot's bytes and its state as a dict; (None, {}) before the first compaction
    (the journal then holds the run from its first save).

    Raises:
        CorruptState: the snapshot is not a JSON object.
    """
    try:
        raw = snapshot.read_bytes()
    except FileNotFoundError:
        return None, {}
    try:
        data = json.loads(raw)
        assert isinstance(data, dict)
    except (ValueError, AssertionError):
        raise CorruptState(f"{snapshot} is not a valid run state: not a JSON object") from None
    return raw, data


def _check_against_trace(replay: _Replay, traced: int, has_snapshot: bool) -> None:
    """Mark `replay` stale when the trace witnessed a later save than the state holds."""
    replay.journal_seq = max(replay.journal_seq, traced)
    if traced > replay.seq and not replay.stale and not replay.damage:
        replay.stale = (f"the trace records save {traced}, the journal ends at save {replay.seq} "
                        "(lines lost, or an older copy)")
