"""The tool registry: every tool runner can offer, by name, and how a run's catalog is built.

`RunConfig.tools` holds names (state stays plain data); `build` turns them into tool objects
for one run. The default list of names is `runner.state.DEFAULT_TOOLS`; the research child
gets the read-only tools of that list. This is the only place that maps names to tools.

Your own tools come three ways: as objects handed to `runner.execute(tools=[...])` or
`RunConfig(tools=[...])`; as "module:attribute" references (`runner run --tool`), which the
run records in `RunConfig.tool_refs` so a resume or a worker imports them again; and as
installed plugins, named by their entry point in the `runner.tools` group.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from runner.errors import UnknownTool
from runner.research import Research
from runner.state import DEFAULT_TOOLS, RunConfig, tool_ref
from runner.tools import BASIC_TOOLS, Tool

SIMPLE: dict[str, type[Tool]] = {cls.name: cls for cls in BASIC_TOOLS}
"""Tools that need no per-run arguments, by name."""
NAMES: tuple[str, ...] = (*SIMPLE, Research.name)
"""Every built-in tool name a run may list in `RunConfig.tools`."""
ENTRY_POINT_GROUP = "runner.tools"
"""Installed plugins offer tools here: `[project.entry-points."runner.tools"] weather = "pkg.mod:Weather"`."""


def child_tools() -> list[str]:
    """The tools a research child gets: the read-only ones of the default catalog."""
    return [n for n in DEFAULT_TOOLS if n in SIMPLE and SIMPLE[n].read_only]


def build(config: RunConfig, given: Iterable[Tool] = ()) -> list[Tool]:
    """The catalog named by `config.tools`, in that order: each name from `given`, else the
    objects the config was built with, else the built-ins, else imported from `tool_refs`.

    Raises:
        UnknownTool: one line naming every tool that cannot be found (and why an import failed).
    """
    offered = {**config.given_tools(), **{t.name: t for t in given}}
    tools: list[Tool] = []
    missing: list[str] = []
    for name in config.tools:
        if name in offered:
            tools.append(offered[name])
        elif name == Research.name:
            tools.append(Research(config, child_tools()))
        elif name in SIMPLE:
            tools.append(SIMPLE[name]())
        elif name in config.tool_refs:
            try:
                tools.append(load(config.tool_refs[name], expect=name))
            except UnknownTool as exc:
                missing.append(f"{name} ({exc})")
        else:
            missing.append(name)
    if missing:
        raise UnknownTool(f"tool(s) not found: {'; '.join(missing)}. Built in: {', '.join(NAMES)}; offer others "
                          "with --tool MODULE:ATTRIBUTE or execute(..., tools=[...])")
    return tools


def spec_to_ref(spec: str) -> str:
    """A `--tool` value as a "module:attribute" reference: as it is, or, for a plain name, the
    `runner.tools` entry point of that name.

    Raises:
        UnknownTool: a plain name no installed plugin offers.
    """
    if ":" in spec:
        return spec
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if spec not in found:
        raise UnknownTool(f"--tool {spec}: no installed plugin offers it (entry points in {ENTRY_POINT_GROUP!r}: "
                          f"{', '.join(sorted(found)) or 'none'}); give MODULE:ATTRIBUTE for a tool of your own")
    return found[spec]


def load(ref: str, expect: str | None = None) -> Tool:
    """The tool at "module:attribute": a `Tool` instance as it is, a `Tool` subclass
    instantiated with no arguments. The current directory is searched for the module too
    (as `python -m` does), so `--tool mytools:Weather` finds ./mytools.py.

    Raises:
        UnknownTool: the module or attribute is missing, is not a tool, or is named differently
            from `expect`.
    """
    module_name, _, attribute = ref.partition(":")
    if not module_name or not attribute:
        raise UnknownTool(f"{ref!r} is not MODULE:ATTRIBUTE")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except ImportError as exc:
        raise UnknownTool(f"cannot import {ref}: {exc}") from None
    except AttributeError:
        raise UnknownTool(f"{module_name} has no attribute {attribute!r}") from None
    if isinstance(obj, type) and issubclass(obj, Tool):
        try:
            obj = obj()
        except TypeError as exc:
            raise UnknownTool(f"{ref} cannot be built with no arguments ({exc}); point at an instance") from None
    if not isinstance(obj, Tool):
        raise UnknownTool(f"{ref} is not a runner.Tool (a subclass or an instance of one)")
    if expect is not None and obj.name != expect:
        raise UnknownTool(f"{ref} is now named {obj.name!r}")
    return obj


def offer(config: RunConfig, tools: Sequence[Tool | str], refs: dict[str, str] | None = None) -> None:
    """Set the tools a new run offers: names (built-in, or already known to the config) and
    objects, with where each object can be imported again (`refs` by name, else `runner.state.tool_ref`).
    Call `build(config, given)` with the same objects to get the catalog."""
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
