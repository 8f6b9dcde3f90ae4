"""The six-task suite (the main job): the same harness on the scripted provider and on a
local model, side by side.

Tasks live in `tasks/suite.json` (prompt + answer check as regular expressions over the
lower-cased answer). The scripted provider answers each task with the scenario of the same
name. Each run is a normal saved run under the runs directory, so `runner trace` works on it.
Reports are written to `runs/suite-<timestamp>.json` and `.md`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel

from runner.cancel import CancelToken
from runner.chat_adapter import HANDLER_NAME
from runner.harness import execute, scripted_provider
from runner.resources import tasks_dir
from runner.state import RunConfig, RunState, new_run

Provider = Literal["scripted", "local"]
ToolChoiceSetting = Literal["auto", "required", "none"]


PROTOCOL_TEXT = re.compile(r"</?tool_(?:call|response)>|<\|im_(?:start|end)\|>")
"""Chat-protocol markup: an answer containing it pasted the transcript, it did not answer."""
ECHO_LINE_CHARS = 40
"""A tool-result line at least this long, found verbatim in an answer, makes the answer an echo."""


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
        """Grade an answer. Before the task's own patterns, two rules hold for every task: an
        answer containing chat-protocol text (`PROTOCOL_TEXT`) is wrong, and so is one that
        reproduces a tool result verbatim (`echoes`): pasting the evidence back is not an answer.

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
    """One task on one provider. Tokens are counts, cost USD, times ms."""

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


class SuiteReport(BaseModel):
    model: str | None
    """The local model's name (None when only the scripted provider ran)."""
    model_path: str | None = None
    base_url: str | None = None
    first_turn_tool_choice: ToolChoiceSetting = "auto"
    """tool_choice sent on each local task's first turn (the manifest's value for the model)."""
    load_average: list[float] | None = None
    """The machine's 1, 5 and 15 minute load averages when the local column finished."""
    local_turns: list[dict[str, float]] = []
    """Per model call of the local column, in order, from the server started for it (GET /stats):
    prompt_tokens, cached_prompt_tokens (KV reused), prompt_eval_tokens (evaluated), eval_tokens,
    prompt_eval_ms, eval_ms, handler_ms."""
    max_turns: int
    results: list[TaskResult]
    cancelled: bool = False
    """True when Ctrl-C stopped the suite: `results` holds the tasks run until then."""


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


async def _run_tasks(provider: Provider, suite: SuiteDefinition, base_url: str, model_for: dict[str, str],
                     runs_root: Path, max_turns: int, max_tokens: int | None, quiet: bool,
                     cancel: CancelToken, reach: dict[str, str], first_turn_tool_choice: ToolChoiceSetting = "auto",
                     server_settings: dict[str, Any] | None = None) -> list[TaskResult]:
    """Run the tasks one after another; Ctrl-C (SIGINT/SIGTERM) stops the running task as a
    resumable `interrupted` run and skips the rest. `reach` is recorded in each run's config
    (`base_url` or `local_model`) so `runner resume` reaches the same endpoint again."""
    results = []
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, cancel.cancel, "user pressed Stop")
    try:
        for task in suite.tasks:
            if cancel.is_cancelled:
                break
            config = RunConfig(model=model_for[task.id], max_turns=max_turns, max_tokens=max_tokens,
                               first_turn_tool_choice=first_turn_tool_choice,
                               base_url=reach.get("base_url"), local_model=reach.get("local_model"))
            state = new_run(task.prompt, config, system=suite.system)
            state = await execute(state, base_url, runs_root, cancel=cancel, server_settings=server_settings)
            result = _result(provider, task, state)
            results.append(result)
            _print_progress(result, quiet)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return results


def _print_progress(result: TaskResult, quiet: bool) -> None:
    if not quiet:
        print(f"  {result.provider:<8} {result.task:<13} {result.status:<18} turns={result.turns} "
              f"tools={result.tool_runs} ms={result.wall_ms:,.0f} correct={'yes' if result.correct else 'no'}",
              file=sys.stderr, flush=True)


@contextlib.contextmanager
def _local_endpoint(model: str | None, base_url: str | None,
                    quiet: bool) -> Iterator[tuple[str, str, str | None, ToolChoiceSetting, dict[str, Any] | None]]:
    """Yield (base URL, model name, GGUF path, first-turn tool_choice, server settings) for the
    'local' column; the settings (recorded on each run's `run_started`) are None for --base-url.

    The tool_choice is the manifest's for the model (by name, or by file name for a path);
    "auto" for a model the manifest does not know."""
    from runner import models

    if base_url:
        entry = models.entry_for(model) if model else None
        yield base_url, model or "default", None, entry.first_turn_tool_choice if entry else "auto", None
        return
    from runner import local

    name, path = models.resolve_choice(model)
    entry = models.entry_for(name, path)
    choice: ToolChoiceSetting = entry.first_turn_tool_choice if entry else "auto"
    settings = local.settings(model=path, port=0, chat_format=entry.chat_format if entry else HANDLER_NAME)
    if not quiet:
        print(f"local model: {name} ({path}); first turn tool_choice={choice}", file=sys.stderr, flush=True)
    with local.LocalServer(settings) as server:
        yield server.base_url, server.model_name, str(path), choice, server.settings.model_dump(mode="json")


