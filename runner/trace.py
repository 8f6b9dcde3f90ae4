"""The trace: append-only JSONL, one event per line, `runId` on every line.

The vocabulary is small on purpose: `run_started`, `run_resumed`, `turn`, `tool_start` (a tool
about to run) or `tool_skipped` (a call answered without running, and why), `tool_progress`,
`tool_result` (every answered call), `tool_cancelled`, `approval_required`, `run_stopped`, the MCP
servers' `mcp_server_started`, `mcp_call` and `mcp_server_exited`, and three
operator events: `verdict` (an approval or rejection given from outside), `state_forced`
(`resume --force`) and `run_repaired` (`runner repair`). The event's `type` is snake_case;
every other field name is camelCase (`runId`, `toolName`, `promptTokens`, `costUsd`), with units
in the name where they are not tokens or counts (`ms`, `costUsd`). Each line also carries `ts`
(Unix seconds) so a run spanning processes and days reads in order.

Format versions (`run_started.formatVersion`; `TRACE_FORMAT_VERSION` is written): 1, before the
field was written, named the turn's token counts `prompt_tokens`, `completion_tokens` and
`total_tokens`; such traces still read, under the new names.

A process killed mid-append leaves a torn last line; the next writer ends it with a newline
before appending, and `read_trace` skips torn lines (a `{` that never closes).

The models' annotations are evaluated as the module runs (no `from __future__ import
annotations`): pydantic then takes each field's type as an object instead of compiling its
text, about a third of what defining the models costs at import. Names defined further down
are quoted.
"""

import functools
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from runner.errors import CorruptState

if TYPE_CHECKING:
    from pydantic import TypeAdapter

    from runner.state import EngineTimings

TRACE_FORMAT_VERSION = 2
"""The trace format written by this version (see the module docstring)."""


class _Event(BaseModel):
    model_config = ConfigDict(populate_by_name=True, defer_build=True)

    runId: str
    ts: float = Field(default_factory=time.time)


class RunStarted(_Event):
    type: Literal["run_started"] = "run_started"
    formatVersion: int = 1
    """The trace format from this line on (1: a trace written before the field existed)."""
    model: str
    parentRunId: str | None = None
    prompt: str = ""
    endpoint: str | None = None
    """The base URL the run talks to."""
    server: dict[str, Any] | None = None
    """The endpoint's settings when runner started it (local llama.cpp: n_ctx, chat_format,
    seed, n_threads, ...); None when unknown."""


class RunResumed(_Event):
    type: Literal["run_resumed"] = "run_resumed"
    turns: int
    costUsd: float
    approved: list[str] = []
    """Pending call ids that carry an approval as the run resumes."""
    endpoint: str | None = None
    """The base URL this process talks to (a resume may use another)."""
    messages: int | None = None
    """Messages in the conversation as the run resumes (a verdict given with the resume included)."""


class TurnEvent(_Event):
    type: Literal["turn"] = "turn"
    turn: int
    promptTokens: int = Field(validation_alias=AliasChoices("promptTokens", "prompt_tokens"))
    completionTokens: int = Field(validation_alias=AliasChoices("completionTokens", "completion_tokens"))
    totalTokens: int = Field(validation_alias=AliasChoices("totalTokens", "total_tokens"))
    costUsd: float
    """Cumulative cost of the run after this turn, USD."""
    finish: str | None
    ms: float
    retries: list[dict[str, Any]] | None = None
    """Failed attempts before this reply, if any: {"error", "status", "waitMs"} each."""
    usageEstimated: bool | None = None
    """True when the provider sent no usable usage and runner counted the tokens itself."""
    slip: str | None = None
    """A protocol slip (the reply was billed, not kept, and the turn is asked again)."""
    content: str | None = None
    """With `slip`: the slipped reply's text (first 500 characters)."""
    rewrites: list[dict[str, Any]] | None = None
    """What runner changed in the provider's message, with the originals:
    {"callId", "field": "id" | "arguments", "original", "sent"} each."""
    neutralised: int | None = None
    """Control-token look-alikes (`<|im_end|>`...) defused in this request's user/tool text."""
    corrective: str | None = None
    """With `slip` under ``on_slip: corrective``: the user message added before asking again."""
    toolChoice: str | None = None
    """The ``tool_choice`` this request sent, when runner set one (first turn, answer forcing)."""
    promptReused: int | None = None
    """Local engine: prompt tokens whose KV entries were reused (see `EngineTimings`)."""
    promptEvaluated: int | None = None
    """Local engine: prompt tokens evaluated."""
    promptMs: float | None = None
    """Local engine: prompt evaluation, ms."""
    genMs: float | None = None
    """Local engine: generation, ms."""
    draftAccepted: int | None = None
    """Local engine, speculative decoding: drafted tokens accepted."""
    draftProposed: int | None = None
    """Local engine, speculative decoding: tokens drafted."""


