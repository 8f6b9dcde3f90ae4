"""Suites of tasks: the same harness on the scripted provider and on one or more local models,
side by side, each task repeated N times.

A suite is a folder: `suite.json` (a system prompt, the tools offered, the tasks: each a prompt
and an answer check as regular expressions over the lower-cased answer) and `workspace/`, the
files its tools work over (`docs/suite.md` has the format). The six-task suite of `tasks/` is
the default; the suites beside it (`tasks/*/suite.json`) form the development set, each marked
`dev` or `test`. The scripted provider answers the six-task suite with the scenario of each
task's name. Every (model, task, repeat) is a normal saved run, created in the store before any is
driven, then driven by a `runner.fanout` executor (this process, or Ray actors); `runner trace`
works on each. Reports, with pass rates and turn-time percentiles over the repeats, are
written to `runs/suite-<timestamp>.json`, `.md` and `.png` (turn time per task and model).
"""

from __future__ import annotations

import math
import os
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from pydantic import BaseModel, Field, ValidationError

from runner import fanout, steering
from runner.chat_adapter import HANDLER_NAME
from runner.endpoints import Endpoint, checked_base_url
from runner.errors import UsageError
from runner.fanout import Batch, Executor, LocalExecutor, RayExecutor
from runner.replies import echoes
from runner.request import SuiteRequest
from runner.resources import tasks_dir
from runner.result import RunResult
from runner.state import Limits, RunConfig, RunState, new_run
from runner.store import Durability, FileStore, RunStore, StoreAt, make_runs_dir

Provider = Literal["scripted", "local"]
ToolChoiceSetting = Literal["auto", "required", "none"]

PROTOCOL_TEXT = re.compile(r"</?tool_(?:call|response)>|<\|im_(?:start|end)\|>")
"""Chat-protocol markup: an answer containing it pasted the transcript, it did not answer."""
TOOL_JSON = re.compile(r'"(?:name|arguments|parameters|properties|function|type)"\s*:')
"""A JSON key of a tool call or a tool schema: an answer containing one wrote a call or pasted
the tools as text, it did not answer."""
TOOL_LIST_MAX_OTHER_WORDS = 6
"""An answer naming two or more tools with fewer other words than this is a list of tools."""


ABSTAINS = re.compile(
    r"\b(?:(?:is|are|was|were|'s)(?:n't| not) (?:mentioned|found|listed|specified|present|available|included|stated|"
    r"given|provided|defined|configured|recorded|shown|there|in (?:the|any))"
    r"|not (?:mentioned|listed|specified|stated|recorded|provided|given) (?:in|anywhere)"
    r"|no (?:information|mention|record|data|details?|entry|indication|reference)s?\b"
    r"|(?:does|do|did)(?:n't| not) (?:say|mention|contain|specify|include|list|state|show|give|record)"
    r"|(?:cannot|can't|could not|couldn't|unable to) (?:find|determine|tell|locate|see)"
    r"|there (?:is|are) no (?:\w+ )?(?:information|mention|record|data|details?|entry|file)"
    r"|information (?:is )?not (?:available|there)|not (?:available|found) in)")
"""An answer that says the information is not there (an abstention), in the ways models say it."""
Verdict = Literal["correct", "wrong", "abstained"]


class Check(BaseModel, extra="forbid"):
    all: list[str] = []
    """Every pattern must match the lower-cased answer."""
    none: list[str] = []
    """Wrong answers: no pattern may match (e.g. another file named as the largest)."""
    absent: bool = False
    """The honest answer is that the folder does not hold the information: an answer is right
    when it says so (`ABSTAINS`) and matches `all` and none of `none`."""


class Grade(BaseModel):
    correct: bool
    why: str | None = None
    """Why a wrong answer is wrong; None when correct."""
    verdict: Verdict = "wrong"
    """correct; abstained (said the information is not there, on a task that has it); wrong."""


