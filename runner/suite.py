"""The six-task suite (the main job): the same harness on the scripted provider and on one
or more local models, side by side, each task repeated N times.

Tasks live in `tasks/suite.json` (prompt + answer check as regular expressions over the
lower-cased answer). The scripted provider answers each task with the scenario of the same
name. Every (model, task, repeat) is a normal saved run, created in the store before any is
driven, then driven by a `runner.fanout` executor (this process, or Ray actors); `runner trace`
works on each. Reports, with pass rates and turn-time percentiles over the repeats, are
written to `runs/suite-<timestamp>.json`, `.md` and `.png` (turn time per task and model).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

from pydantic import BaseModel

from runner import fanout
from runner.chat_adapter import HANDLER_NAME
from runner.errors import UsageError
from runner.fanout import Batch, Endpoint, Executor, LocalExecutor, RayExecutor
from runner.resources import tasks_dir
from runner.state import RunConfig, RunState, new_run

Provider = Literal["scripted", "local"]
ToolChoiceSetting = Literal["auto", "required", "none"]

PROTOCOL_TEXT = re.compile(r"</?tool_(?:call|response)>|<\|im_(?:start|end)\|>")
"""Chat-protocol markup: an answer containing it pasted the transcript, it did not answer."""
ECHO_LINE_CHARS = 40
"""A tool-result line at least this long, found verbatim in an answer, makes the answer an echo."""
TOOL_JSON = re.compile(r'"(?:name|arguments|parameters|properties|function|type)"\s*:')
"""A JSON key of a tool call or a tool schema: an answer containing one wrote a call or pasted
the tools as text, it did not answer."""
TOOL_LIST_MAX_OTHER_WORDS = 6
"""An answer naming two or more tools with fewer other words than this is a list of tools."""


class Check(BaseModel):
    all: list[str] = []
    """Every pattern must match the lower-cased answer."""
    none: list[str] = []
    """Wrong answers: no pattern may match (e.g. another file named as the largest)."""


class Grade(BaseModel):
    correct: bool
    why: str | None = None
    """Why a wrong answer is wrong; None when correct."""


class Task(BaseModel):
    id: str
    prompt: str
    check: Check
    min_tool_runs: int = 0
    """The answer only counts if at least this many tools really ran (e.g. 'read each one')."""

    def grade(self, answer: str, tool_runs: int, tool_results: list[str] = []) -> Grade:  # noqa: B006
        """Grade an answer. Before the task's own patterns, these rules hold for every task: an
        answer containing chat-protocol text (`PROTOCOL_TEXT`) is wrong, so is one that
        reproduces a tool result verbatim (`echoes`): pasting the evidence back is not an
        answer, one holding tool-call or tool-schema JSON (`TOOL_JSON`), and one that is a
        list of tool names (`lists_tools`).

        Args:
            tool_results: the text of every tool result the run saw.
        """
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
        missing = [p for p in self.check.all if not re.search(p, text)]
        if missing:
            return Grade(correct=False, why=f"does not match {missing[0]!r}")
        wrong = next((p for p in self.check.none if re.search(p, text)), None)
        if wrong is not None:
            return Grade(correct=False, why=f"gives a wrong answer ({wrong!r})")
        if tool_runs < self.min_tool_runs:
            return Grade(correct=False, why=f"{tool_runs} tool runs, the task needs {self.min_tool_runs}")
        return Grade(correct=True)

    def is_correct(self, answer: str, tool_runs: int, tool_results: list[str] = []) -> bool:  # noqa: B006
        return self.grade(answer, tool_runs, tool_results).correct


def lists_tools(text: str) -> bool:
    """True if `text` names three or more of runner's tools, or two or more with fewer than
    `TOOL_LIST_MAX_OTHER_WORDS` other words: a list of tools, not an answer."""
    from runner.catalog import NAMES

    named = {name for name in NAMES if re.search(rf"\b{re.escape(name)}\b", text)}
    if len(named) >= 3:
        return True
    other = [w for w in re.findall(r"[a-z0-9_.]+", text) if w not in named]
    return len(named) >= 2 and len(other) < TOOL_LIST_MAX_OTHER_WORDS


def echoes(answer: str, tool_results: list[str]) -> bool:
    """True if `answer` reproduces a tool result: one of its lines of `ECHO_LINE_CHARS`+
    characters, or two of its consecutive lines, appear verbatim (case and runs of whitespace
    ignored). Quoting a short phrase or one short line (a one-line note) is allowed."""
    flat = " ".join(answer.lower().split())
    for result in tool_results:
        lines = [" ".join(line.lower().split()) for line in result.splitlines()]
        lines = [line for line in lines if line]
        if any(len(line) >= ECHO_LINE_CHARS and line in flat for line in lines):
            return True
        if any(f"{a} {b}" in flat for a, b in itertools.pairwise(lines)):
            return True
    return False


class SuiteDefinition(BaseModel):
    system: str
    tasks: list[Task]


def load_suite(path: Path | None = None) -> SuiteDefinition:
    """Read `tasks/suite.json` (or `path`)."""
    return SuiteDefinition.model_validate_json((path or tasks_dir() / "suite.json").read_text())


class TaskResult(BaseModel):
    """One run: one task on one model column. Tokens are counts, cost USD, times ms."""

    provider: Provider
    task: str
    status: str
    turns: int
    tool_runs: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    wall_ms: float
    mean_turn_ms: float
    answer: str
    correct: bool
    run_id: str
    reason: str | None = None
    why_wrong: str | None = None
    """The grading rule a wrong answer failed (see `Task.grade`)."""
    calls: int = 0
    """Tool calls the model made (valid or not)."""
    invalid_calls: int = 0
    """Calls naming an unknown tool or with arguments its schema rejects."""
    model: str = ""
    """The model column: "scripted" or the local model's name."""
    repeat: int = 1
    """Which repeat of (task, model) this run is, from 1."""
    turn_ms: list[float] = []
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


