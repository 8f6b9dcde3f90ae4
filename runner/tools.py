"""Tools: small objects with a name, a pydantic parameter model, flags and `run`.

Two catalogs of built-in tools work over a workspace folder. The demo catalog (the packaged
`tasks/workspace/`, the six-task suite, the scenarios): `list_files`, `read_file`,
`delete_file` (needs approval) and `scan_archive` (slow on purpose, reports progress, honours
cancellation within 50 ms). The folder catalog, for a folder of one's own: `list_files` (a
subfolder, recursive, sizes; hidden entries and what `.gitignore` ignores left out unless
asked), `read_file` (a line range), `search_files` (a regular expression), and the write
tools `write_file`, `edit_file`, `delete_file` (each needs approval; a ledger in the run's own
folder makes each idempotent). Every result is capped and says what it left out. No tool
reaches outside its workspace: absolute paths, `..` and escaping symlinks are refused with a
readable error.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal, Protocol

from pydantic import BaseModel, Field

from runner.cancel import Cancelled, CancelToken

if TYPE_CHECKING:
    from runner.state import ChangePreview, RunState


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
        ledger: the file where write tools record what they did (see `Ledger`), in the run's
            own folder; None: `LEDGER_NAME` inside `workspace` (the run's own copy).
        max_chars: see below.
    """

    cancel: CancelToken
    workspace: Path
    progress: Callable[[str], None] = lambda label: None
    idempotency_key: str | None = None
    call_id: str = ""
    run_id: str = ""
    spawn: Spawner | None = None
    ledger: Path | None = None
    max_chars: int | None = None
    """The most characters of a result the run keeps (`RunConfig.max_tool_result_chars`; None:
    no cap): a tool that can cut where it makes sense (a read, at a whole line) cuts below it."""


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
        ledger: where write tools keep their ledger (`ToolContext.ledger`): a file in the
            run's own folder when tools work on a folder of the user's (sandbox "none");
            None: inside the run's copy.
    """

    def __init__(self, template: Path, make: Callable[[], Path] | None = None, path: Path | None = None,
                 ledger: Path | None = None) -> None:
        self.template = template
        self._make = make
        self._path = path if path is not None or make is not None else template
        self.ledger = ledger

    def now(self) -> Path:
        """The folder as the run's tools see it now (its copy if made, else the template),
        without making a copy."""
        return self._path or self.template

    def for_tool(self, tool: Tool) -> Path:
        """The folder `tool` works in: the run's copy (made now if `tool` may write and there
        is none yet), or the template for a read-only tool while there is no copy."""
        if self._path is None and not tool.read_only and self._make is not None:
            self._path = self._make()
        return self.now()


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

    def check(self, args: BaseModel, folder: Path) -> None:
        """Raise ToolError when the call could only fail in `folder` (the run's files as they
        are now: a delete of a file that does not exist), so that no one is asked to approve
        it. The call checks again when it runs. The default finds nothing to refuse."""

    def preview(self, args: BaseModel, folder: Path) -> ChangePreview | None:
        """What approving the call would change in `folder` (the run's files as they are now),
        shown to the person asked (`change_preview`); None: the tool does not say. Raises
        nothing: a call that cannot run is refused by `check` first."""
        return None

    def json_object(self, arguments: str) -> dict[str, Any]:
        """The model's JSON argument string as an object.

        Raises:
            ToolError: malformed JSON, or JSON that is not an object (worded for the model).
        """
        try:
            raw = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ToolError(f"arguments for {self.name} are not valid JSON ({exc.msg})") from None
        if not isinstance(raw, dict):
            raise ToolError(f"arguments for {self.name} must be a JSON object")
        return raw

    def parse(self, arguments: str) -> BaseModel:
        """Validate the model's JSON argument string.

        Raises:
            ToolError: malformed JSON or arguments that do not fit the schema (worded for the model).
        """
        raw = self.json_object(arguments)
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


def _schema(tool_class: type[Tool], params_model: type[BaseModel] | None = None) -> dict[str, Any]:
    # Built once per class: pydantic's schema generation costs ~150 µs a tool.
    if tool_class not in _SCHEMAS:
        params = (params_model or tool_class.Params).model_json_schema()
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
    """(path, size in bytes) of the workspace's visible files, subfolders' included (as
    ``src/app.py``), by path; hidden files and folders left out, and folders whose own
    `.gitignore` ignores everything in them (runner's runs directory, a virtualenv)."""
    found = []
    for root, dirs, files in os.walk(workspace):
        dirs[:] = [d for d in dirs if not d.startswith(".") and not _ignores_all(Path(root, d))]
        where = Path(root).relative_to(workspace)
        for name in files:
            path = Path(root, name)
            if not name.startswith(".") and path.is_file():
                found.append(((where / name).as_posix(), path.stat().st_size))
    return sorted(found)


MAX_LIST_ENTRIES = 200
"""list_files shows at most this many entries, then says how many more there are."""
MAX_READ_CHARS = 16_000
"""read_file returns at most this many characters of a file (whole lines where it can), then
a line saying what it left out and how to read on."""
READ_ON_CHARS = 200
"""Characters kept free under a run's cap on results for the line saying where a read stopped."""
BINARY_PEEK_BYTES = 256
"""A binary file read without an offset shows this many bytes (as hex) and says how to read on."""
NO_MATCH = "No line matches "
"""How search_files' result starts when no line matched."""
MAX_SEARCH_MATCHES = 100
"""search_files shows at most this many matching lines, then says how many more there are."""
MAX_SEARCH_FILE_BYTES = 2_000_000
"""search_files and scan_archive skip files larger than this (and say so)."""
MAX_LINE_CHARS = 200
"""A matching line longer than this is cut in search_files' results."""


class Folder:
    """A folder as the folder tools see it: entries whose name starts with "." and what a
    `.gitignore` (the folder's own and those of its subfolders) ignores are left out unless
    `everything`. The patterns are gitignore's, read with `pathspec`."""

    def __init__(self, root: Path, everything: bool = False) -> None:
        self.root = _real(str(root))
        self.everything = everything
        self._rules: dict[Path, Any] = {}

    def _ignores(self, folder: Path, relative: str, is_dir: bool) -> bool:
        """True if a `.gitignore` in `folder` or above it (up to the root) ignores `relative`
        (the entry's path below the root)."""
        here = folder
        while True:
            spec = self._rules_of(here)
            if spec is not None:
                below = Path(relative).relative_to(here.relative_to(self.root)).as_posix() if here != self.root else relative
                if spec.match_file(below + ("/" if is_dir else "")):
                    return True
            if here == self.root:
                return False
            here = here.parent

    def _rules_of(self, folder: Path) -> Any:
        if folder not in self._rules:
            spec = None
            ignore = folder / ".gitignore"
            if ignore.is_file():
                import pathspec

                try:
                    spec = pathspec.GitIgnoreSpec.from_lines(ignore.read_text(encoding="utf-8", errors="replace").splitlines())
                except (ValueError, OSError):
                    spec = None
            self._rules[folder] = spec
        return self._rules[folder]

    def entries(self, folder: Path) -> list[os.DirEntry[str]]:
        """The shown entries of `folder` (a folder at or below the root), by name."""
        try:
            with os.scandir(folder) as it:
                found = sorted(it, key=lambda e: e.name)
        except (NotADirectoryError, FileNotFoundError, PermissionError):
            return []
        if self.everything:
            return found
        shown = []
        for entry in found:
            if entry.name.startswith("."):
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            relative = Path(entry.path).relative_to(self.root).as_posix()
            if not self._ignores(folder, relative, is_dir) and not (is_dir and _ignores_all(Path(entry.path))):
                shown.append(entry)
        return shown

    def files(self, folder: Path) -> Iterator[tuple[str, Path, int]]:
        """(path below the root, real path, size in bytes) of every shown file at or below
        `folder`, depth first by name; symlinks are not followed."""
        for entry in self.entries(folder):
            if entry.is_dir(follow_symlinks=False):
                yield from self.files(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                yield Path(entry.path).relative_to(self.root).as_posix(), Path(entry.path), entry.stat().st_size


def _ignores_all(folder: Path) -> bool:
    """True for a folder whose own `.gitignore` ignores everything in it (`*`), as git leaves
    it out: a virtualenv, a tool's cache, runner's runs directory."""
    try:
        lines = (folder / ".gitignore").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return False
    return "*" in (line.strip() for line in lines)


def _more(shown: int, total: int, noun: str, hint: str) -> str:
    return f"... {total - shown} more {noun} not shown ({shown} of {total} shown); {hint}"


MISSING_SHOWS = 12
"""How many of the top folder's entries an error about a missing path names."""


def _missing(kind: str, path: str, workspace: Path) -> ToolError:
    """The error for a path that names nothing: what the top folder holds as list_files shows it
    (`Folder.entries`; folders with a trailing slash), so the next call can name something
    that exists."""
    root = _real(str(workspace))
    names = [e.name + "/" * e.is_dir(follow_symlinks=False) for e in Folder(root).entries(root)]
    more = f" and {len(names) - MISSING_SHOWS} more" if len(names) > MISSING_SHOWS else ""
    held = ", ".join(names[:MISSING_SHOWS]) + more if names else "nothing"
    return ToolError(f"no such {kind}: {path}. The top folder holds: {held}.")


def _folder_arg(ctx: ToolContext, path: str | None) -> Path:
    """The real folder `path` names in the workspace (the workspace itself for None or ".").

    Raises:
        PermanentToolError: outside the workspace. ToolError: not a folder.
    """
    if path in (None, "", ".", "./"):
        return _real(str(ctx.workspace))
    folder = resolve_in_workspace(ctx.workspace, path)
    if folder.is_file():
        raise ToolError(f"{path} is a file, not a folder: read it with read_file")
    if not folder.is_dir():
        raise _missing("folder", path, ctx.workspace)
    return folder


class ListParams(BaseModel, defer_build=True):
    path: str | None = Field(default=None, description="A subfolder to list, e.g. src (default: the top folder)")
    recursive: bool = Field(default=False, description="Also list the files in every subfolder")
    include_hidden: bool = Field(
        default=False, description="Also list hidden entries (names starting with '.') and what .gitignore ignores")


class FolderListFiles(Tool):
    """list_files of the folder catalog: a subfolder, recursive, sizes, hidden and ignored
    entries left out unless asked, capped."""

    name = "list_files"
    read_only = True
    blocking = False
    description = ("List the files in a folder of the workspace with their sizes in bytes (subfolders end in /). "
                   f"Hidden entries and what .gitignore ignores are left out; at most {MAX_LIST_ENTRIES} entries.")
    Params = ListParams

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        assert isinstance(args, ListParams)
        asked = args
        root = _real(str(ctx.workspace))
        folder = _folder_arg(ctx, asked.path)
        tree = Folder(root, asked.include_hidden)
        if asked.recursive:
            lines = [f"{name} ({size} bytes)" for name, _, size in tree.files(folder)]
        else:
            lines = []
            for entry in tree.entries(folder):
                shown = Path(entry.path).relative_to(root).as_posix()
                if entry.is_dir(follow_symlinks=False):
                    lines.append(f"{shown}/")
                elif entry.is_file(follow_symlinks=False):
                    lines.append(f"{shown} ({entry.stat().st_size} bytes)")
        if not lines:
            return "The workspace is empty." if folder == root else f"{asked.path} is empty."
        if len(lines) > MAX_LIST_ENTRIES:
            hint = "give path to list one subfolder" if asked.recursive or asked.path is None else "list a subfolder"
            return "\n".join([*lines[:MAX_LIST_ENTRIES], _more(MAX_LIST_ENTRIES, len(lines), "entries", hint)])
        return "\n".join(lines)


class ListFiles(Tool):
    """list_files of the demo catalog: no parameters, every file of the workspace with its path
    (the six-task suite's prompt depends on its exact schema and text)."""

    name = "list_files"
    read_only = True
    blocking = False
    description = "List the files in the workspace with their sizes in bytes."

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        files = _visible_files(ctx.workspace)
        if not files:
            return "The workspace is empty."
        lines = [f"{name} ({size} bytes)" for name, size in files[:MAX_LIST_ENTRIES]]
        if len(files) > MAX_LIST_ENTRIES:
            lines.append(f"... and {len(files) - MAX_LIST_ENTRIES} more files")
        return "\n".join(lines)


class PathParams(BaseModel, defer_build=True):
    path: str = Field(description="A file name as shown by list_files, e.g. notes.txt")


class ReadParams(PathParams, defer_build=True):
    start_line: int | None = Field(default=None, ge=1, description="First line to read, counting from 1")
    end_line: int | None = Field(default=None, ge=1, description="Last line to read (inclusive)")
    offset: int | None = Field(default=None, ge=0, description=(
        "Characters of start_line to skip (default 0), to read on inside a line too long for one read; "
        "for a binary file, the byte to start at"))


class DemoReadParams(PathParams, defer_build=True):
    offset: int | None = Field(default=None, ge=0)
    """The character (for a binary file: the byte) to start at: not in the demo catalog's schema,
    which stays as its suite was measured with; a cut read's last line names it."""


def _text_file(folder: Path, path: str) -> Path:
    """The real path of a readable file `path` of the workspace `folder`.

    Raises:
        PermanentToolError: outside the workspace. ToolError: no such file.
    """
    target = resolve_in_workspace(folder, path)
    if target.is_dir():
        raise ToolError(f"{path} is a folder, not a file: list it with list_files")
    if not target.is_file() or target.name.startswith("."):
        raise _missing("file", path, folder)
    return target


def _read_bytes(target: Path, path: str) -> bytes:
    try:
        return target.read_bytes()
    except PermissionError:
        raise PermanentToolError(f"permission denied: the process may not open {path}") from None


def _read_text(target: Path, path: str) -> str:
    """The file's text as it is on disk (line endings kept; bytes that are not UTF-8 as U+FFFD)."""
    return _read_bytes(target, path).decode("utf-8", errors="replace")


def _is_binary(data: bytes) -> bool:
    """A NUL byte in the first 8 KB: a file no one reads as text."""
    return b"\0" in data[:8192]


def read_cap(ctx: ToolContext) -> int:
    """The most characters of a file one read returns: `MAX_READ_CHARS`, lower under a run's
    smaller cap on results, leaving room for the line that says where the read stopped."""
    if ctx.max_chars is None:
        return MAX_READ_CHARS
    return max(1, min(MAX_READ_CHARS, ctx.max_chars - READ_ON_CHARS))


def with_marker(body: str, marker: str) -> str:
    """`body` followed by the line that says what a result left out: always after a line break
    of its own, so the body is everything before the last "\\n[" of the result."""
    return f"{body}\n[{marker}]"


def read_binary(data: bytes, offset: int | None, cap: int) -> str:
    """Bytes of a binary file as hex (two characters a byte), from `offset` (None: the first
    `BINARY_PEEK_BYTES`), at most `cap` characters of it, then a line saying which bytes these
    are and how to read on.

    Raises:
        ToolError: `offset` past the end of the file.
    """
    start = offset or 0
    if start > len(data) or (start == len(data) and start > 0):
        raise ToolError(f"the file has {len(data)} bytes; offset {start} is past its end")
    count = min(BINARY_PEEK_BYTES, cap // 2) if offset is None else max(1, cap // 2)
    chunk = data[start:start + count]
    end = start + len(chunk)
    shown = f"binary file of {len(data)} bytes, shown as hex: bytes {start}-{max(end - 1, start)}"
    if end >= len(data):
        return with_marker(chunk.hex(), f"{shown}, to its end")
    return with_marker(chunk.hex(), f"{shown}; {len(data) - end} bytes left; read on with offset={end}")


def read_chars(text: str, offset: int | None, cap: int) -> str:
    """The text from character `offset`, at most `cap` characters of it (a cut falls between
    two characters, never inside one), then, when cut, a line saying what was left and the
    offset that reads on.

    Raises:
        ToolError: `offset` past the end of the text.
    """
    start = offset or 0
    if start > len(text) or (start == len(text) and start > 0):
        raise ToolError(f"the file has {len(text)} characters; offset {start} is past its end")
    if len(text) - start <= cap:
        return text[start:]
    end = start + cap
    return with_marker(text[start:end], f"characters {start + 1}-{end} of {len(text)} shown, {len(text) - end} "
                                        f"left; read on with offset={end}")


def read_lines(text: str, start: int, end: int | None, offset: int, cap: int, path: str) -> str:
    """Lines `start` to `end` (None: the last) of `text`, the first from its character `offset`,
    at most `cap` characters: whole lines, or, when the first line alone does not fit, part of
    it. Lines end at "\\n" (as grep and editors count them). A read that stops before the end
    says where, what it left and how to read on (the next start_line, or start_line and offset
    inside a line). Each call scans the text once in C (a 10 MB file: a few ms).

    Raises:
        ToolError: a range or offset that does not fit the file (worded for the model).
    """
    total = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    if end is not None and end < start:
        raise ToolError(f"end_line {end} is before start_line {start}")
    if start > max(total, 1):
        raise ToolError(f"{path} has {total} lines; start_line {start} is past its end")
    begin = len(text) - len(text.split("\n", start - 1)[-1]) if start > 1 else 0
    pos = _line_end(text, begin)
    length = pos - begin
    if offset > length or (offset == length and offset > 0):
        raise ToolError(f"line {start} of {path} has {length} characters; offset {offset} is past its end")
    if length - offset > cap:  # the line alone is longer than a read: cut inside it
        cut = offset + cap
        return with_marker(text[begin + offset:begin + cut],
                           f"line {start} of {total} cut at the size cap: characters {offset + 1}-{cut} of its "
                           f"{length} shown, {length - cut} left; read on with start_line={start}, offset={cut}")
    last = min(end or total, total)
    size, through = length - offset, start
    while through < last:
        after = _line_end(text, pos)
        if size + after - pos > cap:
            break
        size, pos, through = size + after - pos, after, through + 1
    body = text[begin + offset:pos]
    if through >= total:
        return body
    part = f" (line {start} from character {offset + 1})" if offset else ""
    capped = " (cut at the size cap)" if through < last else ""
    return with_marker(body, f"lines {start}-{through} of {total}{part}{capped}; {total - through} more lines "
                             f"({len(text) - pos} characters) not shown; read on with start_line={through + 1}")


def _line_end(text: str, at: int) -> int:
    """Where the line starting at `at` ends, its "\\n" included."""
    found = text.find("\n", at)
    return len(text) if found == -1 else found + 1


class FolderReadFile(Tool):
    """read_file of the folder catalog: a line range, a size cap that says where it cut and how
    to read on (inside a long line too), a binary file as hex."""

    name = "read_file"
    read_only = True
    blocking = False
    description = ("Read a text file from the workspace (optionally lines start_line to end_line). A long file "
                   "is cut at a whole line, a line too long for one read inside it; the result then ends with a "
                   "line in brackets saying what was left out and the arguments that read on (start_line, and "
                   "offset within a line). A binary file is shown as hex, offset counting bytes.")
    Params = ReadParams

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        assert isinstance(args, ReadParams)
        data = _read_bytes(_text_file(ctx.workspace, args.path), args.path)
        cap = read_cap(ctx)
        if _is_binary(data):
            if args.start_line is not None or args.end_line is not None:
                raise ToolError(f"{args.path} is a binary file ({len(data)} bytes): it has no lines; read it "
                                "with offset (a byte)")
            return read_binary(data, args.offset, cap)
        text = data.decode("utf-8", errors="replace")
        if args.start_line is None and args.end_line is None and not args.offset and len(text) <= cap:
            return text
        return read_lines(text, args.start_line or 1, args.end_line, args.offset or 0, cap, args.path)


class ReadFile(Tool):
    """read_file of the demo catalog: a path, the whole file up to the read cap; a longer file
    ends with a line naming the `offset` that reads on (an argument its schema leaves out, so
    that the six-task suite's prompt stays as measured)."""

    name = "read_file"
    read_only = True
    blocking = False
    description = "Read a text file from the workspace and return its contents."
    Params = DemoReadParams
    SchemaParams: ClassVar[type[BaseModel]] = PathParams

    def schema(self) -> dict[str, Any]:
        return _schema(type(self), self.SchemaParams)

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        assert isinstance(args, DemoReadParams)
        data = _read_bytes(_text_file(ctx.workspace, args.path), args.path)
        if _is_binary(data):
            return read_binary(data, args.offset, read_cap(ctx))
        return read_chars(data.decode("utf-8", errors="replace"), args.offset, read_cap(ctx))


def _searched_files(ctx: ToolContext, root: Path, path: str | None) -> Iterator[tuple[str, Path, int]]:
    """What search_files looks in: the one file `path` names, else every shown file at or
    below the folder it names (`Folder.files`)."""
    if path not in (None, "", ".", "./"):
        target = resolve_in_workspace(ctx.workspace, path)
        if target.is_file() and not target.name.startswith("."):
            yield target.relative_to(root).as_posix(), target, target.stat().st_size
            return
        if not target.is_dir():
            raise _missing("file or folder", path, ctx.workspace)
    yield from Folder(root).files(_folder_arg(ctx, path))


class SearchParams(BaseModel, defer_build=True):
    pattern: str = Field(description="A regular expression (Python syntax) for the text to find")
    path: str | None = Field(default=None, description="A file or subfolder to search (default: the whole "
                                                       "workspace)")
    ignore_case: bool | None = Field(default=None, description="Match regardless of case (default: when the "
                                                             "pattern has no capital letter)")


class SearchFiles(Tool):
    name = "search_files"
    read_only = True
    description = ("Search the workspace's text files for a regular expression; each match as file:line: text. "
                   f"Hidden files and what .gitignore ignores are skipped; at most {MAX_SEARCH_MATCHES} matches.")
    Params = SearchParams

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        assert isinstance(args, SearchParams)
        try:
            smart = args.ignore_case is None and args.pattern == args.pattern.lower()
            regex = re.compile(args.pattern, re.IGNORECASE if args.ignore_case or smart else 0)
        except re.error as exc:
            raise ToolError(f"the pattern {args.pattern!r} is not a regular expression: {exc}") from None
        root = _real(str(ctx.workspace))
        matches: list[str] = []
        total = searched = skipped = cut = 0
        for name, real, size in _searched_files(ctx, root, args.path):
            if ctx.cancel.is_cancelled:
                raise Cancelled(ctx.cancel.reason or "cancelled")
            text = _text_or_none(real, size)
            if text is None:
                skipped += 1
                continue
            searched += 1
            for number, line in enumerate(text.splitlines(), 1):
                if regex.search(line):
                    total += 1
                    if len(matches) < MAX_SEARCH_MATCHES:
                        shown = line.strip()
                        cut += len(shown) > MAX_LINE_CHARS
                        matches.append(f"{name}:{number}: {shown[:MAX_LINE_CHARS]}"
                                       + (" ..." if len(shown) > MAX_LINE_CHARS else ""))
        files = f"{searched} file{'s' if searched != 1 else ''} searched" + (
            f", {skipped} skipped (binary or over {MAX_SEARCH_FILE_BYTES:,} bytes)" if skipped else "")
        if not matches:
            return f"{NO_MATCH}{args.pattern!r} ({files})."
        if total > len(matches):
            matches.append(_more(len(matches), total, "matches", "narrow the pattern or give path"))
        long = (f"; {cut} line{'s' if cut != 1 else ''} cut at {MAX_LINE_CHARS} characters (...): read_file "
                "with its start_line shows it whole") if cut else ""
        return "\n".join(matches) + f"\n({total} match{'es' if total != 1 else ''}; {files}{long})"


def _text_or_none(real: Path, size: int) -> str | None:
    """The file's text, or None for a file too large to search or that holds a NUL byte."""
    if size > MAX_SEARCH_FILE_BYTES:
        return None
    try:
        data = real.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


class Ledger:
    """The record of a run's writes, one JSON line per write done ({"key", "op", "path",
    "said", "ts"}): a write tool called again with an idempotency key it holds (a resume after
    a crash) says what it said then and does nothing. It lives in the run's own folder
    (`ToolContext.ledger`), never in a folder of the user's."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def done(self, key: str | None) -> str | None:
        """What the write with `key` said when it was done, or None if it was not."""
        if not key or not self.path.exists():
            return None
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("key") == key:
                return str(entry.get("said") or f"Deleted {entry.get('path')}.")
        return None

    def record(self, key: str | None, op: str, path: str, said: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"key": key, "op": op, "path": path, "said": said, "ts": time.time()}) + "\n")


LEDGER_NAME = ".deleted.jsonl"
"""The ledger's name inside the run's own copy of a workspace (sandbox "copy")."""


def _ledger(ctx: ToolContext) -> Ledger:
    return Ledger(ctx.ledger if ctx.ledger is not None else ctx.workspace / LEDGER_NAME)


class DeleteFile(Tool):
    name = "delete_file"
    blocking = False
    description = "Delete a file from the workspace. Requires the user's approval."
    Params = PathParams
    read_only = False
    needs_approval = True
    idempotent = True

    LEDGER = LEDGER_NAME

    def check(self, args: BaseModel, folder: Path) -> None:
        assert isinstance(args, PathParams)
        _text_file(folder, args.path)

    def preview(self, args: BaseModel, folder: Path) -> ChangePreview | None:
        assert isinstance(args, PathParams)
        before = _current_text(folder, args.path)
        return None if before is None else change_preview(args.path, before, None)

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        assert isinstance(args, PathParams)
        ledger = _ledger(ctx)
        said = ledger.done(ctx.idempotency_key)
        if said is not None:
            return said  # this operation already happened before a crash
        target = _text_file(ctx.workspace, args.path)
        target.unlink()
        said = f"Deleted {args.path}."
        ledger.record(ctx.idempotency_key, "delete", args.path, said)
        return said


class WriteParams(BaseModel, defer_build=True):
    path: str = Field(description="The file to write, by its path in the workspace (missing folders are made)")
    content: str = Field(description="The whole new content of the file")
    overwrite: bool = Field(default=False, description=(
        "true to replace a file that exists, all of it (to change part of a file, use edit_file)"))


class WriteFile(Tool):
    name = "write_file"
    blocking = False
    description = ("Create a text file in the workspace with the given content. A file that exists is replaced "
                   "only with overwrite true, all of it: to change part of a file, use edit_file. Requires the "
                   "user's approval.")
    Params = WriteParams
    needs_approval = True
    idempotent = True

    def check(self, args: BaseModel, folder: Path) -> None:
        assert isinstance(args, WriteParams)
        self._target(args, folder)

    def preview(self, args: BaseModel, folder: Path) -> ChangePreview | None:
        assert isinstance(args, WriteParams)
        return change_preview(args.path, _current_text(folder, args.path), args.content)

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        assert isinstance(args, WriteParams)
        ledger = _ledger(ctx)
        said = ledger.done(ctx.idempotency_key)
        if said is not None:
            return said
        target = self._target(args, ctx.workspace)
        existed = target.exists()
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(args.content.encode("utf-8"))
        except PermissionError:
            raise PermanentToolError(f"permission denied: the process may not write {args.path}") from None
        said = f"{'Replaced' if existed else 'Created'} {args.path} ({len(args.content.encode())} bytes)."
        ledger.record(ctx.idempotency_key, "write", args.path, said)
        return said

    @staticmethod
    def _target(args: WriteParams, folder: Path) -> Path:
        """Where the write goes, once it may go there.

        Raises:
            PermanentToolError: outside the workspace. ToolError: a folder, or a file that
                exists without `overwrite`.
        """
        target = resolve_in_workspace(folder, args.path)
        if target.is_dir():
            raise ToolError(f"{args.path} is a folder; give a file name")
        if target.exists() and not args.overwrite:
            size = target.stat().st_size
            raise ToolError(f"{args.path} exists ({size} bytes) and write_file would replace all of it. To change "
                            f"part of it, use edit_file; to replace it, call write_file again with \"overwrite\": "
                            "true.")
        if target.exists() and (dropped := _drops_most_of(target, args.content)) is not None:
            kept, total = dropped
            raise ToolError(f"write_file would replace {args.path} ({total} lines) with {len(args.content.splitlines())} "
                            f"line(s), keeping {kept} of its lines: that drops most of the file. To change part of "
                            "it, use edit_file (old: the exact text to change, new: what to put there); to replace "
                            "it, give its whole new content.")
        return target


def _drops_most_of(path: Path, content: str) -> tuple[int, int] | None:
    """When `content` would replace a text file of four lines or more with a fragment, keeping
    fewer than half of its lines and under half its size: (lines kept, lines it has); else None
    (a rewrite of about its size, or a file too short to tell)."""
    try:
        old = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    lines = [line.strip() for line in old.splitlines() if line.strip()]
    if len(lines) < 4 or len(content) * 2 >= len(old):
        return None
    new = {line.strip() for line in content.splitlines()}
    kept = sum(1 for line in lines if line in new)
    return (kept, len(lines)) if kept * 2 < len(lines) else None


class EditParams(BaseModel, defer_build=True):
    path: str = Field(description="The file to change")
    old: str = Field(description="The exact text to replace; it must occur exactly once in the file")
    new: str = Field(description="The text to put in its place")


class EditFile(Tool):
    name = "edit_file"
    blocking = False
    description = ("Replace one snippet of a text file: old must occur exactly once (include enough of the "
                   "surrounding text). Requires the user's approval.")
    Params = EditParams
    needs_approval = True
    idempotent = True

    def check(self, args: BaseModel, folder: Path) -> None:
        self._located(args, folder)

    def preview(self, args: BaseModel, folder: Path) -> ChangePreview | None:
        assert isinstance(args, EditParams)
        try:
            _, text = self._located(args, folder)
        except ToolError:
            return None
        return change_preview(args.path, text, text.replace(args.old, args.new, 1), edit=True)

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        assert isinstance(args, EditParams)
        ledger = _ledger(ctx)
        said = ledger.done(ctx.idempotency_key)
        if said is not None:
            return said
        target, text = self._located(args, ctx.workspace)
        try:
            target.write_bytes(text.replace(args.old, args.new, 1).encode("utf-8"))
        except PermissionError:
            raise PermanentToolError(f"permission denied: the process may not write {args.path}") from None
        line = text.count("\n", 0, text.find(args.old)) + 1
        said = f"Edited {args.path} at line {line}: replaced {len(args.old)} characters with {len(args.new)}."
        ledger.record(ctx.idempotency_key, "edit", args.path, said)
        return said

    @staticmethod
    def _located(args: BaseModel, folder: Path) -> tuple[Path, str]:
        """The file to edit and its text, once `old` is known to occur in it exactly once.

        Raises:
            ToolError: no such file, `old` empty, absent or found more than once.
        """
        assert isinstance(args, EditParams)
        target = _text_file(folder, args.path)
        if not args.old:
            raise ToolError("old is empty; give the exact text to replace")
        text = _read_text(target, args.path)
        count = text.count(args.old)
        if count == 0:
            raise ToolError(f"the text of old does not occur in {args.path}" + _closest(text, args.old))
        if count > 1:
            lines: list[str] = []
            at = text.find(args.old)
            while at != -1 and len(lines) < 5:
                lines.append(str(text.count("\n", 0, at) + 1))
                at = text.find(args.old, at + 1)
            raise ToolError(f"the text of old occurs {count} times in {args.path} (at lines {', '.join(lines)}); "
                            "include more of the text around it so it occurs once")
        return target, text


CLOSEST_MAX_LINES = 20_000
"""edit_file looks for the text closest to an `old` it did not find in files of at most this many lines."""
CLOSEST_MIN_RATIO = 0.6
"""How alike (difflib's ratio, 0-1) the closest text must be to be shown."""


def _closest(text: str, old: str) -> str:
    """What an edit whose `old` is not in `text` is told: the lines of the file most like `old`
    (as many lines as `old` has; difflib's ratio), so the next call can copy them exactly; or
    only to read the file and copy, when nothing is close."""
    import difflib

    plain = "; read_file it and copy the exact text (spaces and line breaks included)"
    lines = text.split("\n")
    width = max(1, len(old.strip("\n").split("\n")))
    if len(lines) > CLOSEST_MAX_LINES:
        return plain
    wanted = old.strip("\n")
    best, at = CLOSEST_MIN_RATIO, -1
    for i in range(max(1, len(lines) - width + 1)):
        matcher = difflib.SequenceMatcher(None, "\n".join(lines[i:i + width]), wanted, autojunk=False)
        if matcher.real_quick_ratio() > best and matcher.quick_ratio() > best and matcher.ratio() > best:
            best, at = matcher.ratio(), i
    if at < 0:
        return plain
    found = "\n".join(lines[at:at + width])
    where = f"line {at + 1}" if width == 1 else f"lines {at + 1}-{at + width}"
    spaces = " (it differs only in spaces, tabs or line breaks)" if found.split() == wanted.split() else ""
    return (f". The closest text is at {where}{spaces}; copy it exactly (quotes, spaces and line breaks "
            f"included) into old:\n{found}")


PREVIEW_LINES = 80
"""A change preview's diff shows at most this many lines, then says how many more there are."""
PREVIEW_MAX_LINES = 50_000
"""Files longer than this (either side) are not compared line by line: the preview gives counts only."""


def _current_text(folder: Path, path: str) -> str | None:
    """The text of `path` in `folder` as it is now, or None when there is no such file (or it
    cannot be read)."""
    try:
        target = resolve_in_workspace(folder, path)
        return target.read_bytes().decode("utf-8", errors="replace") if target.is_file() else None
    except (ToolError, OSError):
        return None


def change_preview(path: str, before: str | None, after: str | None, edit: bool = False) -> ChangePreview:
    """What a write does to `path`: a unified diff from `before` (None: no such file) to
    `after` (None: the file is deleted), with the lines it removes and adds, its diff cut to
    `PREVIEW_LINES` lines (then one saying how many more). A side longer than
    `PREVIEW_MAX_LINES` lines is not compared: no diff, and the counts are the whole files'."""
    import difflib

    from runner.state import ChangePreview

    old = (before or "").splitlines(keepends=True)
    new = (after or "").splitlines(keepends=True)
    action: Literal["create", "replace", "edit", "delete"] = (
        "create" if before is None else "delete" if after is None else "edit" if edit else "replace")
    if max(len(old), len(new)) > PREVIEW_MAX_LINES:
        return ChangePreview(path=path, action=action, removed_lines=len(old), added_lines=len(new))
    diff = [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
            for line in difflib.unified_diff(old, new, f"a/{path}" if before is not None else "/dev/null",
                                             f"b/{path}" if after is not None else "/dev/null")]
    body = [line for line in diff if not line.startswith(("---", "+++", "@@"))]
    removed = sum(1 for line in body if line.startswith("-"))
    added = sum(1 for line in body if line.startswith("+"))
    shown = "".join(diff).splitlines()
    if len(shown) > PREVIEW_LINES:
        shown = [*shown[:PREVIEW_LINES], f"... {len(shown) - PREVIEW_LINES} more lines of the diff"]
    return ChangePreview(path=path, action=action, removed_lines=removed, added_lines=added, diff="\n".join(shown))


def deleted_files(where: Path) -> list[str]:
    """Paths deleted, in order (one per real deletion), from a ledger: the file itself, or a
    workspace copy holding one (`LEDGER_NAME`)."""
    ledger = where / LEDGER_NAME if where.is_dir() else where
    if not ledger.exists():
        return []
    paths = []
    for line in ledger.read_text(encoding="utf-8").splitlines():
        if line:
            entry = json.loads(line)
            if entry.get("op", "delete") == "delete":
                paths.append(entry["path"])
    return paths


@functools.cache
def _findings() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """What scan_archive counts, per file: lines that look like errors, warnings, timeouts."""
    return (("errors", re.compile(r"error|exception|traceback|fatal|\bfail(ed|s|ure)?\b", re.I)),
            ("warnings", re.compile(r"\bwarn(ing)?\b", re.I)),
            ("timeouts", re.compile(r"\btime[sd]?[ -]?out\b", re.I)))


class ScanArchive(Tool):
    """Slow on purpose: every shown file of the folder (recursively) read in `steps` steps of
    `step_s` each (about 3 s), progress every ~500 ms, stops within 50 ms. It reports what it
    read: files scanned, bytes, and per file the lines that look like errors, warnings or
    timeouts (only files it read)."""

    name = "scan_archive"
    read_only = True
    description = "Scan the log archive for anomalies. Slow: takes a few seconds."
    step_s: ClassVar[float] = 0.05  # the longest the tool can take to notice a cancel
    steps: ClassVar[int] = 60
    max_files_named: ClassVar[int] = 20

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        files = list(Folder(ctx.workspace).files(_real(str(ctx.workspace))))
        found: list[tuple[str, dict[str, int]]] = []
        scanned = total_bytes = skipped = 0
        for step in range(1, self.steps + 1):
            if ctx.cancel.sleep(self.step_s):
                raise Cancelled(ctx.cancel.reason or "cancelled")
            for name, real, size in files[len(files) * (step - 1) // self.steps: len(files) * step // self.steps]:
                text = _text_or_none(real, size)
                if text is None:
                    skipped += 1
                    continue
                scanned, total_bytes = scanned + 1, total_bytes + size
                counts = {kind: sum(1 for line in text.splitlines() if rx.search(line)) for kind, rx in _findings()}
                if any(counts.values()):
                    found.append((name, counts))
            if step % 10 == 0 and step < self.steps:
                ctx.progress(f"scanned {len(files) * step // self.steps} of {len(files)} files")
        return _scan_report(scanned, total_bytes, skipped, found, self.max_files_named)


def _scan_report(scanned: int, total_bytes: int, skipped: int, found: list[tuple[str, dict[str, int]]],
                 named: int) -> str:
    head = f"Scanned {scanned} file{'s' if scanned != 1 else ''} ({total_bytes:,} bytes)" + (
        f"; {skipped} skipped (binary or over {MAX_SEARCH_FILE_BYTES:,} bytes)" if skipped else "")
    if not found:
        return f"{head}: no line looks like an error, a warning or a timeout."
    lines = [f"{head}; lines that look like errors, warnings or timeouts:"]
    for name, counts in found[:named]:
        lines.append(f"{name}: " + ", ".join(f"{n} {kind if n != 1 else kind[:-1]}" for kind, n in counts.items() if n))
    if len(found) > named:
        lines.append(f"... and {len(found) - named} more files with such lines")
    return "\n".join(lines)


BASIC_TOOLS: tuple[type[Tool], ...] = (ListFiles, ReadFile, DeleteFile, ScanArchive)
"""The demo catalog's four tools (the packaged workspace, the six-task suite, the scenarios);
`runner.catalog` adds the research tool to make the registry."""
FOLDER_TOOL_CLASSES: tuple[type[Tool], ...] = (FolderListFiles, FolderReadFile, SearchFiles, WriteFile, EditFile, DeleteFile,
                                               ScanArchive)
"""Tools for a folder of one's own (`RunConfig.builtin_tools` "folder"), by name in `runner.catalog`."""


CAP_HINT = "the rest is not kept; ask the tool for less at a time (a narrower query or a smaller range)"
"""How a result cut by `cap_text` says to read on, unless its caller knows better."""


def cap_text(text: str, max_chars: int | None, hint: str = CAP_HINT) -> tuple[str, int]:
    """`text` cut to at most `max_chars` characters, its last line saying what was left out
    (``[cut: characters 1-K of N shown, M left out; HINT]``), and M; unchanged (and 0) when it
    fits. The cut falls between two characters, never inside one; a `max_chars` too small for
    the line keeps no text and the line alone."""
    if max_chars is None or len(text) <= max_chars:
        return text, 0

    def marker(kept: int) -> str:
        return f"cut: characters 1-{kept} of {len(text)} shown, {len(text) - kept} left out; {hint}"

    kept = max(0, max_chars - len(marker(max_chars)) - 3)  # "\n[" and "]"; fewer digits than max_chars'
    return with_marker(text[:kept], marker(kept)), len(text) - kept


def acts_on_folder(tool: Tool) -> bool:
    """True for runner's built-in tools, which act on the run's folder (a tool of one's own or
    an MCP server's acts wherever it acts; its own flags govern it)."""
    return type(tool) in (*BASIC_TOOLS, *FOLDER_TOOL_CLASSES)