class Task(BaseModel, extra="forbid"):
    id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    prompt: str = Field(min_length=1)
    check: Check
    min_tool_runs: int = Field(0, ge=0)
    """The answer only counts if at least this many tools really ran (e.g. 'read each one')."""

    def grade(self, answer: str, tool_runs: int, tool_results: list[str] = []) -> Grade:  # noqa: B006
        """Grade an answer: correct, wrong, or abstained (it says the information is not there,
        on a task whose folder holds it). Before the task's own patterns, these rules hold for
        every task: an answer containing chat-protocol text (`PROTOCOL_TEXT`) is wrong, so is
        one that reproduces a tool result verbatim (`echoes`): pasting the evidence back is not
        an answer, one holding tool-call or tool-schema JSON (`TOOL_JSON`), and one that is a
        list of tool names (`lists_tools`).

        Args:
            tool_results: the text of every tool result the run saw.
        """
        grade = self._grade(answer, tool_runs, tool_results)
        if grade.correct:
            return grade.model_copy(update={"verdict": "correct"})
        if not self.check.absent and answer.strip() and ABSTAINS.search(answer.lower()):
            return grade.model_copy(update={"verdict": "abstained", "why": "says the information is not there"})
        return grade

    def _grade(self, answer: str, tool_runs: int, tool_results: list[str]) -> Grade:
        text = answer.lower()
        if not text.strip():
            return Grade(correct=False, why="no answer")
        if PROTOCOL_TEXT.search(text):
            return Grade(correct=False, why="contains tool-protocol text")
        if echoes(answer, tool_results):
            return Grade(correct=False, why="reproduces a tool result verbatim")
        if TOOL_JSON.search(text):
            return Grade(correct=False, why="is a tool call or tool schema written as JSON")
        if lists_tools(text):
            return Grade(correct=False, why="lists tool names")
        if self.check.absent and not ABSTAINS.search(text):
            return Grade(correct=False, why="does not say the information is not there")
        missing = [p for p in self.check.all if not re.search(p, text)]
        if missing:
            return Grade(correct=False, why=f"does not match {missing[0]!r}")
        wrong = next((p for p in self.check.none if re.search(p, text)), None)
        if wrong is not None:
            return Grade(correct=False, why=f"gives a wrong answer ({wrong!r})")
        if tool_runs < self.min_tool_runs:
            return Grade(correct=False, why=f"{tool_runs} tool runs, the task needs {self.min_tool_runs}")
        return Grade(correct=True)

def lists_tools(text: str) -> bool:
    """True if `text` names three or more of runner's tools, or two or more with fewer than
    `TOOL_LIST_MAX_OTHER_WORDS` other words: a list of tools, not an answer."""
    from runner.catalog import NAMES

    named = {name for name in NAMES if re.search(rf"\b{re.escape(name)}\b", text)}
    if len(named) >= 3:
        return True
    other = [w for w in re.findall(r"[a-z0-9_.]+", text) if w not in named]
    return len(named) >= 2 and len(other) < TOOL_LIST_MAX_OTHER_WORDS


Split = Literal["dev", "test"]
SUITE_TOOLS = ("list_files", "read_file")
"""The tools a suite other than the six-task one offers when its suite.json names none: the
folder's read-only tools."""
SUITE_CATALOG: Literal["demo", "folder"] = "demo"
"""Which built-in tools a suite other than the six-task one offers when its suite.json does
not say (`RunConfig.builtin_tools`)."""


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
    catalog: Literal["demo", "folder"] | None = None
    """Which built-in tools `tools` names: "demo" (the packaged workspace's: a flat folder) or
    "folder" (subfolders, line ranges, search); None: `SUITE_CATALOG`."""
    tools: list[str] | None = None
    """The built-in tools offered (None: `SUITE_TOOLS`; the six-task suite's default catalog,
    `runner.state.DEFAULT_TOOLS`, for the six-task suite)."""
    tasks: list[Task] = Field(min_length=1)
    folder: Path = Field(Path(), exclude=True)
    """The suite's folder (set on load): its `workspace/` is what the tools work over."""

    @property
    def workspace(self) -> Path:
        return self.folder / "workspace"

    @property
    def default(self) -> bool:
        """The six-task suite: the scripted provider has a scenario for each of its tasks."""
        return self.folder.resolve() == tasks_dir().resolve()


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
    """A pydantic error location as a path into the file: tasks[3].check.all[0]."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the file"


def _raw_mistakes(file: Path) -> list[str]:
    """The mistakes `_mistakes` finds that a file with other mistakes still shows: task ids
    given twice and patterns that are not regular expressions (read from the raw JSON)."""
    import json

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
        where = "a task's check" if "check" in error["loc"] else "a task" if "tasks" in error["loc"] else "a suite"
        return f"not a field of {where} (docs/suite.md lists them)"
    if error["type"] == "missing":
        return "is missing"
    if error["type"] == "json_invalid":
        return f"not valid JSON ({error['ctx'].get('error', '')})"
    return str(error["msg"])


def _mistakes(suite: SuiteDefinition) -> list[str]:
    """What a well-formed suite.json still gets wrong: patterns that are not regular
    expressions, task ids given twice, unknown tools, a missing workspace."""
    from runner.catalog import DEMO, FOLDER
    from runner.research import Research

    out = []
    if not suite.workspace.is_dir():
        out.append(f"workspace/: there is no folder {suite.workspace} for the tools to work over")
    catalog = suite.catalog or SUITE_CATALOG
    offered = [*(FOLDER if catalog == "folder" else DEMO), Research.name]
    for name in suite.tools or []:
        if name not in offered:
            other = "demo" if catalog == "folder" else "folder"
            elsewhere = name in (DEMO if other == "demo" else FOLDER)
            hint = f'; it is in the {other} catalog: add "catalog": "{other}"' if elsewhere else ""
            out.append(f"tools: {name!r} is not a tool of the {catalog} catalog ({', '.join(offered)}){hint}")
    seen: set[str] = set()
    for i, task in enumerate(suite.tasks):
        if task.id in seen:
            out.append(f"tasks[{i}].id: {task.id!r} is the id of an earlier task")
        seen.add(task.id)
        for field in ("all", "none"):
            for j, pattern in enumerate(getattr(task.check, field)):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    out.append(f"tasks[{i}].check.{field}[{j}]: not a regular expression ({exc})")
        if not task.check.all and not task.check.absent:
            out.append(f"tasks[{i}].check: give `all` patterns a right answer matches, or `absent`: true")
    return out


def shipped_suites(split: Split | None = None) -> list[Path]:
    """The suite folders shipped beside the six-task suite (`tasks/*/suite.json`), by name;
    with `split`, those of that half only."""
    import json

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


class TaskResult(RunResult):
    """One run, one task on one model column: its `RunResult` and its grade. Tokens are
    counts, cost USD, times ms."""

    provider: Provider
    task: str
    mean_turn_ms: float
    correct: bool
    why_wrong: str | None = None
    """The grading rule a wrong answer failed (see `Task.grade`)."""
    verdict: Verdict = "wrong"
    """correct, wrong, or abstained (the answer says the information is not there)."""
    suite: str = ""
    """The suite's name ("" in reports written before suites were data: the six-task suite)."""
    split: Split | None = None
    calls: int = 0
    """Tool calls the model made (valid or not)."""
    invalid_calls: int = 0
    """Calls naming an unknown tool or with arguments its schema rejects."""
    model: str = ""
    """The model column: "scripted" or the local model's name."""
    repeat: int = 1
    """Which repeat of (task, model) this run is, from 1."""
    turn_ms: list[float] = Field(default_factory=list)
    """Wall time of each turn, ms (`TurnRecord.ms`: the model call, retries included)."""
    driven_by: str = ""
    """Where the run was driven: "local pid N", or "node <Ray node id, 8 hex> pid N"."""