class SuiteReport(BaseModel):
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
    report_path: str | None = None
    """Where the Markdown report was written (the JSON and the plot sit beside it)."""
    unfinished: list[str] = []
    """Ids of runs created but not driven to a stop (the suite was cancelled): each is saved
    and continues with `runner resume ID`."""


def _result(provider: Provider, task: Task, state: RunState) -> TaskResult:
    results = [m.content or "" for m in state.messages if m.role == "tool"]
    grade = task.grade(state.answer, state.tool_run_count, results)
    return TaskResult(
        provider=provider, task=task.id, status=state.status, turns=state.turns,
        tool_runs=state.tool_run_count, prompt_tokens=state.prompt_tokens,
        completion_tokens=state.completion_tokens, cost_usd=round(state.cost_usd, 9),
        wall_ms=round(state.wall_ms, 1),
        mean_turn_ms=round(statistics.fmean(t.ms for t in state.per_turn), 1) if state.per_turn else 0.0,
        answer=state.answer, correct=grade.correct, why_wrong=grade.why,
        run_id=state.run_id, reason=state.reason,
        calls=sum(len(m.tool_calls or []) for m in state.messages if m.role == "assistant"),
        invalid_calls=sum(1 for r in state.tool_runs if r.source == "invalid"),
    )


def _print_progress(result: TaskResult, quiet: bool) -> None:
    if not quiet:
        # at most ~76 characters: one line in an 80-column terminal
        status = "" if result.status == "completed" else f" {result.status}"
        print(f"  {result.model[:12]:<12} {result.task:<12} #{result.repeat:<2} turns={result.turns:<2} "
              f"tools={result.tool_runs:<2} {result.wall_ms:>7,.0f} ms  ok={'yes' if result.correct else 'no'}{status}",
              file=sys.stderr, flush=True)


