"""Tools: small objects with a name, a pydantic parameter model, flags and `run`.

The catalog works over a workspace folder (a per-run copy of `tasks/workspace/`):
`list_files`, `read_file`, `delete_file` (needs approval) and `scan_archive` (slow on
purpose, reports progress, honours cancellation within 50 ms). No tool reaches outside
its workspace: absolute paths, `..` and escaping symlinks are refused with a readable error.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

from pydantic import BaseModel, Field

from runner.cancel import Cancelled, CancelToken

if TYPE_CHECKING:
    from runner.state import RunState


class ToolError(Exception):
    """A failure the model can act on; its message goes back to the model as the tool result."""

    permanent: bool = False


class PermanentToolError(ToolError):
    """A failure no retry or rewording can fix (e.g. permission denied): the run stops `failed`."""

    permanent = True


class Spawner(Protocol):
    """The one capability a tool gets for starting a child run (the research tool).

    Given a fresh child state, it drives that child to a stop and returns its final state.
    If a run with the child's id already exists (the parent was resumed after a crash), that
    run is resumed instead, so no turn of the child is paid for twice. The implementation
    (in `runner.harness`) owns the store, the trace and the loop; the tool knows none of them.
    """

    async def __call__(self, child: RunState) -> RunState: ...


@dataclass
class ToolContext:
    """What a running tool may use besides its arguments.

    Attributes:
        cancel: the run's cancellation signal; long tools must honour it within 50 ms.
        progress: report a human-readable step, e.g. "scanned 200 of 1200 files".
        workspace: the folder this tool works in: the run's own copy of the workspace, or,
            for a read-only tool before any tool of the run wrote, the template itself (which
            it must not change; see `Workspace`).
        idempotency_key: stable per logical operation (run id + call id); write tools use it
            to make a re-run after a crash a no-op.
        call_id: the id of the tool call being answered.
        run_id: the id of the run making the call.
        spawn: starts (or resumes) a child run; None where child runs are not wired.
    """

    cancel: CancelToken
    workspace: Path
    progress: Callable[[str], None] = lambda label: None
    idempotency_key: str | None = None
    call_id: str = ""
    run_id: str = ""
    spawn: Spawner | None = None


class Workspace:
    """Where a run's tools work: the run's own copy of a template folder, made when the first
    tool that may write runs (`Tool.read_only` False). Until then read-only tools are handed
    the template itself, so a run that only reads never copies it (copying and removing the
    three-file task workspace costs ~0.3-0.8 ms on this machine's disk: a quarter of the
    harness's own time per turn of a short run, `scripts/bench_overhead.py`).

    Args:
        template: the folder a copy is made from, read by read-only tools until one exists.
        make: makes the run's copy and returns its path; called at most once. None: there
            is no copying, and every tool works in `path` (else in `template`).
        path: the run's copy if it exists already (a resumed run that wrote), else None.
    """

    def __init__(self, template: Path, make: Callable[[], Path] | None = None, path: Path | None = None) -> None:
        self.template = template
        self._make = make
        self._path = path if path is not None or make is not None else template

    def for_tool(self, tool: Tool) -> Path:
        """The folder `tool` works in: the run's copy (made now if `tool` may write and there
        is none yet), or the template for a read-only tool while there is no copy."""
        if self._path is None and not tool.read_only and self._make is not None:
            self._path = self._make()
        return self._path or self.template


class NoParams(BaseModel, defer_build=True):
    pass


class Tool:
    """Base class. Subclasses set the class attributes and implement `run` (async)
    or `run_sync` (executed in a worker thread; poll `ctx.cancel`)."""

    name: ClassVar[str]
    description: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = NoParams
    read_only: ClassVar[bool] = False
    """True if the tool never changes anything (its workspace included): its results may be
    reused for the same arguments, it may be handed the workspace template itself (see
    `Workspace`), and it is re-run freely after a crash. False (the safe default): it may
    write."""
    needs_approval: ClassVar[bool] = False
    idempotent: ClassVar[bool] = False
    """True if the tool honours ctx.idempotency_key (safe to re-run after a crash)."""
    blocking: ClassVar[bool] = True
    """run_sync may take long: run it in a worker thread. False for sub-millisecond file
    operations, where the thread hop would cost more than the work."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools` entry: {"type": "function", "function": {name, description, parameters}}."""
        return _schema(type(self))

    def parse(self, arguments: str) -> BaseModel:
        """Validate the model's JSON argument string.

        Raises:
            ToolError: malformed JSON or arguments that do not fit the schema (worded for the model).
        """
        try:
            raw = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ToolError(f"arguments for {self.name} are not valid JSON ({exc.msg})") from None
        if not isinstance(raw, dict):
            raise ToolError(f"arguments for {self.name} must be a JSON object")
        try:
            return self.Params.model_validate(raw)
        except ValueError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()  # type: ignore[attr-defined]
            )
            raise ToolError(f"invalid arguments for {self.name}: {problems}") from None

    async def run(self, args: BaseModel, ctx: ToolContext) -> str:
        if not self.blocking:
            return self.run_sync(args, ctx)
        import asyncio

        return await asyncio.to_thread(self.run_sync, args, ctx)

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        raise NotImplementedError


_SCHEMAS: dict[type[Tool], dict[str, Any]] = {}


def _schema(tool_class: type[Tool]) -> dict[str, Any]:
    # Built once per class: pydantic's schema generation costs ~150 µs a tool.
    if tool_class not in _SCHEMAS:
        params = tool_class.Params.model_json_schema()
        params.pop("title", None)
        params.setdefault("properties", {})
        _SCHEMAS[tool_class] = {
            "type": "function",
            "function": {"name": tool_class.name, "description": tool_class.description, "parameters": params},
        }
    return _SCHEMAS[tool_class]


