"""The tool registry: every tool runner can offer, by name, and how a run's catalog is built.

`RunConfig.tools` holds names (state stays plain data); `build` turns them into tool objects
for one run. The default list of names is `runner.state.DEFAULT_TOOLS`; the research child
gets the read-only tools of that list. This is the only place that maps names to tools.
"""

from __future__ import annotations

from runner.errors import UnknownTool
from runner.research import Research
from runner.state import DEFAULT_TOOLS, RunConfig
from runner.tools import BASIC_TOOLS, Tool

SIMPLE: dict[str, type[Tool]] = {cls.name: cls for cls in BASIC_TOOLS}
"""Tools that need no per-run arguments, by name."""
NAMES: tuple[str, ...] = (*SIMPLE, Research.name)
"""Every tool name a run may list in `RunConfig.tools`."""


def child_tools() -> list[str]:
    """The tools a research child gets: the read-only ones of the default catalog."""
    return [n for n in DEFAULT_TOOLS if n in SIMPLE and SIMPLE[n].read_only]


def build(config: RunConfig) -> list[Tool]:
    """The catalog named by `config.tools`, in that order.

    Raises:
        UnknownTool: a name that is not in the registry.
    """
    unknown = [n for n in config.tools if n not in NAMES]
    if unknown:
        raise UnknownTool(f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    return [Research(config, child_tools()) if n == Research.name else SIMPLE[n]() for n in config.tools]
