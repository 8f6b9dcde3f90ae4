"""The tool registry: every tool runner can offer, by name, and how a run's catalog is built.

`RunConfig.tools` holds names (state stays plain data); `build` turns them into tool objects
for one run. A name means a tool of the run's catalog (`RunConfig.builtin_tools`): the demo
catalog (`DEMO`; its default list `runner.state.DEFAULT_TOOLS`, what the six-task suite and
the scenarios offer) or the folder catalog (`FOLDER`; its default list `FOLDER_TOOLS`, what
`runner run PROMPT` offers on a folder of one's own). The research child gets the read-only
tools of its parent's list. This is the only place that maps names to tools.

Your own tools come three ways: as objects handed to `runner.execute(tools=[...])` or
`RunConfig(tools=[...])`; as "module:attribute" or "PATH/TO/FILE.py:attribute" references
(`runner run --tool`), which the run records in `RunConfig.tool_refs` so a resume or a worker
imports them again; and as installed plugins, named by their entry point in the
`runner.tools` group.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from runner.errors import UnknownTool, UsageError
from runner.research import Research
from runner.state import DEFAULT_TOOLS, RunConfig, tool_ref
from runner.tools import BASIC_TOOLS, FOLDER_TOOL_CLASSES, Tool

SIMPLE: dict[str, type[Tool]] = {cls.name: cls for cls in BASIC_TOOLS}
"""The demo catalog's tools (no per-run arguments), by name."""
DEMO = SIMPLE
FOLDER: dict[str, type[Tool]] = {cls.name: cls for cls in FOLDER_TOOL_CLASSES}
"""The folder catalog's tools, by name: the same names mean tools fit for a real folder."""
FOLDER_TOOLS: tuple[str, ...] = ("list_files", "read_file", "search_files", "write_file", "edit_file", "delete_file")
"""The tools a run on a folder of one's own offers unless told otherwise."""
NAMES: tuple[str, ...] = (*dict.fromkeys([*SIMPLE, *FOLDER]), Research.name)
"""Every built-in tool name a run may list in `RunConfig.tools`."""


def table(config: RunConfig) -> dict[str, type[Tool]]:
    """The built-in tools `config`'s names mean, by name (see `RunConfig.builtin_tools`)."""
    return FOLDER if config.builtin_tools == "folder" else DEMO
ENTRY_POINT_GROUP = "runner.tools"
"""Installed plugins offer tools here: `[project.entry-points."runner.tools"] weather = "pkg.mod:Weather"`."""


def child_tools(config: RunConfig | None = None) -> list[str]:
    """The tools a research child gets: the read-only ones of its parent's catalog's default
    list (the demo catalog's when no parent is given)."""
    folder = config is not None and config.builtin_tools == "folder"
    builtins, names = (FOLDER, FOLDER_TOOLS) if folder else (DEMO, DEFAULT_TOOLS)
    return [n for n in names if builtins[n].read_only]


def build(config: RunConfig, given: Iterable[Tool] = (), servers: Sequence[Tool] = ()) -> list[Tool]:
    """The catalog named by `config.tools`, in that order: each name from `given`, else the
    objects the config was built with, else imported from `tool_refs`, else the built-ins;
    then `servers`, the tools of the run's MCP servers (`runner.mcp.Servers.open`).

    Raises:
        UnknownTool: one line naming every tool that cannot be found (and why an import failed).
        UsageError: two tools share a name.
    """
    _named_once([*config.tools, *(t.name for t in servers)])
    offered = {**config.given_tools(), **{t.name: t for t in given}}
    tools: list[Tool] = []
    missing: list[str] = []
    for name in config.tools:
        if name in offered:
            tools.append(offered[name])
        elif name in config.tool_refs:  # a tool of the user's own, even under a built-in's name
            try:
                tools.append(load(config.tool_refs[name], expect=name))
            except UnknownTool as exc:
                missing.append(f"{name} ({exc})")
        elif name == Research.name:
            tools.append(Research(config, child_tools(config)))
        elif name in table(config):
            tools.append(table(config)[name]())
        else:
            missing.append(name)
    if missing:
        raise UnknownTool(f"tool(s) not found: {'; '.join(missing)}. Built in: {', '.join(NAMES)}; offer others "
                          "with --tool MODULE:NAME, --tool FILE.py:NAME or execute(..., tools=[...])")
    return [*tools, *servers]