def engine_fields(engine: "EngineTimings | None") -> dict[str, Any]:
    """A `TurnEvent`'s engine fields (``promptReused``…) from a turn's `EngineTimings`; {} without one."""
    if engine is None:
        return {}
    return {"promptReused": engine.prompt_reused, "promptEvaluated": engine.prompt_evaluated,
            "promptMs": engine.prompt_ms, "genMs": engine.gen_ms,
            "draftAccepted": engine.draft_accepted, "draftProposed": engine.draft_proposed}


class ToolStart(_Event):
    type: Literal["tool_start"] = "tool_start"
    toolName: str
    args: str
    callId: str


SkipReason = Literal["refused", "declined_before", "rejected", "cached", "limit", "invalid"]
"""Why a call was answered without running its tool: refused (the tool's check found it could only
fail, e.g. a delete of a file that is not there), declined_before (the user declined the same
call earlier), rejected (the user declined it now), cached (the same read-only call's earlier
result), limit (the budget or turn cap was reached mid-batch), invalid (an unknown tool, or
arguments that do not fit its schema)."""


class ToolSkipped(_Event):
    """A call answered without running its tool; its `tool_result` follows. A call that runs has
    a `tool_start` instead, so counting starts counts executions."""

    type: Literal["tool_skipped"] = "tool_skipped"
    toolName: str
    callId: str
    args: str
    reason: SkipReason
    detail: str | None = None
    """Why, in words: the error the model is told, or the user's reason; None for a cached result."""


class ToolProgress(_Event):
    type: Literal["tool_progress"] = "tool_progress"
    toolName: str
    callId: str
    label: str


class ToolResult(_Event):
    type: Literal["tool_result"] = "tool_result"
    toolName: str
    callId: str
    ms: float
    ok: bool
    source: str = "run"
    error: str | None = None
    childRunId: str | None = None
    omittedChars: int | None = None
    """Characters cut from the result (max_tool_result_chars)."""


class ToolCancelled(_Event):
    """The Stop signal ended a running tool; the call stays pending and a resume runs it."""

    type: Literal["tool_cancelled"] = "tool_cancelled"
    toolName: str
    callId: str
    ms: float
    reason: str


class ApprovalRequired(_Event):
    type: Literal["approval_required"] = "approval_required"
    toolName: str
    args: str
    callId: str
    inDoubt: bool = False


class RunStopped(_Event):
    type: Literal["run_stopped"] = "run_stopped"
    status: str
    reason: str | None
    turns: int
    costUsd: float


class Verdict(_Event):
    """An operator's decision on a call that waited for approval: which call, which
    arguments (and their signature), when (`ts`), and from where (`by`: user@host pid N)."""

    type: Literal["verdict"] = "verdict"
    verdict: Literal["approve", "reject"]
    callId: str
    toolName: str
    args: str
    signature: str
    by: str
    reason: str | None = None


class StateForced(_Event):
    """`resume --force` replaced the stored state with one that did not follow it."""

    type: Literal["state_forced"] = "state_forced"
    fromSeq: int
    """The sequence number of the state that was forced in."""
    storedSeq: int
    """The stored sequence number it replaced (newer history, now overridden)."""
    by: str


class RunRepaired(_Event):
    """`runner repair` rebuilt a run whose journal was damaged from its last good record."""

    type: Literal["run_repaired"] = "run_repaired"
    keptSeq: int
    """The last good save the state was rebuilt from."""
    dropped: list[str] = []
    """One line per transition dropped."""
    outside: list[str] = []
    """One line per thing that may have happened after the last good record (a tool started,
    a turn paid)."""
    by: str