def run_suite(provider: str, runs_root: Path, *, model: str | None = None, base_url: str | None = None,
              max_turns: int = 8, max_tokens: int | None = None, latency_ms: float = 0.0,
              quiet: bool = False) -> SuiteReport:
    """Run every task on `provider` ("scripted", "local" or "both"); write the reports.

    Args:
        model: local model name or GGUF path (default: Qwen if pulled, else packaged SmolLM2),
            or, with `base_url`, the model name to send.
        base_url: use this OpenAI-compatible endpoint as the local column instead of
            starting llama.cpp.
        max_turns: turn cap per task.
        max_tokens: cap on each reply, tokens (None: the server's default, 512 for runner serve).
        latency_ms: delay of every scripted reply, ms (the scripted column only).

    Raises:
        models.ModelNotFound: the named model is not on disk.
        RuntimeError: the local server failed to start.
    """
    suite = load_suite()
    report = SuiteReport(model=None, max_turns=max_turns, results=[])
    cancel = CancelToken()
    try:
        if provider in ("scripted", "both"):
            with scripted_provider(latency_ms=latency_ms) as url:
                scripted_models = {t.id: f"scripted/{t.id}" for t in suite.tasks}
                report.results += asyncio.run(_run_tasks("scripted", suite, url, scripted_models, runs_root,
                                                         max_turns, max_tokens, quiet, cancel, {}))
        if provider in ("local", "both") and not cancel.is_cancelled:
            with _local_endpoint(model, base_url, quiet) as (url, name, path, choice, settings):
                report.model, report.model_path, report.base_url = name, path, base_url
                report.first_turn_tool_choice = choice
                reach = {"base_url": base_url} if base_url else {"local_model": str(path)}
                report.results += asyncio.run(_run_tasks("local", suite, url, {t.id: name for t in suite.tasks},
                                                         runs_root, max_turns, max_tokens, quiet, cancel, reach,
                                                         choice, settings))
                report.load_average = [round(x, 2) for x in os.getloadavg()]
                if path is not None:
                    report.local_turns = _server_turns(url)
    except KeyboardInterrupt:  # Ctrl-C while a server was starting: no run was in flight
        cancel.cancel("user pressed Stop")
    report.cancelled = cancel.is_cancelled
    write_report(report, runs_root)
    return report


def _server_turns(base_url: str) -> list[dict[str, float]]:
    """The engine timings of every reply of the server we started (runner.local_app /stats)."""
    import httpx

    keys = ("prompt_tokens", "cached_prompt_tokens", "prompt_eval_tokens", "eval_tokens",
            "prompt_eval_ms", "eval_ms", "handler_ms")
    replies = httpx.get(base_url.removesuffix("/v1") + "/stats", timeout=10).json()["replies"]
    return [{k: r[k] for k in keys if k in r} for r in replies]


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


