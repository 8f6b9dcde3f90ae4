"""The suite format: what a suite folder's `suite.json` holds, as pydantic models.

A suite is a folder: `suite.json` (a system prompt, the tools offered, the tasks: each a prompt
and an answer check as regular expressions over the lower-cased answer) and `workspace/`, the
files its tools work over (`docs/suite.md` has the format). Reading and checking a file is
`runner.suite.loading`; grading a run against a task is `runner.suite.grading`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from runner.resources import tasks_dir

Split = Literal["dev", "test"]
Catalog = Literal["demo", "folder"]

SUITE_TOOLS = ("list_files", "read_file")
"""The tools a suite other than the six-task one offers when its suite.json names none: the
folder's read-only tools."""
SUITE_CATALOG: Catalog = "demo"
"""Which built-in tools a suite other than the six-task one offers when its suite.json does
not say (`RunConfig.builtin_tools`)."""


class Check(BaseModel, extra="forbid"):
    all: list[str] = []
    """Every pattern must match the lower-cased answer."""
    none: list[str] = []
    """Wrong answers: no pattern may match (e.g. another file named as the largest)."""
    absent: bool = False
    """The honest answer is that the folder does not hold the information: an answer is right
    when it says so (an abstention) and matches `all` and none of `none`."""


class FileCheck(BaseModel, extra="forbid"):
    """What one file of the workspace must hold after the run: its exact `content`, or
    patterns over its text (case-sensitive, `^` and `$` match at each line)."""

    all: list[str] = []
    """Every pattern must match the file's text."""
    none: list[str] = []
    """No pattern may match the file's text (e.g. the old value)."""
    content: str | None = None
    """The file's whole text, exactly."""
    new: bool = False
    """The workspace does not hold the file: the run must create it."""


class EndState(BaseModel, extra="forbid"):
    """The workspace after the run, graded apart from the reply."""

    files: dict[str, FileCheck] = {}
    """Path (relative to the workspace, with /) -> what the file must hold afterwards."""
    deleted: list[str] = []
    """Paths that must not exist afterwards."""
    unchanged: list[str] | None = None
    """Paths that must be byte-identical afterwards (None: every file the task does not name
    in `files` or `deleted`)."""


class Task(BaseModel, extra="forbid"):
    id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    prompt: str = Field(min_length=1)
    shape: str = Field("question", pattern=r"^[a-z_]+$")
    """What kind of task it is (question, edit, code, tool, chat, refusal, ...): reports count
    each shape apart."""
    check: Check | None = None
    """The reply's check (None: a task with `end` or `refused`; its reply is only checked for
    being an answer at all)."""
    min_tool_runs: int = Field(0, ge=0)
    """The answer only counts if at least this many tools really ran (e.g. 'read each one')."""
    end: EndState | None = None
    """The workspace afterwards (None: not graded)."""
    approve: Literal["all"] | list[str] = []
    """The tools whose calls are approved ("all": every tool); any other call that needs
    approval is rejected, and the model reads that it was."""
    refused: bool = False
    """No write may take effect: every file of the workspace stays as it was and none is added."""

    @field_validator("approve", mode="before")
    @classmethod
    def _all_or_names(cls, value: Any) -> Any:
        """One complaint for a value that is neither "all" nor a list of names (not one per form)."""
        if value != "all" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ValueError('give "all" or a list of tool names')
        return value

    @property
    def graded_files(self) -> bool:
        """True if the run's workspace is graded afterwards (`end` or `refused`)."""
        return self.end is not None or self.refused


class SuiteMcpServer(BaseModel, extra="forbid"):
    """An MCP server a suite's runs offer the tools of (`runner.mcp`), under their own names."""

    command: str = Field(min_length=1)
    """Its command line; the program is found on PATH or where scripts/mcp_servers.sh installs
    servers (``$RUNNER_MCP_SERVERS``, default ~/.cache/runner/mcp). ``${RUNNER_WORKSPACE}`` is
    the run's own copy of the workspace."""
    tools: list[str] = []
    """Globs over its tool names: only these are offered (empty: every tool)."""
    allow: list[str] = []
    """Globs of its tools whose calls never need approval."""


class SuiteDefinition(BaseModel, extra="forbid"):
    """A suite folder's `suite.json` (`docs/suite.md`)."""

    name: str = Field("", pattern=r"^[A-Za-z0-9_.-]*$")
    """How reports name the suite ("" in the file: the folder's name)."""
    split: Split | None = None
    """Which half of a development set the suite belongs to: techniques are chosen on "dev"
    and only reported on "test". None: outside any split (the six-task suite)."""
    description: str = ""
    system: str = Field(min_length=1)
    """The system prompt of every run."""
    catalog: Catalog | None = None
    """Which built-in tools `tools` names: "demo" (the packaged workspace's: a flat folder) or
    "folder" (subfolders, line ranges, search); None: `SUITE_CATALOG`."""
    tools: list[str] | None = None
    """The built-in tools offered (None: `SUITE_TOOLS`; the six-task suite's default catalog,
    `runner.state.DEFAULT_TOOLS`, for the six-task suite)."""
    own_tools: dict[str, str] = {}
    """Tools of one's own, offered after `tools`: name -> "module:attribute" or
    "FILE.py:attribute" (a file path relative to the suite's folder), as `runner run --tool`."""
    mcp: dict[str, SuiteMcpServer] = {}
    """MCP servers whose tools are offered after those, by server name."""
    tasks: list[Task] = Field(min_length=1)
    folder: Path = Field(Path(), exclude=True)
    """The suite's folder (set on load): its `workspace/` is what the tools work over."""

    @property
    def workspace(self) -> Path:
        return self.folder / "workspace"

    def tool_ref(self, name: str) -> str:
        """Where own tool `name` is imported from, a file's path made absolute."""
        where, _, attribute = self.own_tools[name].rpartition(":")
        if where.endswith(".py") and not Path(where).is_absolute():
            where = str(self.folder / where)
        return f"{where}:{attribute}"

    @property
    def default(self) -> bool:
        """The six-task suite: the scripted provider has a scenario for each of its tasks."""
        return self.folder.resolve() == tasks_dir().resolve()