def model_columns(provider: str, models: Sequence[str] = (), base_url: str | None = None,
                  latency_ms: float = 0.0, quiet: bool = True) -> list[Endpoint]:
    """The suite's model columns, in order, as endpoints.

    Without `models`, `provider` picks them: "scripted", "local" (the default local model) or
    "both". With `models` (names from `runner models list`, .gguf paths, or "scripted" for the
    scripted provider), those are the columns, after the scripted one when `provider` is "both".
    With `base_url`, every non-scripted column talks to that endpoint under its own name.
    A local column's first-turn tool_choice and chat format are the model manifest's (by name,
    or by file name for a path); "auto" and runner's Hermes adapter for a model it does not know.

    Raises:
        UsageError: an unknown provider, or a local model with provider "scripted".
        ModelNotFound: a named model is not on disk.
    """
    if provider not in ("scripted", "local", "both"):
        raise UsageError("--provider must be scripted, local or both")
    names = list(dict.fromkeys(models))
    local_names: list[str | None] = [m for m in names if m != "scripted"]
    if provider == "scripted" and local_names:
        raise UsageError("--provider scripted runs no local model: leave out --model, or use --provider both")
    scripted = provider != "local" or "scripted" in names
    if not names and provider != "scripted":
        local_names = [None]  # the default local model
    columns = [Endpoint(name="scripted", kind="scripted", latency_ms=latency_ms)] if scripted else []
    from runner import models as models_mod

    for name in local_names:
        if base_url:
            entry = models_mod.entry_for(name) if name else None
            columns.append(Endpoint(name=name or "default", kind="url", base_url=base_url,
                                    first_turn_tool_choice=entry.first_turn_tool_choice if entry else "auto"))
            continue
        shown, path = models_mod.resolve_choice(name)
        entry = models_mod.entry_for(shown, path)
        choice: ToolChoiceSetting = entry.first_turn_tool_choice if entry else "auto"
        if not quiet:
            print(f"local model: {shown}, first turn tool_choice={choice}\n  file: {path}", file=sys.stderr, flush=True)
        # Named as llama.cpp serves it (the file stem), as runs and reports always named it.
        columns.append(Endpoint(name=path.stem, kind="local", model_path=str(path), first_turn_tool_choice=choice,
                                chat_format=entry.chat_format if entry else HANDLER_NAME))
    return columns


def harness_settings(column: Endpoint, run_settings: dict[str, Any] | None = None,
                     system_addendum: str | None = None) -> tuple[dict[str, Any], str]:
    """The harness settings a column's runs get, from the model manifest unless overridden:
    (`RunConfig` fields, text added to the system prompt). The scripted column gets none.

    A local model's manifest entry (found by name, or by the file name of its GGUF) gives
    ``answer_after_tool_turns`` and ``system_addendum``; `run_settings` and `system_addendum`
    take precedence."""
    if column.kind == "scripted":
        return {}, ""
    from runner import models as models_mod

    entry = models_mod.entry_for(column.name, Path(column.model_path) if column.model_path else None)
    settings: dict[str, Any] = {"answer_after_tool_turns": entry.answer_after_tool_turns} if entry else {}
    settings |= run_settings or {}
    addendum = system_addendum if system_addendum is not None else (entry.system_addendum if entry else "")
    return settings, addendum


def _model_for(column: Endpoint, task: Task) -> str:
    """The model name a run of `task` sends: scripted runs name their scenario (the task id)."""
    return f"scripted/{task.id}" if column.kind == "scripted" else column.name