def markdown(report: SuiteReport) -> str:
    """The report as Markdown: one table per provider, then totals."""
    lines = []
    for provider in ("scripted", "local"):
        rows = [r for r in report.results if r.provider == provider]
        if not rows:
            continue
        title = "scripted provider" if provider == "scripted" else f"local model: {report.model}"
        lines += [f"### {title}", ""]
        if provider == "local":
            lines += [f"First turn sent with `tool_choice={report.first_turn_tool_choice}` (the model manifest's "
                      "`first_turn_tool_choice`); later turns `auto`."]
            if report.load_average:
                lines += [f"Load average (1/5/15 min) when it finished: "
                          f"{' / '.join(f'{x:.2f}' for x in report.load_average)}."]
            lines += [""]
        lines += ["| task | status | turns | tool runs | prompt tok | completion tok | cost USD | wall ms | mean turn ms | correct | answer |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in rows:
            answer = _short(r.answer, 120).replace("|", "\\|")
            lines.append(f"| {r.task} | {r.status} | {r.turns} | {r.tool_runs} | {r.prompt_tokens} | "
                         f"{r.completion_tokens} | {r.cost_usd:.6f} | {r.wall_ms:,.0f} | {r.mean_turn_ms:,.0f} | "
                         f"{'yes' if r.correct else 'no'} | {answer} |")
        t = totals(rows)
        wrong = [f"{r.task}: {r.why_wrong}" for r in rows if not r.correct and r.why_wrong]
        lines += [f"| **total** | | {t['turns']} | {t['tool_runs']} | {t['prompt_tokens']} | "
                  f"{t['completion_tokens']} | {t['cost_usd']:.6f} | {t['wall_ms']:,.0f} | {t['mean_turn_ms']:,.0f} | "
                  f"{t['correct']}/{len(rows)} | |", "",
                  f"Tool calls: {t['calls']} in {t['tasks_with_a_call']}/{len(rows)} tasks, "
                  f"{t['invalid_calls']} malformed or unknown.", ""]
        if wrong:
            lines += ["Why wrong: " + "; ".join(wrong) + ".", ""]
        if provider == "local" and report.local_turns:
            turns = report.local_turns
            per_turn = ", ".join(f"{t['prompt_eval_tokens']:.0f}/{t['cached_prompt_tokens']:.0f}" for t in turns)
            evaluated = sum(t["prompt_eval_tokens"] for t in turns)
            reused = sum(t["cached_prompt_tokens"] for t in turns)
            lines += [f"Prompt tokens per turn, evaluated/reused from the KV cache: {per_turn} "
                      f"(in all {evaluated:.0f} evaluated, {reused:.0f} reused, "
                      f"{reused / max(1, evaluated + reused):.0%} reused).", ""]
    return "\n".join(lines)


def write_report(report: SuiteReport, runs_root: Path) -> Path:
    """Write `suite-<timestamp>.json` and `.md` under `runs_root`; returns the JSON path."""
    runs_root.mkdir(parents=True, exist_ok=True)
    stem = runs_root / time.strftime("suite-%Y%m%d-%H%M%S")
    stem.with_suffix(".json").write_text(report.model_dump_json(indent=1))
    stem.with_suffix(".md").write_text(markdown(report))
    return stem.with_suffix(".json")


def _short(text: str, limit: int) -> str:
    """One line, at most `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def print_report(report: SuiteReport) -> None:
    """A rich table, one line per task; with both providers, their figures side by side.
    Numbers never wrap: the local answer gets the width that is left, shortened to fit,
    and is left out on a narrow terminal (the JSON and Markdown reports keep it whole)."""
    import io

    from rich.console import Console
    from rich.table import Table

    by: dict[tuple[str, str], TaskResult] = {(r.provider, r.task): r for r in report.results}
    providers = [p for p in ("scripted", "local") if any(r.provider == p for r in report.results)]
    tasks = list(dict.fromkeys(r.task for r in report.results))

    def build(answer_chars: int) -> Table:
        local_note = f"  (local model: {report.model}, first turn tool_choice={report.first_turn_tool_choice})"
        table = Table(title="runner suite" + (local_note if report.model else ""),
                      title_justify="left")
        table.add_column("task", no_wrap=True)
        for p in providers:
            table.add_column(f"{p}\nturns/tools", justify="right", no_wrap=True)
            table.add_column(f"{p}\nwall ms", justify="right", no_wrap=True)
            table.add_column(f"{p}\nstatus", no_wrap=True)
            table.add_column(f"{p}\nok", no_wrap=True)
        if answer_chars:
            table.add_column("local\nanswer", no_wrap=True)
        for task in tasks:
            row = [task]
            for p in providers:
                r = by.get((p, task))
                row += ([f"{r.turns}/{r.tool_runs}", f"{r.wall_ms:,.0f}", r.status, "yes" if r.correct else "no"]
                        if r else ["-"] * 4)
            if answer_chars:
                local = by.get(("local", task))
                row.append(_short(local.answer or f"({local.reason})", answer_chars) if local else "")
            table.add_row(*row)
        total_row = ["TOTAL"]
        for p in providers:
            t = totals([r for r in report.results if r.provider == p])
            total_row += [f"{t['turns']}/{t['tool_runs']}", f"{t['wall_ms']:,.0f}",
                          f"{t['mean_turn_ms']:,.0f} ms/turn", f"{t['correct']}/{len(tasks)}"]
        if answer_chars:
            total_row.append("")
        table.add_row(*total_row, style="bold")
        return table

    console = Console()  # the terminal's width, else $COLUMNS, else 80
    probe = Console(file=io.StringIO(), width=1000)
    probe.print(build(0))
    numbers_width = max(len(line) for line in probe.file.getvalue().splitlines()[1:])  # type: ignore[attr-defined]
    room = console.width - numbers_width - 3
    answer_chars = room if "local" in providers and room >= 20 else 0
    console.print(build(answer_chars))