def check_supplied(config: RunConfig, tools: Iterable[Tool]) -> None:
    """Tool objects given again for a saved run (a resume's --tool) stand in for tools of its
    own the run recorded, found elsewhere now: never for a built-in the run used, nor under a
    name the run does not offer.

    Raises:
        UsageError: one line naming the tool and the run's tools.
    """
    for tool in tools:
        if tool.name not in config.tools:
            raise UsageError(f"--tool gives {tool.name!r}, a tool the run does not offer (it offers "
                             f"{', '.join(config.tools)}); a resume takes --tool for a tool of the run's own only")
        if tool.name not in config.tool_refs and tool.name in NAMES:
            raise UsageError(f"--tool gives {tool.name!r}, but the run uses the built-in {tool.name}: a resume "
                             "does not put another tool in its place")


def _named_once(names: Sequence[str]) -> None:
    """The model calls a tool by its name: two tools offered under one name would be one."""
    twice = [n for i, n in enumerate(names) if n in names[:i]]
    if twice:
        builtin = [n for n in twice if n in NAMES]
        raise UsageError(f"more than one tool is named {', '.join(map(repr, dict.fromkeys(twice)))}: each tool "
                         "offered needs a name of its own" + (" (a built-in tool has it; rename yours, or give "
                                                               "--no-builtin-tools)" if builtin else ""))


def spec_to_ref(spec: str) -> str:
    """A `--tool` value as a reference `load` takes: "module:attribute" as it is, the path of
    an existing file ("PATH/TO/FILE.py:attribute", or a module that is a file of the current
    folder) made absolute (a resume or a worker may start in another folder), or, for a
    plain name, the `runner.tools` entry point of that name.

    Raises:
        UnknownTool: a plain name no installed plugin offers.
    """
    if ":" in spec:
        where, _, attribute = spec.rpartition(":")
        path = Path(where).expanduser()
        if _is_path(where) and path.suffix == ".py" and path.is_file():
            return f"{path.resolve()}:{attribute}"
        here = Path.cwd() / f"{where}.py"
        if "." not in where and here.is_file() and _origin(where) in (None, here.resolve()):
            return f"{here.resolve()}:{attribute}"  # a module of this folder: recorded by its file
        return spec
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if spec not in found:
        raise UnknownTool(f"--tool {spec}: no installed plugin offers it (entry points in {ENTRY_POINT_GROUP!r}: "
                          f"{', '.join(sorted(found)) or 'none'}); give MODULE:NAME or FILE.py:NAME for a tool of "
                          "your own")
    return found[spec]


def load_specs(specs: Iterable[str]) -> tuple[list[Tool], dict[str, str]]:
    """The tools `--tool` values name, and where each is found, by tool name, as a run
    records it (`RunConfig.tool_refs`; see `spec_to_ref`).

    Raises:
        UnknownTool: as `spec_to_ref` and `load`.
    """
    refs = [spec_to_ref(spec) for spec in specs]
    tools = [load(ref) for ref in refs]
    return tools, {tool.name: ref for tool, ref in zip(tools, refs)}