@functools.lru_cache(maxsize=64)  # a run's workspace folder is runner's own: resolved once per process
def _real(folder: str) -> Path:
    return Path(folder).resolve()


def resolve_in_workspace(workspace: Path, path: str) -> Path:
    """The real path of `path` inside `workspace`.

    Raises:
        PermanentToolError: absolute path, `..`, or a symlink leading outside the workspace.
    """
    root = _real(str(workspace))
    candidate = Path(path)
    if candidate.is_absolute() or ".." in candidate.parts:
        raise PermanentToolError(
            f"permission denied: {path!r} is outside the workspace; use a name from list_files"
        )
    real = root / candidate
    probe = root
    for part in candidate.parts:  # the root is real: only a symlink below it can lead out
        probe = probe / part
        if probe.is_symlink():
            real = real.resolve()
            break
    if not real.is_relative_to(root):
        raise PermanentToolError(f"permission denied: {path!r} leads outside the workspace")
    return real


def _visible_files(workspace: Path) -> list[tuple[str, int]]:
    """(name, size in bytes) of the workspace's visible files, by name (one stat each)."""
    with os.scandir(workspace) as entries:
        return sorted((e.name, e.stat().st_size) for e in entries if not e.name.startswith(".") and e.is_file())


class ListFiles(Tool):
    name = "list_files"
    read_only = True
    blocking = False
    description = "List the files in the workspace with their sizes in bytes."

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        files = _visible_files(ctx.workspace)
        if not files:
            return "The workspace is empty."
        return "\n".join(f"{name} ({size} bytes)" for name, size in files)


class PathParams(BaseModel, defer_build=True):
    path: str = Field(description="A file name as shown by list_files, e.g. notes.txt")


class ReadFile(Tool):
    name = "read_file"
    read_only = True
    blocking = False
    description = "Read a text file from the workspace and return its contents."
    Params = PathParams

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        assert isinstance(args, PathParams)
        target = resolve_in_workspace(ctx.workspace, args.path)
        if not target.is_file() or target.name.startswith("."):
            raise ToolError(f"no such file: {args.path}. Call list_files to see what exists.")
        try:
            return target.read_text(encoding="utf-8", errors="replace")
        except PermissionError:
            raise PermanentToolError(f"permission denied: the process may not open {args.path}") from None


class DeleteFile(Tool):
    name = "delete_file"
    blocking = False
    description = "Delete a file from the workspace. Requires the user's approval."
    Params = PathParams
    read_only = False
    needs_approval = True
    idempotent = True

    LEDGER = ".deleted.jsonl"

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        assert isinstance(args, PathParams)
        target = resolve_in_workspace(ctx.workspace, args.path)
        ledger = ctx.workspace / self.LEDGER
        done = _ledger_keys(ledger)
        if ctx.idempotency_key and ctx.idempotency_key in done:
            return f"Deleted {args.path}."  # this operation already happened before a crash
        if not target.is_file() or target.name.startswith("."):
            raise ToolError(f"no such file: {args.path}. Call list_files to see what exists.")
        target.unlink()
        with ledger.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"key": ctx.idempotency_key, "path": args.path, "ts": time.time()}) + "\n")
        return f"Deleted {args.path}."


def _ledger_keys(ledger: Path) -> set[str]:
    if not ledger.exists():
        return set()
    keys = set()
    for line in ledger.read_text(encoding="utf-8").splitlines():
        try:
            keys.add(json.loads(line)["key"])
        except (ValueError, KeyError):
            continue
    return keys


def deleted_files(workspace: Path) -> list[str]:
    """Paths deleted in this workspace, in order, from the delete ledger (one per real deletion)."""
    ledger = workspace / DeleteFile.LEDGER
    if not ledger.exists():
        return []
    return [json.loads(line)["path"] for line in ledger.read_text(encoding="utf-8").splitlines() if line]


class ScanArchive(Tool):
    """Slow on purpose: 1200 files in about 3 s, progress every ~500 ms, stops within 50 ms."""

    name = "scan_archive"
    read_only = True
    description = "Scan the log archive for anomalies. Slow: takes a few seconds."
    total_files: ClassVar[int] = 1200
    step_s: ClassVar[float] = 0.05  # the longest the tool can take to notice a cancel
    steps: ClassVar[int] = 60

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        per_step = self.total_files // self.steps
        for step in range(1, self.steps + 1):
            if ctx.cancel.sleep(self.step_s):
                raise Cancelled(ctx.cancel.reason or "cancelled")
            if step % 10 == 0 and step < self.steps:
                ctx.progress(f"scanned {step * per_step} of {self.total_files} files")
        return f"Scanned {self.total_files} archived files: no anomalies beyond errors.log."


BASIC_TOOLS: tuple[type[Tool], ...] = (ListFiles, ReadFile, DeleteFile, ScanArchive)
"""The chapter's four tools; `runner.catalog` adds the research tool to make the registry."""


def cap_text(text: str, max_chars: int | None) -> tuple[str, int]:
    """`text` cut to `max_chars` characters plus a marker the model can read
    (`[truncated: N of M characters omitted]`), and N; unchanged (and 0) when it fits."""
    if max_chars is None or len(text) <= max_chars:
        return text, 0
    omitted = len(text) - max_chars
    return f"{text[:max_chars]}\n[truncated: {omitted} of {len(text)} characters omitted]", omitted