class TaskSummary(BaseModel):
    """One task on one model over its repeats: counts and means per run (tokens, cost USD,
    wall ms), and turn times over every turn of every repeat (ms)."""

    model: str
    provider: Provider
    task: str
    runs: int
    passed: int
    pass_rate: float
    """passed / runs."""
    statuses: dict[str, int]
    """How many runs stopped with each status."""
    turns: float
    tool_runs: float
    prompt_tokens: float
    completion_tokens: float
    cost_usd: float
    wall_ms: float
    turn_ms_mean: float
    turn_ms_p50: float
    turn_ms_p95: float


class Score(BaseModel):
    """One model column on one split (or suite): how many answers were correct, wrong and
    abstained, with the correct rate's 95% Wilson interval."""

    model: str
    split: str
    """"dev", "test", or a suite's name for a suite outside the split."""
    n: int
    correct: int
    wrong: int
    abstained: int
    correct_low: float
    correct_high: float


class SuiteRef(BaseModel):
    """A suite a report ran: its name, split and folder."""

    name: str
    split: Split | None = None
    path: str
    tasks: int


class SuiteReport(BaseModel):
    suites: list[SuiteRef] = []
    """The suites run, in order (empty in reports written before suites were data)."""
    model: str | None
    """The first local model's name (None when only the scripted provider ran)."""
    model_path: str | None = None
    base_url: str | None = None
    first_turn_tool_choice: ToolChoiceSetting = "auto"
    """tool_choice sent on each local task's first turn (the manifest's value for the first local model)."""
    load_average: list[float] | None = None
    """The machine's 1, 5 and 15 minute load averages when the local columns finished."""
    local_turns: list[dict[str, float]] = []
    """Per model call of the first local column, from the server(s) started for it (GET /stats;
    in order per server, servers one after another):
    prompt_tokens, cached_prompt_tokens (KV reused), prompt_eval_tokens (evaluated), eval_tokens,
    prompt_eval_ms, eval_ms, handler_ms."""
    max_turns: int
    results: list[TaskResult]
    """One per run, by model column, then task, then repeat."""
    cancelled: bool = False
    """True when Ctrl-C stopped the suite: `results` holds the runs finished until then."""
    models: list[str] = []
    """The model columns, in order ("scripted" is the scripted provider)."""
    repeats: int = 1
    executor: Literal["local", "ray"] = "local"
    summaries: list[TaskSummary] = []
    """One per (model, task), from `summarize`."""
    scores: list[Score] = []
    """One per (model, split), from `scores`."""
    policies: dict[str, list[str]] = {}
    """The steering policies of each local column, by name (`runner.steering`)."""
    report_path: str | None = None
    """Where the Markdown report was written (the JSON and the plot sit beside it)."""
    unfinished: list[str] = []
    """Ids of runs created but not driven to a stop (the suite was cancelled): each is saved
    and continues with `runner resume ID`."""