def run_suite(provider: str, runs_root: Path, *, models: Sequence[str] = (), base_url: str | None = None,
              max_turns: int = 8, max_tokens: int | None = None, latency_ms: float = 0.0, repeats: int = 1,
              executor: Executor | None = None, columns: list[Endpoint] | None = None,
              quiet: bool = False, store_location: str | None = None,
              run_settings: dict[str, Any] | None = None, system_addendum: str | None = None) -> SuiteReport:
    """Run every task on every model column `repeats` times; write the reports.

    Every (model, task, repeat) is saved as a run in the store before any is driven; then
    `executor` (default `LocalExecutor`: this process, one run after another) drives them.

    Args:
        provider, models, base_url: the columns, as `model_columns`.
        max_turns: turn cap per task.
        max_tokens: cap on each reply, tokens (None: the server's default, 512 for runner serve).
        latency_ms: delay of every scripted reply, ms (the scripted column only).
        repeats: runs per (task, model).
        executor: a `runner.fanout` executor (`RayExecutor` fans out over a Ray cluster).
        columns: the model columns as endpoints, instead of `provider`, `models`, `base_url`
            and `latency_ms` (e.g. a scripted provider that is already running).
        store_location: where the runs live: a runs directory or a postgresql:// URL (default:
            `runs_root`); the reports are written under `runs_root` either way.
        run_settings: `RunConfig` fields for every local column's runs, over the manifest's
            (`harness_settings`), e.g. ``{"on_slip": "repeat"}``.
        system_addendum: text added to the suite's system prompt for local columns, instead of
            the manifest's ``system_addendum`` (None: the manifest's; "": none).

    Raises:
        UsageError, models.ModelNotFound: as `model_columns`.
        RuntimeError: a server failed to start.
    """
    suite = load_suite()
    columns = columns or model_columns(provider, models, base_url, latency_ms, quiet)
    executor = executor or LocalExecutor()
    local = [c for c in columns if c.kind != "scripted"]
    report = SuiteReport(model=local[0].name if local else None, model_path=local[0].model_path if local else None,
                         base_url=base_url, max_turns=max_turns, results=[], models=[c.name for c in columns],
                         repeats=repeats, executor="ray" if isinstance(executor, RayExecutor) else "local",
                         first_turn_tool_choice=local[0].first_turn_tool_choice if local else "auto")
    location = store_location or str(runs_root.resolve())  # runs: this store; reports: runs_root
    jobs: dict[str, tuple[Endpoint, Task, int]] = {}
    batches = []
    for column in columns:
        run_ids = []
        harness, addendum = harness_settings(column, run_settings, system_addendum)
        for task in suite.tasks:
            for repeat in range(1, repeats + 1):
                # how `runner resume` reaches this endpoint again: a URL, or the local model to start
                config = RunConfig(**{"model": _model_for(column, task), "max_turns": max_turns,
                                      "max_tokens": max_tokens,
                                      "first_turn_tool_choice": column.first_turn_tool_choice,
                                      "base_url": column.base_url if column.kind == "url" else None,
                                      "local_model": column.model_path if column.kind == "local" else None,
                                      **harness})
                state = new_run(task.prompt, config, system=suite.system + addendum)
                fanout.create(state, location)
                jobs[state.run_id] = (column, task, repeat)
                run_ids.append(state.run_id)
        batches.append(Batch(column, run_ids))

    def result_of(state: RunState, where: str) -> TaskResult:
        column, task, repeat = jobs[state.run_id]
        return _result("scripted" if column.kind == "scripted" else "local", task, state).model_copy(
            update={"model": column.name, "repeat": repeat, "turn_ms": [round(t.ms, 1) for t in state.per_turn],
                    "driven_by": where})

    driven = executor.drive(batches, location, lambda state, where: _print_progress(result_of(state, where), quiet))
    report.results = [result_of(state, where) for state, where in driven]
    finished = {r.run_id for r in report.results}
    report.unfinished = [run_id for batch in batches for run_id in batch.run_ids if run_id not in finished]
    report.summaries = summarize(report.results)
    report.cancelled = executor.cancelled
    if local:
        report.load_average = [round(x, 2) for x in os.getloadavg()]
        report.local_turns = executor.server_turns.get(local[0].name, [])
    report.report_path = str(write_report(report, runs_root).with_suffix(".md"))
    return report


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
        if r.status == "interrupted" and (r.reason or "").startswith("cancelled"):
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


def _column_title(report: SuiteReport, model: str) -> str:
    return "scripted provider" if model == "scripted" else f"local model: {model}"


