"""Reading suite folders: `suite.json` parsed and checked (every mistake on a line of its own,
with where it is), the shipped suites of the development set, and `--task` selection."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

from pydantic import ValidationError

from runner.errors import UsageError
from runner.resources import tasks_dir
from runner.suite.format import SUITE_CATALOG, SUITE_TOOLS, EndState, Split, SuiteDefinition, Task


def load_suite(path: Path | None = None) -> SuiteDefinition:
    """Read a suite folder (or its `suite.json`); the six-task suite of `tasks/` by default.

    Raises:
        UsageError: the folder, its `suite.json` or its `workspace/` is missing, or the file
            has mistakes: every mistake on a line of its own (where, and what is wrong).
    """
    folder = (path or tasks_dir()).expanduser()
    if folder.name == "suite.json" and folder.is_file():
        folder = folder.parent
    file = folder / "suite.json"
    if not folder.is_dir():
        raise UsageError(f"--suite {folder}: no such folder (a suite is a folder with suite.json and workspace/)")
    if not file.is_file():
        raise UsageError(f"--suite {folder}: it has no suite.json (docs/suite.md has the format)")
    try:
        suite = SuiteDefinition.model_validate_json(file.read_text(encoding="utf-8"))
    except ValidationError as exc:
        found = [f"{_where(e['loc'])}: {_what(e)}" for e in exc.errors(include_url=False)]
        found += [m for m in _raw_mistakes(file) if m.split(":")[0] not in {f.split(":")[0] for f in found}]
        raise UsageError(f"{file} has {len(found)} mistake(s):\n" + "\n".join(f"  {m}" for m in found)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {file}: {exc}") from None
    suite.folder = folder.resolve()
    suite.name = suite.name or folder.resolve().name
    mistakes = _mistakes(suite)
    if mistakes:
        raise UsageError(f"{file} has {len(mistakes)} mistake(s):\n" + "\n".join(f"  {m}" for m in mistakes))
    return suite


def _where(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a path into the file: tasks[3].check.all[0], a path key
    in brackets (tasks[0].end.files['a.txt'].content)."""
    out = ""
    for before, part in zip((None, *loc), loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif before == "files":
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "the file"


def _raw_mistakes(file: Path) -> list[str]:
    """The mistakes `_mistakes` finds that a file with other mistakes still shows: task ids
    given twice and patterns that are not regular expressions (read from the raw JSON)."""
    try:
        tasks = json.loads(file.read_text(encoding="utf-8")).get("tasks")
    except (ValueError, AttributeError, OSError):
        return []
    out, seen = [], set()
    for i, task in enumerate(tasks if isinstance(tasks, list) else []):
        if not isinstance(task, dict):
            continue
        if isinstance(task.get("id"), str) and task["id"] in seen:
            out.append(f"tasks[{i}].id: {task['id']!r} is the id of an earlier task")
        seen.add(task.get("id"))
        check: dict[str, Any] = task["check"] if isinstance(task.get("check"), dict) else {}
        for field in ("all", "none"):
            for j, pattern in enumerate(check.get(field) or []):
                try:
                    re.compile(pattern) if isinstance(pattern, str) else None
                except re.error as exc:
                    out.append(f"tasks[{i}].check.{field}[{j}]: not a regular expression ({exc})")
    return out


def _what(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        loc = error["loc"]
        where = ("a file's check" if "files" in loc else "a task's end" if "end" in loc else
                 "a task's check" if "check" in loc else "a task" if "tasks" in loc else "a suite")
        return f"not a field of {where} (docs/suite.md lists them)"
    if error["type"] == "missing":
        return "is missing"
    if error["type"] == "value_error":
        return str(error["ctx"]["error"])
    if error["type"] == "json_invalid":
        return f"not valid JSON ({error['ctx'].get('error', '')})"
    return str(error["msg"])


def _mistakes(suite: SuiteDefinition) -> list[str]:
    """What a well-formed suite.json still gets wrong: patterns that are not regular
    expressions, task ids given twice, unknown tools, a missing workspace, end-state checks
    on paths the workspace does not hold."""
    out = []
    if not suite.workspace.is_dir():
        out.append(f"workspace/: there is no folder {suite.workspace} for the tools to work over")
    out += _tool_mistakes(suite) + _own_tool_mistakes(suite) + _mcp_mistakes(suite)
    seen: set[str] = set()
    for i, task in enumerate(suite.tasks):
        if task.id in seen:
            out.append(f"tasks[{i}].id: {task.id!r} is the id of an earlier task")
        seen.add(task.id)
        out += _task_mistakes(f"tasks[{i}]", task, suite)
    return out


def _tool_mistakes(suite: SuiteDefinition) -> list[str]:
    """Tools `tools` names that its catalog does not hold."""
    from runner.catalog import DEMO, FOLDER
    from runner.research import Research

    out = []
    catalog = suite.catalog or SUITE_CATALOG
    offered = [*(FOLDER if catalog == "folder" else DEMO), Research.name]
    for name in suite.tools or []:
        if name not in offered:
            other = "demo" if catalog == "folder" else "folder"
            elsewhere = name in (DEMO if other == "demo" else FOLDER)
            hint = f'; it is in the {other} catalog: add "catalog": "{other}"' if elsewhere else ""
            out.append(f"tools: {name!r} is not a tool of the {catalog} catalog ({', '.join(offered)}){hint}")
    return out


def _own_tool_mistakes(suite: SuiteDefinition) -> list[str]:
    """Own tools that cannot be imported, or are named like a built-in tool the suite offers."""
    from runner.catalog import load
    from runner.errors import UnknownTool

    out = []
    for name in suite.own_tools:
        if name in (suite.tools or SUITE_TOOLS):
            out.append(f"own_tools.{name}: the suite offers a built-in tool of that name")
            continue
        try:
            load(suite.tool_ref(name), expect=name)
        except UnknownTool as exc:
            out.append(f"own_tools.{name}: {exc}")
    return out


def _mcp_mistakes(suite: SuiteDefinition) -> list[str]:
    """MCP servers with a bad name or a program that is not installed."""
    import shlex

    from runner.mcp import check_name

    out = []
    for name, server in suite.mcp.items():
        try:
            check_name(name, f"mcp.{name}")
        except UsageError as exc:
            out.append(str(exc))
        try:
            program = shlex.split(server.command)[0]
        except (ValueError, IndexError) as exc:
            out.append(f"mcp.{name}.command: not a command line ({exc or 'empty'})")
            continue
        if installed_program(program) is None:
            out.append(f"mcp.{name}.command: {program} is not installed (on PATH, or in "
                       f"{mcp_servers_dir()} where scripts/mcp_servers.sh installs servers)")
    return out


def mcp_servers_dir() -> Path:
    """Where scripts/mcp_servers.sh installs MCP servers: $RUNNER_MCP_SERVERS, else ~/.cache/runner/mcp."""
    import os

    return Path(os.environ.get("RUNNER_MCP_SERVERS") or Path.home() / ".cache" / "runner" / "mcp")


def installed_program(program: str) -> str | None:
    """The path of `program`: itself if it is a path, else found on PATH, then in the
    servers scripts/mcp_servers.sh installs (its venv's bin/, npm's node_modules/.bin/)."""
    import shutil

    if "/" in program:
        return program if Path(program).is_file() else None
    cache = mcp_servers_dir()
    return shutil.which(program) or shutil.which(program, path=f"{cache / 'py' / 'bin'}:{cache / 'node_modules' / '.bin'}")


def _task_mistakes(where: str, task: Task, suite: SuiteDefinition) -> list[str]:
    """What one task gets wrong: its reply check, its approvals, its end-state checks."""
    out = []
    check = task.check
    if check is None and not task.graded_files:
        out.append(f"{where}: give `check` (the reply) or `end` (the files afterwards)")
    for field in ("all", "none"):
        out += _bad_patterns(f"{where}.check.{field}", getattr(check, field) if check else [])
    if check is not None and not check.all and not check.absent and not task.graded_files:
        out.append(f"{where}.check: give `all` patterns a right answer matches, or `absent`: true")
    offered = [*(suite.tools or SUITE_TOOLS), *suite.own_tools]
    for j, name in enumerate(task.approve if isinstance(task.approve, list) else []):
        if name not in offered:
            out.append(f"{where}.approve[{j}]: {name!r} is not a tool this suite offers ({', '.join(offered)})")
    if task.approve and not task.graded_files:
        out.append(f"{where}.approve: the writes it approves go ungraded: give `end` (the files afterwards)")
    if task.end is not None:
        out += _end_mistakes(f"{where}.end", task.end, suite.workspace)
    return out


def _end_mistakes(where: str, end: EndState, workspace: Path) -> list[str]:
    """End-state checks on paths the workspace does not hold, or named twice; bad patterns."""
    out = []
    held = {p.relative_to(workspace).as_posix() for p in workspace.rglob("*") if p.is_file()} \
        if workspace.is_dir() else set()
    named: dict[str, str] = {}
    for field, paths in (("files", list(end.files)), ("deleted", end.deleted), ("unchanged", end.unchanged or [])):
        for path in paths:
            at = f"{where}.{field}[{path!r}]" if field == "files" else f"{where}.{field}"
            if path in named:
                out.append(f"{at}: {path!r} is named in {named[path]} too")
            named.setdefault(path, field)
            new = field == "files" and end.files[path].new
            if path not in held and not new:
                out.append(f"{at}: the workspace has no file {path!r}" + (' (a file the run creates: "new": true)'
                                                                           if field == "files" else ""))
            elif path in held and new:
                out.append(f"{at}: {path!r} is in the workspace already: it is not new")
    for path, check in end.files.items():
        at = f"{where}.files[{path!r}]"
        if check.content is not None and (check.all or check.none):
            out.append(f"{at}: give `content` or patterns (`all`, `none`), not both")
        elif check.content is None and not check.all and not check.none:
            out.append(f"{at}: give `content`, or `all` / `none` patterns")
        out += _bad_patterns(f"{at}.all", check.all) + _bad_patterns(f"{at}.none", check.none)
    return out


def _bad_patterns(where: str, patterns: list[str]) -> list[str]:
    out = []
    for j, pattern in enumerate(patterns):
        try:
            re.compile(pattern)
        except re.error as exc:
            out.append(f"{where}[{j}]: not a regular expression ({exc})")
    return out


def shipped_suites(split: Split | None = None) -> list[Path]:
    """The suite folders shipped beside the six-task suite (`tasks/*/suite.json`), by name;
    with `split`, those of that half only."""
    found = sorted(p.parent for p in tasks_dir().glob("*/suite.json"))
    if split is None:
        return found
    return [p for p in found if json.loads((p / "suite.json").read_text(encoding="utf-8")).get("split") == split]


TASKS_SHOWN = 10
"""An unknown --task names at most this many of the tasks there are (a whole small suite)."""


def select_tasks(suites: list[SuiteDefinition], ids: Sequence[str]) -> list[SuiteDefinition]:
    """The suites cut to the tasks `ids` names (a task id, or SUITE/ID); suites left with no
    task are dropped.

    Raises:
        UsageError: an id that names no task of these suites.
    """
    if not ids:
        return suites
    wanted = set(ids)
    out, used = [], set()
    for suite in suites:
        keep = [t for t in suite.tasks if t.id in wanted or f"{suite.name}/{t.id}" in wanted]
        used |= {t.id for t in keep} | {f"{suite.name}/{t.id}" for t in keep}
        if keep:
            out.append(suite.model_copy(update={"tasks": keep}))
    unknown = [i for i in ids if i not in used]
    if unknown:
        import difflib

        known = [f"{s.name}/{t.id}" if len(suites) > 1 else t.id for s in suites for t in s.tasks]
        close = difflib.get_close_matches(unknown[0], known, n=3) or difflib.get_close_matches(
            unknown[0], [k.rpartition("/")[2] for k in known], n=3)
        if close:
            hint = f"did you mean {' or '.join(close)}?"
        else:
            shown = known[:TASKS_SHOWN]
            more = f", and {len(known) - len(shown)} more" if len(known) > len(shown) else ""
            hint = f"tasks: {', '.join(shown)}{more}"
        raise UsageError(f"--task {unknown[0]}: no such task; {hint}")
    return out