def _result(provider: Provider, task: Task, state: RunState, suite: SuiteDefinition | None = None,
            key: str | None = None) -> TaskResult:
    results = [m.content or "" for m in state.messages if m.role == "tool"]
    grade = task.grade(state.answer, state.tool_run_count, results)
    return TaskResult(
        **(RunResult.of(state).model_dump() | {"wall_ms": round(state.wall_ms, 1)}),
        provider=provider, task=key or task.id, suite=suite.name if suite else "", split=suite.split if suite else None,
        mean_turn_ms=round(statistics.fmean(t.ms for t in state.per_turn), 1) if state.per_turn else 0.0,
        correct=grade.correct, why_wrong=grade.why, verdict=grade.verdict,
        calls=sum(len(m.tool_calls or []) for m in state.messages if m.role == "assistant"),
        invalid_calls=sum(1 for r in state.tool_runs if r.source == "invalid"),
    )


def model_columns(provider: str, models: Sequence[str] = (), base_url: str | None = None,
                  latency_ms: float = 0.0, on_note: Callable[[str], None] | None = None) -> list[Endpoint]:
    """The suite's model columns, in order, as endpoints.

    Without `models`, `provider` picks them: "scripted", "local" (the default local model) or
    "both". With `models` (names from `runner models list`, .gguf paths, or "scripted" for the
    scripted provider), those are the columns, after the scripted one when `provider` is "both".
    With `base_url`, every non-scripted column talks to that endpoint under its own name.
    A local column's first-turn tool_choice and chat format are the model manifest's (by name,
    or by file name for a path); "auto" and runner's Hermes adapter for a model it does not know.

    Raises:
        UsageError: an unknown provider, a local model with provider "scripted", or a
            malformed `base_url` (`checked_base_url`).
        ModelNotFound: a named model is not on disk.
    """
    if provider not in ("scripted", "local", "both"):
        raise UsageError("--provider must be scripted, local or both")
    if base_url is not None:
        base_url = checked_base_url(base_url)
    names = list(dict.fromkeys(models))
    local_names: list[str | None] = [m for m in names if m != "scripted"]
    if provider == "scripted" and local_names:
        raise UsageError("--provider scripted runs no local model: leave out --model, or use --provider both")
    scripted = provider != "local" or "scripted" in names
    if not names and provider != "scripted":
        local_names = [None]  # the default local model
    columns = [Endpoint(model="scripted", latency_ms=latency_ms)] if scripted else []
    from runner import models as models_mod

    for name in local_names:
        if base_url:
            entry = models_mod.entry_for(name) if name else None
            columns.append(Endpoint(model=name or "default", base_url=base_url,
                                    first_turn_tool_choice=entry.first_turn_tool_choice if entry else "auto"))
            continue
        shown, path = models_mod.resolve_choice(models_mod.manifest_name(name) if name else None)
        entry = models_mod.entry_for(shown, path)
        choice: ToolChoiceSetting = entry.first_turn_tool_choice if entry else "auto"
        if on_note is not None:
            on_note(f"local model: {shown}\n  file: {path}")
        # Named as llama.cpp serves it (the file stem), as runs and reports always named it.
        columns.append(Endpoint(model=path.stem, local_model=str(path), first_turn_tool_choice=choice,
                                chat_format=entry.chat_format if entry else HANDLER_NAME))
    return columns


def harness_settings(column: Endpoint, run_settings: dict[str, Any] | None = None,
                     system_addendum: str | None = None, policy_edits: Sequence[str] = ()) -> tuple[dict[str, Any], str]:
    """The harness settings a column's runs get, from the model manifest unless overridden:
    (`RunConfig` fields, text added to the system prompt). The scripted column gets none.

    A local model's manifest entry (found by name, or by the file name of its GGUF) gives
    ``answer_after_tool_turns``, ``answer_on_stall``, ``answer_restates_results``,
    ``parallel_tool_calls`` and ``system_addendum``; `run_settings` and `system_addendum`
    take precedence, and `policy_edits` (`runner.steering.edited`) change the policies last."""
    if column.scripted:
        return {}, ""
    from runner import models as models_mod

    entry = models_mod.entry_for(column.model, Path(column.local_model) if column.local_model else None)
    settings = (entry.harness_defaults() if entry is not None else {}) | (run_settings or {})
    if policy_edits:
        own, at_endpoint = steering.split_fields(settings)
        current = RunConfig(endpoint=column.model_copy(update=at_endpoint), **own)
        settings = settings | steering.fields_for(steering.edited(steering.active(current), policy_edits), settings)
    addendum = system_addendum if system_addendum is not None else (entry.system_addendum if entry else "")
    return settings, addendum


def _policies_of(column: Endpoint, settings: dict[str, Any], addendum: str) -> list[str]:
    """The steering policies a local column's runs get, by name."""
    own, at_endpoint = steering.split_fields(settings)
    return steering.active(RunConfig(endpoint=column.model_copy(update=at_endpoint), **own))