class McpServerStarted(_Event):
    """An MCP server started for the run (or again, after it exited) and listed its tools."""

    type: Literal["mcp_server_started"] = "mcp_server_started"
    server: str
    """The name the run gives it (`McpServer.name`)."""
    transport: Literal["stdio", "http"]
    target: str
    """The command line or URL as configured: ``${VAR}`` unexpanded, no user:password, no query."""
    protocolVersion: str
    serverName: str | None = None
    """What the server calls itself (`serverInfo.name`), and its version."""
    serverVersion: str | None = None
    toolsHash: str
    """sha256 (16 hex) of the tool list the server gave, as listed (names, descriptions,
    schemas, annotations)."""
    offered: list[str]
    """The names the run offers its tools under, in order."""
    leftOut: list[str] = []
    """Tools not offered, each with why ("NAME: its schema ..."; "NAME: denied by config")."""
    pid: int | None = None
    """The stdio server's process id (its process group is its launcher's)."""
    ms: float
    """From spawning (or connecting) to the tool list, ms."""


class McpCall(_Event):
    """One `tools/call` sent to an MCP server: who answered, how long it took, how it ended."""

    type: Literal["mcp_call"] = "mcp_call"
    server: str
    tool: str
    """The tool's name on the server (the model calls it by the offered name)."""
    callId: str
    ms: float
    isError: bool = False
    """The server answered with `isError` (the model reads it as a tool error)."""
    failure: str | None = None
    """The call got no answer: a timeout, the server exiting, a transport error."""
    structured: Any = None
    """The result's `structuredContent`, kept here (the model reads the text)."""


class McpServerExited(_Event):
    """An MCP server's process ended while the run still used it."""

    type: Literal["mcp_server_exited"] = "mcp_server_exited"
    server: str
    pid: int | None = None
    status: str
    """How it ended, in words ("exit code 1", "killed by SIGKILL", "connection closed")."""
    stderrTail: str = ""
    """The last lines it wrote to stderr (at most 2,000 characters)."""


TraceEvent = Annotated[
    Union[
        RunStarted, RunResumed, TurnEvent, ToolStart, ToolSkipped, ToolProgress, ToolResult, ToolCancelled,
        ApprovalRequired, RunStopped, Verdict, StateForced, RunRepaired, McpServerStarted, McpCall,
        McpServerExited,
    ],
    Field(discriminator="type"),
]


@functools.cache
def _adapter() -> "TypeAdapter[TraceEvent]":
    """The validator of any event, built the first time a trace is read."""
    from pydantic import TypeAdapter

    return TypeAdapter(TraceEvent)


class Tracer:
    """Appends events to one JSONL file, flushing after every line.

    Args:
        path: the trace file; parent directories are created. None: events are dropped.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def emit(self, event: _Event) -> None:
        if self.path is None:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torn = _ends_torn(self.path)
            self._file = self.path.open("a", encoding="utf-8")
            if torn:  # a writer died mid-line: end that line, never glue onto it
                self._file.write("\n")
        if hasattr(event, "costUsd"):
            event.costUsd = round(event.costUsd, 9)  # no float noise like 0.0014680000000000001
        self._file.write(event.model_dump_json(exclude_none=True) + "\n")
        self._file.flush()

    def has_events(self) -> bool:
        """True if the file already holds events (an earlier process worked on this run)."""
        return self.path is not None and self.path.exists() and self.path.stat().st_size > 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _ends_torn(path: Path) -> bool:
    """True if the file exists, is not empty and does not end with a newline."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            if f.tell() == 0:
                return False
            f.seek(-1, 2)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False


def read_trace(path: Path) -> list[TraceEvent]:
    """Parse a trace file into event models, skipping torn lines (a writer killed mid-line:
    an object that starts but never closes; the last line, or any line a later writer ended).

    Raises:
        CorruptState: a line is whole JSON but not a valid event, or is not JSON and not torn.
    """
    import json

    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    events: list[TraceEvent] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except ValueError:
            if i == len(lines) - 1 or line.lstrip().startswith("{"):
                continue  # torn
            raise CorruptState(f"{path}:{i + 1}: not a trace event: {line[:80]!r}") from None
        try:
            events.append(_adapter().validate_python(raw))
        except ValueError:
            raise CorruptState(f"{path}:{i + 1}: not a trace event: {line[:80]!r}") from None
    return events