def markdown(report: SuiteReport) -> str:
    """The report as Markdown: per model column, the summary over repeats, then one line per run."""
    lines = [f"Executor: {report.executor}; {report.repeats} repeat(s) per task and model; "
             f"turn cap {report.max_turns}.", ""]
    for model in report.models or list(dict.fromkeys(r.model for r in report.results)):
        rows = [r for r in report.results if r.model == model]
        if not rows:
            continue
        lines += [f"### {_column_title(report, model)}", ""]
        if model != "scripted":
            if model == report.model:
                lines += [f"First turn sent with `tool_choice={report.first_turn_tool_choice}` (the model manifest's "
                          "`first_turn_tool_choice`); later turns `auto`."]
            if report.load_average:
                lines += [f"Load average (1/5/15 min) when it finished: "
                          f"{' / '.join(f'{x:.2f}' for x in report.load_average)}."]
            lines += [""]
        lines += ["| task | runs | pass rate | turns | tool runs | prompt tok | completion tok | cost USD | "
                  "turn ms mean | p50 | p95 |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in (s for s in report.summaries if s.model == model):
            lines.append(f"| {s.task} | {s.runs} | {s.passed}/{s.runs} ({s.pass_rate:.0%}) | {s.turns:g} | "
                         f"{s.tool_runs:g} | {s.prompt_tokens:g} | {s.completion_tokens:g} | {s.cost_usd:.6f} | "
                         f"{s.turn_ms_mean:,.1f} | {s.turn_ms_p50:,.1f} | {s.turn_ms_p95:,.1f} |")
        lines += ["", "| task | repeat | status | turns | tool runs | prompt tok | completion tok | cost USD | "
                      "wall ms | mean turn ms | correct | answer |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in rows:
            answer = _short(r.answer, 120).replace("|", "\\|")
            lines.append(f"| {r.task} | {r.repeat} | {r.status} | {r.turns} | {r.tool_runs} | {r.prompt_tokens} | "
                         f"{r.completion_tokens} | {r.cost_usd:.6f} | {r.wall_ms:,.0f} | {r.mean_turn_ms:,.0f} | "
                         f"{'yes' if r.correct else 'no'} | {answer} |")
        t = totals(rows)
        wrong = [f"{r.task}{f' #{r.repeat}' if report.repeats > 1 else ''}: {r.why_wrong}"
                 for r in rows if not r.correct and r.why_wrong]
        lines += [f"| **total** | | | {t['turns']} | {t['tool_runs']} | {t['prompt_tokens']} | "
                  f"{t['completion_tokens']} | {t['cost_usd']:.6f} | {t['wall_ms']:,.0f} | {t['mean_turn_ms']:,.0f} | "
                  f"{t['correct']}/{len(rows)} | |", "",
                  f"Tool calls: {t['calls']} in {t['tasks_with_a_call']}/{len(rows)} tasks, "
                  f"{t['invalid_calls']} malformed or unknown.", ""]
        if wrong:
            lines += ["Why wrong: " + "; ".join(wrong) + ".", ""]
        if model == report.model and report.local_turns:
            turns = report.local_turns
            per_turn = ", ".join(f"{t['prompt_eval_tokens']:.0f}/{t['cached_prompt_tokens']:.0f}" for t in turns)
            evaluated = sum(t["prompt_eval_tokens"] for t in turns)
            reused = sum(t["cached_prompt_tokens"] for t in turns)
            lines += [f"Prompt tokens per turn, evaluated/reused from the KV cache: {per_turn} "
                      f"(in all {evaluated:.0f} evaluated, {reused:.0f} reused, "
                      f"{reused / max(1, evaluated + reused):.0%} reused).", ""]
    return "\n".join(lines)


def write_report(report: SuiteReport, runs_root: Path) -> Path:
    """Write `suite-<timestamp>.json`, `.md` and (with matplotlib installed) the turn-time
    plot `.png` under `runs_root`; returns the JSON path."""
    runs_root.mkdir(parents=True, exist_ok=True)
    stem = runs_root / time.strftime("suite-%Y%m%d-%H%M%S")
    stem.with_suffix(".json").write_text(report.model_dump_json(indent=1))
    text = markdown(report)
    if report.summaries and plot_turn_ms(report, stem.with_suffix(".png")):
        text += f"\n![turn time per task and model]({stem.with_suffix('.png').name})\n"
    stem.with_suffix(".md").write_text(text)
    return stem.with_suffix(".json")


def plot_turn_ms(report: SuiteReport, path: Path) -> bool:
    """Plot turn time per task and model: a bar at the p50, a whisker to the p95 and a dot at
    the mean, over every turn of every repeat (ms, log scale). Returns False, writing nothing,
    when matplotlib is not installed (it is in the `dev` extra)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(s.model for s in report.summaries))
    tasks = list(dict.fromkeys(s.task for s in report.summaries))
    by = {(s.model, s.task): s for s in report.summaries}
    width = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(tasks) * max(1, len(models) / 2)), 4.2))
    for k, model in enumerate(models):
        xs = [i + (k - (len(models) - 1) / 2) * width for i, t in enumerate(tasks) if (model, t) in by]
        rows = [by[(model, t)] for t in tasks if (model, t) in by]
        p50 = [max(s.turn_ms_p50, 0.01) for s in rows]
        ax.bar(xs, p50, width * 0.9, label=model,
               yerr=[[0.0] * len(rows), [max(s.turn_ms_p95 - s.turn_ms_p50, 0.0) for s in rows]], capsize=3)
        ax.plot(xs, [max(s.turn_ms_mean, 0.01) for s in rows], "k.", markersize=5)
    ax.set_yscale("log")
    ax.set_xticks(range(len(tasks)), tasks, rotation=20)
    ax.set_ylabel("turn time, ms (bar p50, whisker p95, dot mean)")
    ax.set_title(f"Turn time per task and model ({report.repeats} repeat(s), executor {report.executor})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _short(text: str, limit: int) -> str:
    """One line, at most `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def print_report(report: SuiteReport) -> None:
    """A compact rich table, one line per task, the model columns' figures side by side:
    turns/tools and wall ms (means over repeats) and ok (yes/no for one run, passed/runs over
    repeats; the status instead when a run did not complete); the mean turn time of each
    column under the table. Two columns fit 80 characters and numbers are never cut: the
    local answer (of the first repeat, when there is one local column) gets the width that is
    left, shortened to fit, and is left out on a narrow terminal (the JSON and Markdown
    reports keep it whole)."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    summaries = report.summaries or summarize(report.results)
    by: dict[tuple[str, str], TaskSummary] = {(s.model, s.task): s for s in summaries}
    columns = list(dict.fromkeys(s.model for s in summaries))
    locals_ = [m for m in columns if m != "scripted"]
    tasks = list(dict.fromkeys(r.task for r in report.results))
    first = {(r.model, r.task): r for r in reversed(report.results)}

    def label(model: str) -> str:
        return "scripted" if model == "scripted" else "local" if len(locals_) == 1 else _short(model, 14)

    def build(answer_chars: int) -> Table:
        title = "runner suite" + (f"  (local model: {', '.join(locals_)}, first turn tool_choice="
                                  f"{report.first_turn_tool_choice})" if locals_ else "")
        if report.repeats > 1 or report.executor != "local":
            title += f"  [{report.repeats} repeat(s), executor {report.executor}]"
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                      caption="mean turn: " + "; ".join(
                          f"{label(m)} {totals([r for r in report.results if r.model == m])['mean_turn_ms']:,.0f} ms"
                          for m in columns), caption_justify="left")
        table.add_column("task", no_wrap=True)
        for m in columns:
            for what in ("turns/tools", "wall ms", "ok"):
                table.add_column(f"{label(m)}\n{what}", justify="left" if what == "ok" else "right", no_wrap=True)
        if answer_chars:
            table.add_column("local\nanswer", no_wrap=True)
        for task in tasks:
            row = [task]
            for m in columns:
                s = by.get((m, task))
                if s is None:
                    row += ["-"] * 3
                    continue
                ok = ("yes" if s.passed else "no") if s.runs == 1 else f"{s.passed}/{s.runs}"
                if set(s.statuses) != {"completed"}:
                    ok = next(iter(s.statuses)) if len(s.statuses) == 1 else f"{ok} mixed"
                row += [f"{s.turns:g}/{s.tool_runs:g}", f"{s.wall_ms:,.0f}", ok]
            if answer_chars:
                local = first.get((locals_[0], task))
                row.append(_short(local.answer or f"({local.reason})", answer_chars) if local else "")
            table.add_row(*row)
        total_row = ["TOTAL"]
        for m in columns:
            rows = [r for r in report.results if r.model == m]
            t = totals(rows)
            total_row += [f"{t['turns']}/{t['tool_runs']}", f"{t['wall_ms']:,.0f}", f"{t['correct']}/{len(rows)}"]
        if answer_chars:
            total_row.append("")
        table.add_row(*total_row, style="bold")
        return table

    console = Console()  # the terminal's width, else $COLUMNS, else 80
    probe = Console(file=io.StringIO(), width=1000)
    probe.print(build(0))
    numbers_width = max(len(line) for line in probe.file.getvalue().splitlines()[1:])  # type: ignore[attr-defined]
    room = console.width - numbers_width - 3
    answer_chars = room if len(locals_) == 1 and room >= 20 else 0
    console.print(build(answer_chars))