def _model_for(column: Endpoint, task: Task) -> str:
    """The model name a run of `task` sends: scripted runs name their scenario (the task id)."""
    return f"scripted/{task.id}" if column.scripted else column.model


def run_suite(provider: str, runs_root: Path, *, models: Sequence[str] = (), base_url: str | None = None,
              max_turns: int = 8, max_tokens: int | None = None, latency_ms: float = 0.0, repeats: int = 1,
              executor: Executor | None = None, columns: list[Endpoint] | None = None,
              on_result: Callable[[TaskResult], None] | None = None, on_note: Callable[[str], None] | None = None,
              store_location: str | None = None, durability: Durability = "process",
              run_settings: dict[str, Any] | None = None, system_addendum: str | None = None,
              suites: Sequence[SuiteDefinition] = (), policy_edits: Sequence[str] = (),
              workspace: str | None = None) -> SuiteReport:
    """Run every task of `suites` (default: the six-task suite) on every model column
    `repeats` times; returns the report (`runner.render.write_suite_report` writes it).

    Every (model, task, repeat) is saved as a run before `executor` drives any.

    Args:
        provider, models, base_url: the columns, as `model_columns`.
        max_turns: turn cap per task.
        max_tokens: cap on each reply, tokens (None: the server's default, 512 for runner serve).
        latency_ms: delay of every scripted reply, ms (the scripted column only); repeats: runs per (task, model).
        executor: a `runner.fanout` executor (`RayExecutor` fans out over a Ray cluster).
        columns: the model columns as endpoints, instead of `provider`, `models`, `base_url`
            and `latency_ms` (e.g. a scripted provider that is already running).
        store_location: where the runs live: a runs directory or a postgresql:// URL (default:
            `runs_root`).
        durability: what each committed transition survives (see `runner.store.Durability`).
        on_result: called with each task's result as its run stops.
        on_note: called with a line about each local model column (which file, which settings).
        run_settings: `RunConfig` fields for every local column's runs, over the manifest's
            (`harness_settings`), e.g. ``{"on_slip": "repeat"}``.
        system_addendum: text added to the suite's system prompt for local columns, instead of
            the manifest's ``system_addendum`` (None: the manifest's; "": none).
        suites: the suites to run, in order (`load_suite`, `select_tasks`); policy_edits:
            `--policy` values (`runner.steering.edited`); workspace: another folder to work over.

    Raises:
        UsageError, models.ModelNotFound: as `model_columns` and `_check_scripted`.
        RuntimeError: a server failed to start.
    """
    suites = list(suites) or [load_suite()]
    columns = columns or model_columns(provider, models, base_url, latency_ms, on_note)
    _check_scripted(suites, columns)
    executor = executor or LocalExecutor()
    local = [c for c in columns if not c.scripted]
    steering = {c.label: _policies_of(c, *harness_settings(c, run_settings, system_addendum, policy_edits))
                for c in local}
    report = _new_report(suites, columns, executor, steering, base_url=base_url, max_turns=max_turns, repeats=repeats)
    location = StoreAt(store_location or str(runs_root.resolve()), durability)
    jobs: Jobs = {}
    batches = [Batch(column, [run_id for suite in suites for run_id in _create_runs(
        suite, column, location, jobs, repeats, max_turns, max_tokens, len(suites) > 1,
        *harness_settings(column, run_settings, system_addendum, policy_edits), workspace)]) for column in columns]
    report.results = _drive(executor, batches, location, jobs, on_result)
    finished = {r.run_id for r in report.results}
    report.unfinished = [run_id for batch in batches for run_id in batch.run_ids if run_id not in finished]
    report.summaries = summarize(report.results)
    report.scores = scores(report.results)
    report.cancelled = executor.cancelled
    if local:
        report.load_average = [round(x, 2) for x in os.getloadavg()]
        report.local_turns = executor.server_turns.get(local[0].label, [])
    return report


def _check_scripted(suites: list[SuiteDefinition], columns: list[Endpoint]) -> None:
    """The scripted provider has scenarios for the six-task suite's tasks only.

    Raises:
        UsageError: a scripted column with another suite.
    """
    other = [s.name for s in suites if not s.default]
    if other and any(c.scripted for c in columns):
        raise UsageError(f"the scripted provider answers only the six-task suite, not {other[0]}: "
                         "run it with --provider local (or --model NAME)")


def _new_report(suites: list[SuiteDefinition], columns: list[Endpoint], executor: Executor,
                steering: dict[str, list[str]], **settings: Any) -> SuiteReport:
    """The report of a suite about to run: what runs, on which columns, with which policies
    (`steering`, per local column), how; no results yet."""
    local = [c for c in columns if not c.scripted]
    first: ToolChoiceSetting = "required" if local and "first_turn_required" in steering[local[0].label] else "auto"
    return SuiteReport(suites=[SuiteRef(name=x.name, split=x.split, path=str(x.folder), tasks=len(x.tasks))
                               for x in suites], model=local[0].label if local else None,
                       model_path=local[0].local_model if local else None, results=[],
                       models=[c.label for c in columns], executor="ray" if isinstance(executor, RayExecutor) else "local",
                       first_turn_tool_choice=first, policies=steering, **settings)


