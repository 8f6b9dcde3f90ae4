"""A suite's reports: the live line per finished task, the terminal table with its scores, the
Markdown report with its turn-time plot, and what a cancelled suite says."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.render.runs import short_model
from runner.render.terminal import print_unpadded, say

if TYPE_CHECKING:
    from runner.result import RunResult
    from runner.suite import SuiteReport, TaskResult, TaskSummary


def progress_line(result: TaskResult) -> str:
    """One finished suite task, 74 characters (more for a run that did not complete): one line in
    an 80-column terminal. The model by the part of its name that tells models apart."""
    status = "" if result.status == "completed" else f" {result.status}"
    return (f"  {_short(short_model(result.model), 18):<18} {result.task:<12} #{result.repeat:<2} turns={result.turns:<2} "
            f"tools={result.tool_runs:<2} {result.wall_ms:>7,.0f} ms  ok={'yes' if result.correct else 'no'}{status}")


def _column_title(report: SuiteReport, model: str) -> str:
    return "scripted provider" if model == "scripted" else f"local model: {model}"


def markdown(report: SuiteReport) -> str:
    """The report as Markdown: a title, the date, the models and the settings; per model column,
    the summary over repeats, then one line per run with its id."""
    names = report.models or list(dict.fromkeys(r.model for r in report.results))
    lines = [f"# Suite report: {', '.join(names)}", "",
             f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
             + (" (cancelled: the runs finished before Ctrl-C)" if report.cancelled else "") + ". "
             f"Executor: {report.executor}; {report.repeats} repeat(s) per task and model; "
             f"turn cap {report.max_turns}. Each run shows with `runner show RUN_ID`.", ""]
    if report.suites:
        lines += ["Suites: " + ", ".join(f"{x.name} ({x.split or 'no split'}, {x.tasks} tasks)" for x in report.suites)
                  + ".", ""]
    scored = score_lines(report)
    if scored:
        lines += [scored[0], "", *[f"- {line.strip()}" for line in scored[1:]], ""]
    if report.unfinished:
        lines += [f"Not finished ({len(report.unfinished)}; `runner suite --resume` on the JSON report drives them): "
                  + ", ".join(f"`{r}`" for r in report.unfinished) + ".", ""]
    for model in names:
        rows = [r for r in report.results if r.model == model]
        if rows:
            lines += [*_column_head(report, model), *_summary_rows(report, model), *_run_rows(report, model, rows)]
    return "\n".join(lines)


def _column_head(report: SuiteReport, model: str) -> list[str]:
    lines = [f"### {_column_title(report, model)}", ""]
    if model != "scripted":
        if model == report.model:
            lines += [f"First turn sent with `tool_choice={report.first_turn_tool_choice}`; later turns `auto` "
                      "unless a policy says otherwise."]
        if report.policies.get(model) is not None:
            lines += ["", "Steering policies: " + (", ".join(f"`{p}`" for p in report.policies[model]) or "none") + "."]
        if report.load_average:
            lines += [f"Load average (1/5/15 min) when it finished: "
                      f"{' / '.join(f'{x:.2f}' for x in report.load_average)}."]
        lines += [""]
    return lines


def _summary_rows(report: SuiteReport, model: str) -> list[str]:
    """The per-task summary of one column: means per run over the repeats."""
    lines = ["| task | runs | pass rate | turns | tool runs | prompt tok | completion tok | cost USD | "
             "turn ms mean | p50 | p95 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in (s for s in report.summaries if s.model == model):
        lines.append(f"| {s.task} | {s.runs} | {s.passed}/{s.runs} ({s.pass_rate:.0%}) | {s.turns:g} | "
                     f"{s.tool_runs:g} | {s.prompt_tokens:g} | {s.completion_tokens:g} | {s.cost_usd:.6f} | "
                     f"{s.turn_ms_mean:,.1f} | {s.turn_ms_p50:,.1f} | {s.turn_ms_p95:,.1f} |")
    return lines


def _run_rows(report: SuiteReport, model: str, rows: Sequence[TaskResult]) -> list[str]:
    """One line per run of a column, a total row, the tool calls, why answers were wrong, and
    the KV cache's reuse."""
    from runner.suite import totals

    lines = ["", "The rows above are means per run over the repeats. Below, one line per run; its **total** "
                 "row sums the runs (turns, tool runs, tokens, cost, wall ms), the mean turn ms is over every "
                 "turn, and correct counts the runs.",
             "", "| task | repeat | run id | status | turns | tool runs | prompt tok | completion tok | cost USD | "
                 "wall ms | mean turn ms | correct | answer |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        answer = _short(r.answer, 120).replace("|", "\\|")
        lines.append(f"| {r.task} | {r.repeat} | `{r.run_id}` | {r.status} | {r.turns} | {r.tool_runs} | "
                     f"{r.prompt_tokens} | {r.completion_tokens} | {r.cost_usd:.6f} | {r.wall_ms:,.0f} | "
                     f"{r.mean_turn_ms:,.0f} | {'yes' if r.correct else 'no'} | {answer} |")
    t = totals(list(rows))
    wrong = [f"{r.task}{f' #{r.repeat}' if report.repeats > 1 else ''}: {r.why_wrong}"
             for r in rows if not r.correct and r.why_wrong]
    lines += [f"| **total** | | | | {t['turns']} | {t['tool_runs']} | {t['prompt_tokens']} | "
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
    lines += engine_summary(list(rows))
    return lines


def engine_summary(rows: Sequence[RunResult]) -> list[str]:
    """One paragraph on where the local engine's time went over `rows`' turns (prompt tokens
    reused and evaluated, prompt and generation ms, tokens/s, drafts); [] without engine timings."""
    timed = [r for r in rows if r.per_turn_engine and all(e is not None for e in r.per_turn_engine)]
    engines = [e for r in timed for e in r.per_turn_engine if e is not None]
    if not engines:
        return []
    generated = sum(r.completion_tokens for r in timed)
    gen_ms = sum(e.gen_ms for e in engines)
    prompt_ms = sum(e.prompt_ms for e in engines)
    evaluated = sum(e.prompt_evaluated for e in engines)
    reused = sum(e.prompt_reused for e in engines)
    line = (f"Engine over {len(engines)} turns: prompt {reused:,} tokens reused + {evaluated:,} evaluated in "
            f"{prompt_ms:,.0f} ms ({evaluated / max(prompt_ms, 1e-9) * 1000:.1f} tok/s); {generated:,} tokens "
            f"generated in {gen_ms:,.0f} ms ({generated / max(gen_ms, 1e-9) * 1000:.1f} tok/s)")
    proposed = sum(e.draft_proposed or 0 for e in engines)
    if proposed:
        accepted = sum(e.draft_accepted or 0 for e in engines)
        line += f"; drafts {accepted:,}/{proposed:,} accepted ({accepted / proposed:.0%})"
    return [line + ".", ""]


def write_suite_report(report: SuiteReport, runs_root: Path) -> Path:
    """Write `suite-<timestamp>.json`, `.md` and (with matplotlib installed) the turn-time
    plot `.png` under `runs_root`; sets `report.report_path` (the Markdown file) and returns the
    JSON path."""
    runs_root.mkdir(parents=True, exist_ok=True)
    stem = runs_root / time.strftime("suite-%Y%m%d-%H%M%S")
    report.report_path = str(stem.with_suffix(".md"))
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


def print_suite(report: SuiteReport) -> None:
    """A compact rich table, one line per task, the model columns' figures side by side:
    turns/tools and wall ms (means over repeats) and ok (yes/no for one run, passed/runs over
    repeats; the status instead when a run did not complete); the mean turn time of each
    column under the table. Two columns fit 80 characters and numbers are never cut: the
    local answer (of the first repeat, when there is one local column) gets the width that is
    left, shortened to fit, and is left out on a narrow terminal (the JSON and Markdown
    reports keep it whole)."""
    import io

    from rich.console import Console

    shape = _SuiteShape.of(report)
    out = Console()  # the terminal's width, else $COLUMNS, else 80
    probe = Console(file=io.StringIO(), width=1000)
    probe.print(_suite_table(report, shape, 0))
    numbers_width = max(len(line) for line in probe.file.getvalue().splitlines()[1:])  # type: ignore[attr-defined]
    room = out.width - numbers_width - 3
    print_unpadded(out, _suite_table(report, shape, room if len(shape.locals_) == 1 and room >= 20 else 0))
    for line in score_lines(report):
        print(line)


def score_lines(report: SuiteReport) -> list[str]:
    """Per model column and split (or suite): correct, wrong and abstained of N, with the
    correct rate's 95% Wilson interval; then per task shape, with the end states graded right
    and the files damaged, when the tasks are not all questions. Nothing for a suite of
    questions on the scripted column alone."""
    from runner.suite import scores

    rows = report.scores or scores(report.results)
    if not [r for r in rows if r.model != "scripted"] and not report.shapes:
        return []
    lines = ["correct / wrong / abstained (says it is not there), 95% interval of correct:"]
    for r in rows:
        lines.append(f"  {_short(short_model(r.model), 18):<18} {r.split:<9} {r.correct:>3}/{r.n:<3} "
                     f"({r.correct / r.n:.0%}, {r.correct_low:.0%}-{r.correct_high:.0%})  {r.wrong} wrong  "
                     f"{r.abstained} abstained")
    for r in report.shapes:  # per task shape, when the tasks are not all questions
        lines.append(f"  {_short(short_model(r.model), 18):<18} {r.split:<9} {r.shape + ':':<9} {r.correct:>3}/{r.n:<3} "
                     f"{r.wrong} wrong  {r.abstained} abstained")
        if r.end_state_graded:
            lines.append(f"    {r.shape}: end state right {r.end_state_right}/{r.end_state_graded}, "
                         f"{r.files_damaged} files damaged")
    return lines


@dataclass(frozen=True)
class _SuiteShape:
    """What the suite table shows: summaries by (model, task), the model columns, the local
    ones, the tasks, and each (model, task)'s first run."""

    by: dict[tuple[str, str], TaskSummary]
    columns: list[str]
    locals_: list[str]
    tasks: list[str]
    first: dict[tuple[str, str], TaskResult]

    @classmethod
    def of(cls, report: SuiteReport) -> _SuiteShape:
        from runner.suite import summarize

        summaries = report.summaries or summarize(report.results)
        columns = list(dict.fromkeys(s.model for s in summaries))
        return cls({(s.model, s.task): s for s in summaries}, columns, [m for m in columns if m != "scripted"],
                   list(dict.fromkeys(r.task for r in report.results)),
                   {(r.model, r.task): r for r in reversed(report.results)})

    def label(self, model: str) -> str:
        return "scripted" if model == "scripted" else "local" if len(self.locals_) == 1 else _short(model, 14)


def _suite_table(report: SuiteReport, shape: _SuiteShape, answer_chars: int) -> Any:
    from rich import box
    from rich.table import Table

    from runner.suite import totals

    named = [x.name for x in report.suites if x.name != "six-task"]
    title = "runner suite" + (f" {', '.join(named)}" if named and len(named) <= 2 else
                              f" ({len(named)} suites)" if named else "")
    if report.repeats > 1 or report.executor != "local":
        title += f"  [{report.repeats} repeat(s), executor {report.executor}]"
    if shape.locals_:  # a line of its own: with a long model name it would wrap anywhere
        title += f"\nlocal model: {', '.join(shape.locals_)}, first turn tool_choice={report.first_turn_tool_choice}"
    mean_turns = "; ".join(f"{shape.label(m)} {totals([r for r in report.results if r.model == m])['mean_turn_ms']:,.0f} ms"
                           for m in shape.columns)
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  caption=(f"rows: means of {report.repeats} repeats (ok: passed/runs)\n"
                           "TOTAL: the sum of the rows\n" if report.repeats > 1 else "") + "mean turn: " + mean_turns,
                  caption_justify="left")
    table.add_column("task", no_wrap=True)
    for m in shape.columns:
        for what in ("turns/tools", "wall ms", "ok"):
            table.add_column(f"{shape.label(m)}\n{what}", justify="left" if what == "ok" else "right", no_wrap=True)
    if answer_chars:
        table.add_column("local\nanswer", no_wrap=True)
    for task in shape.tasks:
        table.add_row(*_suite_row(shape, task, answer_chars))
    total_row = ["TOTAL"]  # the sum of the rows above (means per run when repeated), so it adds up
    for m in shape.columns:
        shown = [shape.by[(m, task)] for task in shape.tasks if (m, task) in shape.by]
        total_row += [f"{sum(s.turns for s in shown):g}/{sum(s.tool_runs for s in shown):g}",
                      f"{sum(s.wall_ms for s in shown):,.0f}",
                      f"{sum(s.passed for s in shown)}/{sum(s.runs for s in shown)}"]
    table.add_row(*total_row, *([""] if answer_chars else []), style="bold")
    return table


def _suite_row(shape: _SuiteShape, task: str, answer_chars: int) -> list[str]:
    row = [task]
    for m in shape.columns:
        s = shape.by.get((m, task))
        if s is None:
            row += ["-"] * 3
            continue
        ok = ("yes" if s.passed else "no") if s.runs == 1 else f"{s.passed}/{s.runs}"
        if set(s.statuses) != {"completed"}:
            ok = next(iter(s.statuses)) if len(s.statuses) == 1 else f"{ok} mixed"
        row += [f"{s.turns:g}/{s.tool_runs:g}", f"{s.wall_ms:,.0f}", ok]
    if answer_chars:
        local = shape.first.get((shape.locals_[0], task))
        row.append(_short(local.answer or f"({local.reason})", answer_chars) if local else "")
    return row


def suite_cancelled(report: SuiteReport, store_opts: str = "") -> str:
    """What a cancelled suite says: how many runs it finished and how to finish the rest
    (`store_opts`: see `store_options`)."""
    stopped = [r for r in report.results if r.status != "completed" and r.status != "failed"]
    finish = (f"; finish the suite with: runner suite --resume {Path(report.report_path).with_suffix('.json')}"
              if report.report_path else "")
    unfinished = report.unfinished
    return (f"suite cancelled after {len(report.results)} run(s); the report above holds them{finish}"
            + "".join(f"; resume {r.task} with: runner resume {r.run_id}{store_opts}" for r in stopped)
            + (f"; {len(unfinished)} run(s) not finished, each continues with runner resume ID{store_opts}: "
               + " ".join(unfinished[:5]) + (" …" if len(unfinished) > 5 else "")
               + " (all in the JSON report)" if unfinished else ""))


def suite_done(report: SuiteReport, as_json: bool, store_opts: str = "") -> None:
    """The end of `runner suite`: the report (the table, or with `as_json` the whole report as
    JSON), where its files are, and for a cancelled suite how to finish it (stderr)."""
    if as_json:
        print(report.model_dump_json())
    else:
        print_suite(report)
        say(f"report: {report.report_path} (.json, .png beside it)")
    if report.cancelled:
        say(suite_cancelled(report, store_opts))