def _origin(module: str) -> Path | None:
    """The file `module` would be imported from on the current path, if any."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).resolve() if spec is not None and spec.origin else None


def _is_path(where: str) -> bool:
    """True if the part of a reference before ":" names a file, not a module."""
    return where.endswith(".py") or "/" in where or os.sep in where


def load(ref: str, expect: str | None = None) -> Tool:
    """The tool at "module:attribute" or "PATH/TO/FILE.py:attribute": a `Tool` instance as it
    is, a `Tool` subclass instantiated with no arguments. A module is imported by name, the
    current directory searched too (as `python -m` does), so `mytools:Weather` finds
    ./mytools.py; a file is imported from that path. The attribute may be dotted.

    Raises:
        UnknownTool: the module, file or attribute is missing or fails to import, is not a
            usable tool (a `Tool` with a name, a description, a Params model and a run), or
            is named differently from `expect`.
    """
    where, _, attribute = ref.rpartition(":")
    if not where or not attribute:
        raise UnknownTool(f"{ref!r} is not MODULE:NAME or FILE.py:NAME")
    obj: Any = _import(where, ref)
    try:
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise UnknownTool(f"{where} has no attribute {attribute!r}") from None
    if isinstance(obj, type) and issubclass(obj, Tool):
        try:
            obj = obj()
        except TypeError as exc:
            raise UnknownTool(f"{ref} cannot be built with no arguments ({exc}); point at an instance") from None
    if not isinstance(obj, Tool):
        raise UnknownTool(f"{ref} is not a runner.Tool (a subclass or an instance of one)")
    lacking = _lacking(obj)
    if lacking:
        raise UnknownTool(f"{ref} is not a usable tool: it has no {' and no '.join(lacking)} (a runner.Tool "
                          "subclass sets name, description and Params, and defines run_sync or run)")
    if expect is not None and obj.name != expect:
        raise UnknownTool(f"{ref} is now named {obj.name!r}")
    return obj


def _import(where: str, ref: str) -> Any:
    """The module a reference names: by path for a file (see `_is_path`), else by name.

    Raises:
        UnknownTool: it cannot be found, or importing it raised (the module's own error, in one line).
    """
    if _is_path(where):
        path = Path(where).expanduser().resolve()
        if ".py:" in where:
            raise UnknownTool(f"{ref}: one NAME goes after the file ({where.partition('.py:')[0]}.py:NAME; "
                              "an attribute of it: NAME.ATTR)")
        if path.suffix != ".py":
            named = path.with_name(path.name + ".py").is_file()
            hint = f"; did you mean {where}.py:{ref.rpartition(':')[2]}?" if named else ""
            raise UnknownTool(f"{ref}: a file of tools is given with its .py ending{hint}")
        return _import_file(path, ref)
    if where.startswith("."):
        raise UnknownTool(f"{ref}: {where} is a relative module name; give MODULE:NAME, or a file as ./FILE.py:NAME")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(where)
    except ImportError as exc:
        raise UnknownTool(f"cannot import {ref}: {exc}") from None
    except Exception as exc:  # the user's module raised on import: its error, not runner's
        raise UnknownTool(f"cannot import {ref}: {type(exc).__name__}: {exc}") from None


def _import_file(path: Path, ref: str) -> Any:
    """The module in the Python file at `path` (absolute), imported once per process under a
    name of its own (the file's stem and a hash of its path, so two mytools.py never clash)."""
    import hashlib
    import importlib.util

    name = f"runner_tools_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise UnknownTool(f"cannot import {ref}: there is no file {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UnknownTool(f"cannot import {ref}: {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import does: the module's classes find their module by name
    if str(path.parent) not in sys.path:  # as for a script: the modules beside it import by name
        sys.path.append(str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file raised: its error, not runner's
        del sys.modules[name]
        raise UnknownTool(f"cannot import {ref}: {type(exc).__name__}: {exc}") from None
    return module


def _lacking(tool: Tool) -> list[str]:
    """What `tool` lacks to be offered to a model: "name", "description", "Params", "run"."""
    from pydantic import BaseModel

    cls = type(tool)
    checks = {"name": isinstance(getattr(tool, "name", None), str) and bool(getattr(tool, "name", "")),
              "description": isinstance(getattr(tool, "description", None), str),
              "Params": isinstance(cls.Params, type) and issubclass(cls.Params, BaseModel),
              "run_sync or run": cls.run_sync is not Tool.run_sync or cls.run is not Tool.run}
    return [what for what, ok in checks.items() if not ok]


def offer(config: RunConfig, tools: Sequence[Tool | str], refs: dict[str, str] | None = None) -> None:
    """Set the tools a new run offers: names (built-in, or already known to the config) and
    objects, with where each object can be imported again (`refs` by name, else `runner.state.tool_ref`).
    Call `build(config, given)` with the same objects to get the catalog.

    Raises:
        UsageError: two tools share a name (a tool of your own named like a built-in one).
    """
    _named_once([t if isinstance(t, str) else t.name for t in tools])
    names: list[str] = []
    for tool in tools:
        if isinstance(tool, str):
            names.append(tool)
            continue
        names.append(tool.name)
        ref = (refs or {}).get(tool.name) or tool_ref(tool)
        if ref is not None:
            config.tool_refs[tool.name] = ref
    config.tools = names