def run_requested(req: SuiteRequest, runs_root: Path, *, store_location: str | None = None,
                  durability: Durability = "process", on_note: Callable[[str], None] | None = None,
                  on_result: Callable[[TaskResult], None] | None = None,
                  on_runs_dir: Callable[[Path], None] | None = None) -> SuiteReport:
    """Run the suite as `runner suite` asks, or finish the cancelled one whose report
    `req.resume_report` names. The executor and the model columns are checked before anything
    is written; with no `store_location` the runs go to `runs_root`, made if it is missing
    (`on_runs_dir` is called with it then; a resumed suite's runs are there already). `on_note`, `on_result`: as `run_suite`.

    Raises:
        UsageError, models.ModelNotFound: as `runner.fanout.executor` and `model_columns`.
    """
    steering.edited([], req.policies)  # an unknown name is refused even when no column is local
    if req.max_turns < 1:
        raise UsageError(f"--max-turns {req.max_turns}: a suite always caps its tasks' turns; give 1 or more")
    suites = requested_suites(req)
    provider = req.provider or ("both" if len(suites) == 1 and suites[0].default else "local")
    executor = fanout.executor(req.executor, address=req.address, actors=req.actors)
    columns = (None if req.resume_report is not None
               else model_columns(provider, req.models, req.base_url, req.latency_ms, on_note=on_note))
    if req.resume_report is not None:  # its runs are in the store already: nothing to make
        return resume_suite(req.resume_report, runs_root, store_location=store_location, durability=durability,
                            on_result=on_result, executor=executor)
    assert columns is not None
    _check_scripted(suites, columns)
    made_dir = make_runs_dir(FileStore(runs_root)) if store_location is None else None
    if made_dir is not None and on_runs_dir is not None:
        on_runs_dir(made_dir)
    return run_suite(provider, runs_root, models=req.models, base_url=req.base_url, max_turns=req.max_turns,
                     max_tokens=req.max_tokens, repeats=req.repeats, store_location=store_location,
                     durability=durability, on_result=on_result, columns=columns, executor=executor, suites=suites,
                     policy_edits=req.policies, workspace=req.workspace_path)


def requested_suites(req: SuiteRequest) -> list[SuiteDefinition]:
    """The suites `runner suite` asks for: each --suite folder, then the shipped suites of
    --split, cut to the --task ids; the six-task suite when none is named.

    Raises:
        UsageError: as `load_suite` and `select_tasks`; a folder given twice.
    """
    if req.resume_report is not None:
        return []
    folders = [*req.suites, *(shipped_suites(req.split) if req.split else [])]  # type: ignore[arg-type]
    suites = [load_suite(f) for f in folders] or [load_suite()]
    names = [s.name for s in suites]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise UsageError(f"the suite {twice!r} is named twice: give each suite once (a report names tasks SUITE/ID)")
    return select_tasks(suites, req.tasks)


class Job(BaseModel):
    """What one run of a suite is: its model column, suite, task, the key reports name the
    task by (SUITE/ID when several suites ran), and which repeat."""

    model_config = {"arbitrary_types_allowed": True}
    column: Endpoint
    suite: SuiteDefinition
    task: Task
    key: str
    repeat: int


Jobs = dict[str, Job]
"""Run id -> the job of each run a suite drives."""


def _create_runs(suite: SuiteDefinition, column: Endpoint, location: StoreAt, jobs: Jobs, repeats: int, max_turns: int,
                 max_tokens: int | None, qualified: bool, harness: dict[str, Any], addendum: str,
                 workspace: str | None = None) -> list[str]:
    """Save every task x repeat of one suite on one column as a queued run (recorded in
    `jobs`); returns their ids. Each run records how `runner resume` reaches its endpoint
    again, and the folder it works over (`workspace`, else the suite's own) and its tools."""
    run_ids = []
    for task in suite.tasks:
        for repeat in range(1, repeats + 1):
            overrides = dict(harness)  # endpoint settings (e.g. first_turn_tool_choice) go on the endpoint
            moved = {k: overrides.pop(k) for k in list(overrides) if k in Endpoint.model_fields}
            endpoint = column.model_copy(update={"model": _model_for(column, task), **moved})
            where: dict[str, Any] = {} if suite.default else {
                "workspace": str(suite.workspace), "tools": list(suite.tools or SUITE_TOOLS),
                "builtin_tools": suite.catalog or SUITE_CATALOG}
            if suite.tools is not None:
                where["tools"] = list(suite.tools)
            if workspace is not None:
                where["workspace"] = workspace
            config = RunConfig(endpoint=endpoint, limits=Limits(max_turns=max_turns), max_tokens=max_tokens,
                               **overrides, **where)
            state = new_run(task.prompt, config, system=suite.system + addendum)
            if config.steering:
                steering.opening(state, Path(config.workspace) if config.workspace else tasks_dir() / "workspace")
            fanout.create(state, location)
            key = f"{suite.name}/{task.id}" if qualified else task.id
            jobs[state.run_id] = Job(column=column, suite=suite, task=task, key=key, repeat=repeat)
            run_ids.append(state.run_id)
    return run_ids


def _drive(executor: Executor, batches: list[Batch], location: StoreAt, jobs: Jobs,
           on_result: Callable[[TaskResult], None] | None) -> list[TaskResult]:
    """Drive the batches to their stops; each run's graded result, in batch order."""

    def result_of(state: RunState, where: str) -> TaskResult:
        job = jobs[state.run_id]
        return _result("scripted" if job.column.scripted else "local", job.task, state, job.suite, job.key).model_copy(
            update={"model": job.column.label, "repeat": job.repeat, "turn_ms": [round(t.ms, 1) for t in state.per_turn],
                    "driven_by": where})

    def done(state: RunState, where: str) -> None:
        if on_result is not None:
            on_result(result_of(state, where))

    return [result_of(state, where) for state, where in executor.drive(batches, location, done)]


def _first_problem(exc: Exception) -> str:
    """A report that does not parse, in one line: pydantic's first complaint and where, else `exc`."""
    if isinstance(exc, ValidationError) and (errors := exc.errors()):
        where = ".".join(str(part) for part in errors[0]["loc"])
        return f"{errors[0]['msg']}{f' (at {where})' if where else ''}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _cancelled(result: TaskResult) -> bool:
    """A run Ctrl-C stopped before it finished (resumable, not a result)."""
    return result.status == "interrupted" and (result.reason or "").startswith("cancelled")


def resume_suite(report_file: Path, runs_root: Path, *, executor: Executor | None = None,
                 on_result: Callable[[TaskResult], None] | None = None, store_location: str | None = None,
                 durability: Durability = "process") -> SuiteReport:
    """Finish a cancelled suite: drive the runs its report lists as unfinished or cancelled
    (each resumed where it stopped, nothing paid twice); returns a report of every run.

    Args:
        report_file: the cancelled suite's JSON report (its .md path works too).
        runs_root, executor, on_result, store_location, durability: as `run_suite` (the runs
            must be in that store).

    Raises:
        UsageError: a file not named as a report, an unreadable report, or one with nothing
            left to run.
        RunNotFound: a run of the report is not in the store.
    """
    if report_file.suffix not in (".json", ".md"):
        raise UsageError(f"--resume {report_file}: not a suite report (give the suite-*.json a suite wrote, or its .md)")
    path = report_file.with_suffix(".json")
    try:
        old = SuiteReport.model_validate_json(path.read_text())
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else _first_problem(exc)
        read = f" (read as {path.name})" if path != report_file else ""
        raise UsageError(f"cannot read the suite report {report_file}{read}: {why}") from None
    todo = [r.run_id for r in old.results if _cancelled(r)] + old.unfinished
    if not todo:
        raise UsageError(f"nothing to resume: every run of {path} finished")
    suites = [load_suite(Path(ref.path)) for ref in old.suites] or [load_suite()]
    location = StoreAt(store_location or str(runs_root.resolve()), durability)
    kept = [r for r in old.results if not _cancelled(r)]
    jobs = _requeue(fanout._store(location), todo, kept, {r.run_id: r for r in old.results}, suites)
    columns = {job.column.label: job.column for job in jobs.values()}
    executor = executor or LocalExecutor()
    batches = [Batch(c, [rid for rid, job in jobs.items() if job.column.label == c.label]) for c in columns.values()]
    order = {m: i for i, m in enumerate(old.models)}
    task_order = {key: i for i, key in enumerate(_keys(suites))}
    results = kept + _drive(executor, batches, location, jobs, on_result)
    results.sort(key=lambda r: (order.get(r.model, len(order)), task_order.get(r.task, 0), r.repeat))
    finished = {r.run_id for r in results}
    return old.model_copy(update={
        "results": results, "cancelled": executor.cancelled, "summaries": summarize(results), "scores": scores(results),
        "unfinished": [rid for rid in todo if rid not in finished], "report_path": None})


def _keys(suites: list[SuiteDefinition]) -> list[str]:
    """The key each task of `suites` is reported under, in order (SUITE/ID when several ran)."""
    return [f"{s.name}/{t.id}" if len(suites) > 1 else t.id for s in suites for t in s.tasks]


def _requeue(runs: RunStore, todo: list[str], kept: list[TaskResult], known: dict[str, TaskResult],
             suites: list[SuiteDefinition]) -> Jobs:
    """Queue again the runs Ctrl-C stopped (as they were), and find each run's column, suite,
    task and repeat (the suite by the run's workspace, the task by its prompt; the repeat from
    the old report, or counted after the finished ones)."""
    columns: dict[str, Endpoint] = {}
    jobs: Jobs = {}
    for run_id in todo:
        state = runs.load(run_id)
        if state.status == "interrupted":
            lease = runs.claim(run_id)
            state.status, state.interruption, state.reason = "running", None, None
            runs.save(state, (), lease)
            runs.release(lease, runnable=True)
        endpoint = state.config.endpoint
        column = columns.setdefault(endpoint.label, endpoint.model_copy(update={"model": "scripted"})
                                    if endpoint.scripted else endpoint)
        prompt = next(m.content for m in state.messages if m.role == "user")
        folder = Path(state.config.workspace).parent if state.config.workspace else tasks_dir().resolve()
        suite = next((x for x in suites if x.folder == folder), suites[0])
        task = next(t for t in suite.tasks if t.prompt == prompt)
        key = f"{suite.name}/{task.id}" if len(suites) > 1 else task.id
        done = sum(1 for r in kept if (r.model, r.task) == (column.label, key))
        repeat = known[run_id].repeat if run_id in known else done + 1 + sum(
            1 for j in jobs.values() if (j.column.label, j.key) == (column.label, key))
        jobs[run_id] = Job(column=column, suite=suite, task=task, key=key, repeat=repeat)
    return jobs


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion, (low, high); (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def scores(results: list[TaskResult]) -> list[Score]:
    """A `Score` per (model column, split), in the order first seen; runs Ctrl-C stopped are left out."""
    groups: dict[tuple[str, str], list[TaskResult]] = {}
    for r in results:
        if not _cancelled(r):
            groups.setdefault((r.model, r.split or r.suite or "six-task"), []).append(r)
    out = []
    for (model, split), rs in groups.items():
        verdicts = Counter(r.verdict if r.verdict != "wrong" or not r.correct else "correct" for r in rs)
        low, high = wilson(verdicts["correct"], len(rs))
        out.append(Score(model=model, split=split, n=len(rs), correct=verdicts["correct"], wrong=verdicts["wrong"],
                         abstained=verdicts["abstained"], correct_low=round(low, 3), correct_high=round(high, 3)))
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's
    default); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(results: list[TaskResult]) -> list[TaskSummary]:
    """One `TaskSummary` per (model, task), in the order first seen. A run stopped by Ctrl-C
    is unfinished, not wrong: it counts in no pass rate or mean (the report lists it)."""
    groups: dict[tuple[str, str], list[TaskResult]] = {}
    for r in results:
        if _cancelled(r):
            continue
        groups.setdefault((r.model, r.task), []).append(r)
    out = []
    for (model, task), rs in groups.items():
        turn_ms = [ms for r in rs for ms in r.turn_ms]
        passed = sum(r.correct for r in rs)

        def mean(values: Iterable[float]) -> float:
            return round(statistics.fmean(values), 3)

        out.append(TaskSummary(
            model=model, provider=rs[0].provider, task=task, runs=len(rs), passed=passed,
            pass_rate=round(passed / len(rs), 3), statuses=dict(Counter(r.status for r in rs)),
            turns=mean(r.turns for r in rs), tool_runs=mean(r.tool_runs for r in rs),
            prompt_tokens=mean(r.prompt_tokens for r in rs), completion_tokens=mean(r.completion_tokens for r in rs),
            cost_usd=round(statistics.fmean(r.cost_usd for r in rs), 9), wall_ms=round(mean(r.wall_ms for r in rs), 1),
            turn_ms_mean=round(statistics.fmean(turn_ms), 1) if turn_ms else 0.0,
            turn_ms_p50=round(percentile(turn_ms, 50), 1), turn_ms_p95=round(percentile(turn_ms, 95), 1),
        ))
    return out


def totals(results: list[TaskResult]) -> dict[str, float]:
    """Sums over tasks (turns, tool runs, tokens, cost USD, wall ms), the mean turn ms, correct count."""
    turns = sum(r.turns for r in results)
    wall = sum(r.wall_ms for r in results)
    return {
        "turns": turns, "tool_runs": sum(r.tool_runs for r in results),
        "prompt_tokens": sum(r.prompt_tokens for r in results),
        "completion_tokens": sum(r.completion_tokens for r in results),
        "cost_usd": round(sum(r.cost_usd for r in results), 6), "wall_ms": round(wall, 1),
        "mean_turn_ms": round(sum(r.mean_turn_ms * r.turns for r in results) / turns, 1) if turns else 0.0,
        "correct": sum(r.correct for r in results),
        "calls": sum(r.calls for r in results),
        "invalid_calls": sum(r.invalid_calls for r in results),
        "tasks_with_a_call": sum(r.calls > 0 for r in results),
    }


