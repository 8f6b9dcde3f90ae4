"""Everything runner shows a person: tables fitted to the terminal, a run at its stop, the live
per-turn line, and the suite's reports (a terminal table, Markdown, a turn-time plot); and what
each command prints at its end, text or `--json` (stdout: the result; stderr: `say`).

The library never prints: it returns data or reports through callbacks, and the CLI hands what
it gets to the functions here. One helper, `print_table`, fits every table to the terminal
(80 columns when piped, or `$COLUMNS`): ids and numbers are never cut, text is, with "…".
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.interactive import Feedback
    from runner.models import ModelStatus
    from runner.otel import ExportReport
    from runner.result import RunResult
    from runner.start import Started
    from runner.state import Message, RunConfig, RunState, TurnRecord
    from runner.store import RepairReport, RunInfo, RunStore
    from runner.suite import SuiteReport, TaskResult, TaskSummary
    from runner.trace import TraceEvent
    from runner.worker import WorkerReport


def console() -> Any:
    """A rich console for stdout: the terminal's width, else $COLUMNS, else 80 when piped.
    Tables shorten their text columns to fit and never wrap a number (`--json` has it all)."""
    from rich.console import Console

    return Console()


def terminal_width() -> int:
    """The terminal's width in columns ($COLUMNS, else 80 when piped)."""
    return shutil.get_terminal_size((80, 24)).columns


def stderr_width() -> int | None:
    """The width lines on stderr wrap to: its terminal's ($COLUMNS when set, at least 40);
    None when stderr is not a terminal (a file, a pipe): there a message stays on one line,
    whole for grep and for logs."""
    if not sys.stderr.isatty():
        return None
    given = os.environ.get("COLUMNS", "")
    try:
        columns = int(given) if given.isdigit() else os.get_terminal_size(sys.stderr.fileno()).columns
    except OSError:
        columns = 80
    return max(columns or 80, 40)


def error(message: str) -> None:
    """An error on stderr as "error: MESSAGE", each line as `wrap` gives it (not wrapped when
    stderr is no terminal); a line break in the message starts a new paragraph, indented two
    columns."""
    for i, part in enumerate(f"error: {message}".splitlines() or [""]):
        print(wrap(part if i == 0 else "  " + part), file=sys.stderr, flush=True)


def say(line: str) -> None:
    """One line on stderr (progress and notices; stdout carries the result)."""
    print(line, file=sys.stderr, flush=True)


def wrap(line: str, width: int | None = None) -> str:
    """`line` unchanged if it fits in `width` columns (default: stderr's, see `stderr_width`;
    unchanged when stderr is no terminal), else wrapped to it with continuation lines indented
    two columns (a word longer than the width, a path or a URL, stays whole)."""
    width = width or stderr_width()
    if width is None or len(line) <= width:
        return line
    indent = " " * (len(line) - len(line.lstrip(" ")))
    return textwrap.fill(line, width, initial_indent="", subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False)


def print_table(columns: list[tuple[str, str]], rows: list[list[str]]) -> None:
    """Print a compact table that fits the console. Each column is (header, kind): "id" and
    "num" cells are never cut or wrapped; "text" columns share the width that is left, each
    taking no more than its longest cell needs so the others get the rest, cut at the end
    with "…" ("path": cut at the start, where names differ least), and the rightmost goes
    first when one would get fewer than 8 characters it needs. When the whole cells still do
    not fit, the other columns go too, rightmost first; the first column (a row's id) always
    stays, whole, even wider than the console."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    def build(keep: list[int], widths: dict[int, int]) -> Table:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0), collapse_padding=True)
        for i in keep:
            header, kind = columns[i]
            table.add_column(header, no_wrap=True, width=widths.get(i), justify="right" if kind == "num" else "left")
        for row in rows:
            table.add_row(*(cut(row[i], widths.get(i, len(row[i])), columns[i][1]) for i in keep))
        return table

    def width_of(table: Table) -> int:
        probe = Console(file=io.StringIO(), width=10_000)
        probe.print(table)
        return max(len(line.rstrip()) for line in probe.file.getvalue().splitlines())  # type: ignore[attr-defined]

    need = {i: max([len(columns[i][0]), *(len(row[i]) for row in rows)]) for i in range(len(columns))}

    def shared(texts: list[int], room: int) -> dict[int, int]:
        """`room` columns over `texts`, the narrowest needs served first."""
        widths: dict[int, int] = {}
        for n, i in enumerate(sorted(texts, key=need.__getitem__)):
            widths[i] = max(1, min(need[i], room // (len(texts) - n)))
            room -= widths[i]
        return widths

    out = console()
    keep = list(range(len(columns)))
    widths: dict[int, int] = {}
    while True:
        texts = [i for i in keep if columns[i][1] in ("text", "path")]
        if not texts:
            break
        widths = shared(texts, out.width - width_of(build(keep, dict.fromkeys(texts, 1))) + len(texts))
        if all(widths[i] >= min(8, need[i]) for i in texts):
            break
        keep.remove(texts[-1])
    while len(keep) > 1 and width_of(build(keep, widths)) > out.width:
        keep.pop()
    out.width = max(out.width, width_of(build(keep, widths)))  # one id wider than the console: whole
    print_unpadded(out, build(keep, widths))


def cut(cell: str, share: int, kind: str = "text") -> str:
    """`cell` in at most `share` characters: "text" cut at the end with "…", "path" at the
    start (where names differ least); other kinds are never cut."""
    if kind not in ("text", "path") or len(cell) <= share:
        return cell
    if share <= 1:
        return "…"
    return "…" + cell[-(share - 1):] if kind == "path" else cell[: share - 1] + "…"


class TurnLine:
    """The live per-turn line on stderr: turn N, elapsed, tokens so far and the
    reply's tail, redrawn as chunks stream in on a terminal (one line, fitted to its width);
    elsewhere one line per finished turn. `close()` ends a line left open by a turn that
    failed or was interrupted, so what is printed next starts on a line of its own."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.width = terminal_width()
        self.drawn_at = 0.0
        self.open = False

    def __call__(self, p: Any) -> None:
        head = f"  turn {p.turn:<2} {p.elapsed_ms / 1000:5.1f} s  {p.tokens:>4} tokens"
        room = self.width - len(head) - 5  # one line, or the \r redraw leaves wrapped rows behind
        text = " ".join(p.text.split())
        tail = ("…" + text[-(room - 1):] if len(text) > room else text) if room > 8 else ""
        line = head + (f'  "{tail}"' if tail else "")
        if not self.tty:
            if p.done:
                print(line, file=sys.stderr, flush=True)
            return
        now = time.perf_counter()
        if p.done or now - self.drawn_at >= 0.1:
            self.drawn_at = now
            sys.stderr.write("\r\x1b[2K" + line + ("\n" if p.done else ""))
            sys.stderr.flush()
            self.open = not p.done

    def close(self) -> None:
        if self.open:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.open = False


class PullLine:
    """Progress of a parts pull on stderr: one redrawn line on a terminal, else a line per part."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.label = ""
        self.drawn_at = 0.0

    def __call__(self, done_bytes: int, total_bytes: int, label: str) -> None:
        line = f"  {done_bytes / 1e6:7.0f} of {total_bytes / 1e6:.0f} MB  {label}"
        if not self.tty:
            if not label.startswith("unpacking"):
                print(line, file=sys.stderr, flush=True)
            return
        now = time.perf_counter()
        if label != self.label or now - self.drawn_at >= 0.2:
            self.label, self.drawn_at = label, now
            sys.stderr.write("\r\x1b[2K" + line[: terminal_width() - 1])
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty and self.label:
            sys.stderr.write("\n")
            sys.stderr.flush()

    def __enter__(self) -> PullLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_lines(state: RunState, trace_at: str, width: int = 80, store_opts: str = "") -> list[str]:
    """A stopped run for a person: the figures, the answer, where its trace is, and how to
    continue it when it can be continued (`trace_at`: a path or the command that prints it;
    `store_opts`: see `store_options`).
    Lines longer than `width` wrap, indented; ids, paths and commands are never split."""
    name = state.config.endpoint.model.removeprefix("scripted/")
    lines = [f"{name}  status={state.status}  turns={state.turns}  tools={state.tool_run_count}",
             f"   tokens in={state.prompt_tokens:,} out={state.completion_tokens:,}  cost=${state.cost_usd:.6f}"
             f"  ms={state.wall_ms:,.0f}"]
    if state.answer and "\n" in state.answer.strip():  # paragraphs, lists, code: as written
        lines += ["   answer:", *(f"     {line}".rstrip() for line in state.answer.strip().splitlines())]
    elif state.answer:
        lines.append(f"   answer: {json.dumps(state.answer.strip(), ensure_ascii=False)}")
    if state.per_turn:
        counts = [str(t.prompt_tokens) for t in state.per_turn]
        more = ""
        if len(counts) > 8:  # one line: the first and last turns (`runner show` and --json have all)
            counts, more = [*counts[:3], "…", *counts[-3:]], f" ({len(state.per_turn)} turns)"
        lines.append("   per-turn prompt tokens: " + ", ".join(counts) + more)
    lines += [f"   run id: {state.run_id}", f"   trace: {trace_at}"]
    copy = Path(trace_at).parent / "workspace"
    if state.config.workspace and state.config.sandbox == "copy" and copy.is_dir():
        lines.append(f"   the tools worked on a copy of {state.config.workspace} (left unchanged): {copy}")
    if state.status not in ("completed",):
        lines.append(f"   stopped: {state.reason}")
    lines += [f"   {line}" for line in next_steps(state, store_opts)]
    return [part for line in lines for part in _wrapped(line, width)]


def _wrapped(line: str, width: int, indent: str = "      ") -> list[str]:
    """`line` wrapped at `width` with a hanging indent; words (ids, paths) are never split,
    nor is a shell-quoted word ('a path with spaces'). A line that gives a command or a path
    to copy ("resume with: runner resume ID ...", "trace: PATH") is never broken inside it:
    too long, its label goes on a line of its own and the command whole on the next."""
    if len(line) <= width:
        return [line]
    if copyable := _COPYABLE.match(line):
        lead, label, command = copyable.groups()
        return [lead + label, lead + "  " + command]
    glued = re.sub(r"'[^']*'", lambda quoted: quoted.group().replace(" ", _GLUE), line)
    return [part.replace(_GLUE, " ") for part in textwrap.wrap(
        glued, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)]


_COPYABLE = re.compile(r"^(\s*)([a-z].*?:)\s+((?:runner |/|~|\.{1,2}/).*)$")
"""A line whose text after its label is a command or a path to copy."""

_GLUE = "\ue000"
"""Stands for a space inside a quoted word while a line is wrapped (a private-use character)."""


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


def print_policies(as_json: bool) -> None:
    """`runner policies`: each policy and what it does, then the policies of each manifest
    model (with answer_forcing's number of tool turns), then the server policies of `runner
    serve --steer` and each model's default set of them."""
    import json

    from runner import models, policies
    from runner.serve_steering import DEFAULT_ANSWER_AFTER_TURNS, SERVER_POLICIES

    entries = models.load_manifest().models
    by_model = {entry.name: policies.active_for_entry(entry) for entry in entries}
    forcing = {entry.name: entry.answer_after_tool_turns for entry in entries}
    served = {entry.name: entry.serve_policies for entry in entries}
    if as_json:
        print(json.dumps({"policies": policies.POLICIES, "models": by_model, "answer_after_tool_turns": forcing,
                          "serve_policies": SERVER_POLICIES, "serve_models": served}, indent=2))
        return
    import shutil
    import textwrap

    width = min(shutil.get_terminal_size((80, 24)).columns, 100)

    def described(items: dict[str, str]) -> None:
        for name, what in items.items():
            print(name)
            for line in what.splitlines():
                hang = "  " if line.startswith("- ") else ""
                print(textwrap.fill(line, width, initial_indent="    ", subsequent_indent="    " + hang))
        print()

    def model_line(model: str, names: str) -> None:
        print(textwrap.fill(f"{model}: {names or 'none'}", width, subsequent_indent="    "))

    described(policies.POLICIES)
    for model, names in by_model.items():
        turns = forcing[model]
        shown = [n + (f" (after {turns} tool turn{'s' if turns != 1 else ''})" if n == "answer_forcing" and turns else "")
                 for n in policies.POLICIES if n in names]
        model_line(model, ", ".join(shown))
    print()
    print(textwrap.fill("The server policies of runner serve --steer: on applies them all, default each model's "
                        "set below, off none.", width))
    print()
    described(SERVER_POLICIES)
    for model, names in served.items():
        after = forcing[model] or DEFAULT_ANSWER_AFTER_TURNS
        model_line(model, ", ".join(n + (f" (N={after})" if n == "answer_after_turns" else "") for n in names))


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

def print_unpadded(out: Any, renderable: Any) -> None:
    """Print a rich renderable (a table) through the console `out`, without the spaces rich
    pads each line with to the table's width."""
    with out.capture() as captured:
        out.print(renderable)
    print("".join(line.rstrip() + "\n" for line in captured.get().splitlines()), end="")


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


# --- a run as a person reads it: `runner show`, the runs table's model names, `runs --totals` ---

RESULT_LINES = 6
"""Lines of a tool result (and of the system prompt) shown without --full."""
ANSWER_LINES = 4
"""Lines of the answer repeated at the end of a transcript (the whole reply is in its turn)."""


def fit(line: str, width: int) -> str:
    """`line` cut to `width` characters, ending in "…" when cut."""
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def when(ts: float) -> str:
    """A Unix time as "YYYY-MM-DD HH:MM" in UTC."""
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def store_options(location: str | Path) -> str:
    """See `runner.store.store_options`: the options a printed command needs to find a store."""
    from runner.store import store_options as options

    return options(location)


def _shown(url: str) -> str:
    """A store's URL as it may be printed (its password as ***)."""
    from runner.store import shown_url

    return shown_url(url)


def resume_target(state: RunState, store_opts: str = "") -> str:
    """What follows `runner resume` in a command printed for this run: its id, the options that
    find its store, and `--api-key KEY` for a run given its key on the command line."""
    return state.run_id + store_opts + (" --api-key KEY" if state.config.endpoint.api_key_given else "")


def next_steps(state: RunState, store_opts: str = "") -> list[str]:
    """What a person can do next with a stopped run, one line each (empty when it is final);
    `store_opts` (see `store_options`) goes into every command."""
    rid = resume_target(state, store_opts)
    it = state.interruption
    if it is not None and it.type == "approval" and it.call_id in state.approved:
        return [f"approved: {it.tool_name}({json.dumps(it.args)})  call id {it.call_id}; a resume carries it out",
                f"resume with: runner resume {rid}"]
    if it is not None and it.type == "approval":
        return [f"waiting for approval: {it.tool_name}({json.dumps(it.args)})  call id {it.call_id}"
                + ("  [in doubt: it may already have run]" if it.in_doubt else ""),
                f"approve with: runner resume {rid} --approve {it.call_id}",
                f"reject with:  runner resume {rid} --reject {it.call_id} --reason TEXT"]
    if state.status == "max_turns_exceeded":
        return [f"resume with N > {state.turns} (0: no cap): runner resume {rid} --max-turns N"]
    if state.status == "budget_exceeded":
        budget = it if it is not None and it.type == "max_budget" else None
        if budget is not None and budget.limit_tokens is not None:
            spent = budget.used_tokens if budget.used_tokens is not None else budget.limit_tokens
            least = f"N >= {budget.needs_tokens:,}" if budget.needs_tokens else f"N > {spent:,}"
            return [f"resume with {least} (0: no cap): runner resume {rid} --max-tokens-total N"]
        if budget is not None and budget.limit_wall_s is not None:
            return [f"resume with S > {state.wall_ms / 1000:.1f} (0: no cap): runner resume {rid} --max-wall-s S"]
        needs = budget.needs_usd if budget is not None and budget.needs_usd else None
        least = f"USD >= {needs:.6f}" if needs else f"USD > {state.cost_usd:.6f}"
        return [f"resume with {least} (0: no budget): runner resume {rid} --max-budget USD"]
    if state.status in ("interrupted", "running"):
        moved = it is not None and it.type == "provider_unavailable" and state.config.endpoint.kind == "url"
        return [f"resume with: runner resume {rid}"] + (
            [f"if the provider moved: runner resume {rid} --base-url URL"] if moved else [])
    return []


def _turns(state: RunState) -> list[TurnRecord]:
    """The turn record of each kept assistant message, in order (slipped replies were not kept)."""
    return [t for t in state.per_turn if t.slip is None]


def _verdicts(events: Sequence[TraceEvent]) -> dict[str, str]:
    """call id -> the operator's verdict in words."""
    out: dict[str, str] = {}
    for e in events:
        if e.type == "verdict":
            out[e.callId] = (f"approved by {e.by}" if e.verdict == "approve"
                             else f"rejected by {e.by}: {e.reason or 'no reason given'}")
    return out


def answered_by(events: Sequence[TraceEvent]) -> dict[str, str]:
    """call id -> the MCP server that answered it, in words ("time (mcp-time 2026.10.19)"):
    the last `mcp_call` of the call, and what that server called itself when it started."""
    servers: dict[str, str] = {}
    out: dict[str, str] = {}
    for e in events:
        if e.type == "mcp_server_started":
            about = " ".join(part for part in (e.serverName, e.serverVersion) if part)
            servers[e.server] = f"{e.server} ({about})" if about else e.server
        elif e.type == "mcp_call":
            out[e.callId] = servers.get(e.server, e.server)
    return out


def _args(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments or "{}"), ensure_ascii=False)
    except json.JSONDecodeError:
        return arguments


def _body(text: str, width: int, full: bool, indent: str, *, wrap: bool = False, capped: bool = True,
          keep_last: bool = False) -> list[str]:
    """`text` indented: wrapped to `width` (prose) or each line cut to it (tool output); at most
    `RESULT_LINES` lines when `capped` and not `full`, and then, when `keep_last`, the text's
    last line after the cut as well (where runner's own messages say what they ask)."""
    def split(line: str) -> list[str]:
        return (textwrap.wrap(line, max(width - len(indent), 20), break_on_hyphens=False) or [""]) if wrap else [line]

    originals = text.splitlines() or [""]
    lines = [part for line in originals for part in split(line)]
    tail = split(originals[-1]) if keep_last and not full else []
    shown = lines if full or not capped or len(lines) <= RESULT_LINES + len(tail) else lines[:RESULT_LINES]
    tail = tail if len(shown) < len(lines) else []
    out = [indent + line if full else fit(indent + line, width) for line in shown]
    if len(shown) < len(lines):
        more = len(lines) - len(shown) - len(tail)
        out.append(f"{indent}… {more} more line{'s' if more != 1 else ''} (--full shows all)")
    return out + [fit(indent + line, width) for line in tail]


def run_header(state: RunState, shown: str | None = None) -> list[str]:
    """Three lines: the run, its model and status (`shown`, the status `runner runs` shows,
    else the state's); when it started, turns, tool runs and wall time; tokens and cost."""
    tools = state.tool_run_count
    return [f"run {state.run_id}  {state.config.endpoint.model}  {shown or state.status}",
            f"started {when(state.created_at)} UTC · {state.turns} turn{'s' * (state.turns != 1)} · "
            f"{tools} tool run{'s' * (tools != 1)} · {state.wall_ms / 1000:.1f} s",
            f"tokens {state.prompt_tokens:,} in / {state.completion_tokens:,} out · cost ${state.cost_usd:.6f}"]


def folder_line(config: RunConfig) -> str:
    """Which folder a run's tools work on, and whether on a copy of it."""
    where = config.workspace or "the packaged demo folder"
    how = {"copy": "its tools work on a copy", "none": "its tools act on it, writes after a verdict"}[config.sandbox]
    return f"folder {where} · {how}"


def _heading(m: Message, alone: bool, afresh: bool, width: int) -> list[str]:
    """The rule above a system or user message: who wrote it, and for runner's own, whether it
    went with the conversation, `alone` after the system prompt (second_opinion, with the tool
    results it restates), or in that fresh context (`afresh`)."""
    who = m.role if m.name != "runner" else (
        "runner (asks again, sent alone after the system prompt)" if alone
        else "runner (asks again, in that fresh context)" if afresh else "runner (asks again)")
    lines = [f"── {who} " + "─" * max(width - len(who) - 4, 0)]
    if alone:
        sections = re.findall(r"^--- (.+) ---$", m.content or "", re.MULTILINE)
        lines += textwrap.wrap("(it restates " + "; ".join(sections) + ")", width, initial_indent="  ",
                               subsequent_indent="   ")
    return lines


def transcript_lines(state: RunState, events: Sequence[TraceEvent], width: int = 80, full: bool = False,
                     info: RunInfo | None = None, store_opts: str = "") -> list[str]:
    """The transcript as plain text lines of at most `width` characters (unless `full`);
    `info` (the run as `runner runs` lists it) gives the status to show; `store_opts` (see
    `store_options`) goes into the commands it suggests."""
    out = [*(fit(line, width) for line in run_header(state, info.shown_status if info else None)),
           *_wrap(folder_line(state.config), width)]  # a path is never cut
    if state.elided_results:
        n = state.elided_results
        out += textwrap.wrap(f"context: to fit the model's context window, its {n} earliest tool result"
                             f"{'s' * (n != 1)} went as one line each in later requests (shown whole here)", width)
    records = list(state.per_turn)
    at = 0  # the next turn record: kept replies are assistant messages, slipped ones are not

    def slips() -> list[str]:
        nonlocal at
        lines = []
        while at < len(records) and records[at].slip is not None:
            r = records[at]
            head = (f"── turn {r.turn} · {r.prompt_tokens:,} in / {r.completion_tokens:,} out · "
                    f"slip: {r.slip}, not kept ")
            lines += ["", fit(head + "─" * max(width - len(head), 0), width)]
            at += 1
        return lines

    verdicts = _verdicts(events)
    servers = answered_by(events)
    runs, resumes = {r.call_id: r for r in state.tool_runs}, [e for e in events if e.type == "run_resumed"]
    from runner import policies

    afresh = False  # from second_opinion's request on, the requests leave the conversation out
    for i, m in enumerate(state.messages):
        if m.role == "assistant" or m.name == "runner":  # a reply, or runner's own corrective message
            out += slips()
        out += _resumed(resumes, i, records[at].turn if m.role == "assistant" and at < len(records) else None, width)
        out.append("")
        if m.role in ("system", "user"):
            alone = policies.starts_afresh(m)
            afresh = afresh or alone
            out += _heading(m, alone, afresh, width)
            out += _body(m.content or "", width, full, "", wrap=True, keep_last=m.name == "runner")
        elif m.role == "assistant":
            reply = records[at] if at < len(records) else None
            at += 1
            out += _assistant(m, reply, width, full)
        elif m.role == "tool":
            out.append(fit(_tool_label(m, runs.get(m.tool_call_id or ""), servers.get(m.tool_call_id or "")), width))
            if m.tool_call_id in verdicts:
                out.append(fit(f"    {verdicts[m.tool_call_id]}", width))
            out += _body(m.content or "", width, full, "    ")
        if out[-1] == "" and m.role != "assistant":
            out.pop()
    out += slips() + _resumed(resumes, None, None, width)
    out.append("")
    table = engine_table(state, events)
    if table:
        out += ["engine, per turn:", *(table if full else (fit(line, width) for line in aligned(table))), ""]
    out += _ending(state, info, width if not full else 10**6, store_opts)
    return out


def _tool_label(m: Message, record: Any, server: str | None) -> str:
    """A tool result's first line: ← (✗ when it failed), the tool, where the result came from
    when not from running it, how long it took, and the MCP server that answered."""
    label = f"  {'←' if record is None or record.ok else '✗'} {m.name or 'tool'}"
    if record is not None:
        label += (f" ({record.source})" if record.source != "run" else "") + f"  {record.ms:,.0f} ms"
    return label + (f"  from {server}" if server else "")


def _resumed(resumes: list[Any], message: int | None, turn: int | None, width: int) -> list[str]:
    """A line for each `run_resumed` event of `resumes` that came before message `message`
    (by the count of messages it recorded; a trace written before that count was kept: before
    turn `turn`), taken off the list; `message` None: each one left."""
    def due(e: Any) -> bool:
        if message is None:
            return True
        return e.messages <= message if e.messages is not None else turn is not None and e.turns < turn

    lines = []
    while resumes and due(resumes[0]):
        e = resumes.pop(0)
        head = f"── resumed after turn {e.turns} · {when(e.ts)} UTC "
        lines += ["", fit(head + "─" * max(width - len(head), 0), width)]
    return lines


def _assistant(m: Message, record: TurnRecord | None, width: int, full: bool) -> list[str]:
    head = f"── turn {record.turn}" if record else "── assistant"
    if record is not None:
        head += (f" · {record.prompt_tokens:,} in / {record.completion_tokens:,} out · "
                 f"{record.ms / 1000:.1f} s ")
    out = [fit(head + "─" * max(width - len(head), 0), width)]
    if record is not None and record.engine is not None:
        out.append(fit("   " + engine_line(record), width))
    if m.content and m.content.strip():
        out += _body(m.content.strip(), width, full, "", wrap=True, capped=False)  # the model's words: all of them
    for call in m.tool_calls or []:
        out.append(fit(f"  → {call.function.name} {_args(call.function.arguments)}", width) if not full
                   else f"  → {call.function.name} {_args(call.function.arguments)}")
    if record is not None and record.finish_reason == "length":
        limit = f" of {record.max_tokens:,}" if record.max_tokens else ""
        out.append(fit(f"  (cut off: the reply reached its token limit{limit})", width))
    return out


def _ending(state: RunState, info: RunInfo | None = None, width: int = 80, store_opts: str = "") -> list[str]:
    shown = info.shown_status if info else state.status
    if info is not None and shown in ("died", "damaged", "running", "queued"):
        return _not_stopped(info, width, store_opts)
    lines = _wrap("answer: " + " ".join(state.answer.split()), width) if state.answer else []
    if len(lines) > ANSWER_LINES:  # a long reply is in full in its turn, above
        lines = [*lines[:ANSWER_LINES - 1], fit(lines[ANSWER_LINES - 1], width - 2) + " …"]
    why = [f"stopped: {state.status}" + (f" ({state.reason})" if state.reason else "")]
    if state.error is not None:
        why.append(f"error: {state.error.type}: {state.error.message}")
    return lines + [part for line in [*why, *next_steps(state, store_opts)]
                    for part in _wrap(line, width)]  # why it stopped, and commands, are never cut


def _not_stopped(info: RunInfo, width: int, store_opts: str = "") -> list[str]:
    """What a run that did not stop where its state says is doing (wrapped to `width`), and
    what to do about it."""
    if info.shown_status == "damaged":
        why, _, command = (info.damage or "").partition("; repair: ")
        return _wrap(f"damaged: {why}", width) + (_wrap(f"repair with: {command}", width) if command else [])
    said = {"died": "died: its process was killed after the last event",
            "running": f"running: driven by {info.driver}",
            "queued": "queued: waiting for a worker"}.get(info.shown_status, f"stopped: {info.shown_status}")
    target = resume_target(info.state, store_opts)
    then = {"died": f"resume with: runner resume {target}",
            "queued": f"or drive it here: runner resume {target}"}.get(info.shown_status)
    return _wrap(said, width) + (_wrap(then, width) if then else [])


def _wrap(text: str, width: int) -> list[str]:
    return _wrapped(text, width, "  ")


def gen_tok_s(record: TurnRecord) -> float | None:
    """Generated tokens per second of generation time, or None without engine timings."""
    engine = record.engine
    if engine is None or engine.gen_ms <= 0:
        return None
    return record.completion_tokens / engine.gen_ms * 1000


def engine_line(record: TurnRecord) -> str:
    """Where one turn's engine time went, in a line: prompt tokens reused and evaluated, prompt
    ms, generation ms and tokens/s, drafted tokens accepted (when speculative)."""
    engine = record.engine
    assert engine is not None
    rate = gen_tok_s(record)
    line = (f"prompt {engine.prompt_reused:,} reused + {engine.prompt_evaluated:,} evaluated, "
            f"{engine.prompt_ms:,.0f} ms · out {engine.gen_ms:,.0f} ms"
            + (f", {rate:.1f} tok/s" if rate is not None else ""))
    if engine.draft_proposed:
        line += f" · drafts {engine.draft_accepted or 0}/{engine.draft_proposed}"
    return line


def engine_table(state: RunState, events: Sequence[TraceEvent]) -> list[str]:
    """Markdown table of each turn's engine timings (the turns that have them), with the
    ``tool_choice`` each request sent; [] when no turn has any."""
    records = [r for r in state.per_turn if r.engine is not None]
    if not records:
        return []
    choices = {e.turn: e.toolChoice for e in events if e.type == "turn"}
    drafting = any(r.engine is not None and r.engine.draft_proposed for r in records)
    head = ("| turn | tool_choice | prompt tok | reused | evaluated | prompt ms | out tok | gen ms | tok/s | "
            + ("drafts accepted | " if drafting else "") + "turn ms |")
    columns = head.count("|") - 1
    lines = [head, "|---:|---|" + "---:|" * (columns - 2)]
    for r in records:
        e = r.engine
        assert e is not None
        rate = gen_tok_s(r)
        drafts = f"{e.draft_accepted or 0}/{e.draft_proposed or 0} | " if drafting else ""
        lines.append(f"| {r.turn} | {choices.get(r.turn) or 'auto'} | {r.prompt_tokens:,} | {e.prompt_reused:,} | "
                     f"{e.prompt_evaluated:,} | {e.prompt_ms:,.0f} | {r.completion_tokens:,} | {e.gen_ms:,.0f} | "
                     f"{f'{rate:.1f}' if rate is not None else '—'} | {drafts}{r.ms:,.0f} |")
    return lines


SHORT_LABELS = {"tool_choice": "choice", "prompt tok": "prompt", "evaluated": "eval", "out tok": "out",
                "drafts accepted": "drafts"}
"""`engine_table`'s column labels as a terminal shows them (its 80 columns hold them all)."""


def aligned(table: list[str]) -> list[str]:
    """A Markdown table as plain columns for a terminal: short labels, numbers right-aligned."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for i, line in enumerate(table) if i != 1]
    rows[0] = [SHORT_LABELS.get(label, label) for label in rows[0]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) if i == 1 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
            for row in rows]


def transcript_markdown(state: RunState, events: Sequence[TraceEvent], info: RunInfo | None = None,
                        store_opts: str = "") -> str:
    """The whole transcript as Markdown: nothing cut."""
    head = run_header(state, info.shown_status if info else None)
    shown = info.shown_status if info else state.status
    out = [f"# Run {state.run_id}", "", f"**{state.config.endpoint.model}** · {shown}", "", head[1], "", head[2], ""]
    records = iter(_turns(state))
    verdicts = _verdicts(events)
    servers = answered_by(events)
    fence = "```"
    for m in state.messages:
        if m.role in ("system", "user"):
            out += [f"## {m.role.capitalize()}", "", fence, m.content or "", fence, ""]
        elif m.role == "assistant":
            record = next(records, None)
            title = f"## Turn {record.turn}" if record else "## Assistant"
            if record is not None:
                title += f" ({record.prompt_tokens:,} in / {record.completion_tokens:,} out, ${record.cost_usd:.6f})"
            out += [title, ""]
            if m.content and m.content.strip():
                out += [m.content.strip(), ""]
            for call in m.tool_calls or []:
                out += [f"- call `{call.function.name}` `{_args(call.function.arguments)}` (id `{call.id}`)"]
            if m.tool_calls:
                out.append("")
        else:
            server = servers.get(m.tool_call_id or "")
            out += [f"### Result of `{m.name}` (call `{m.tool_call_id}`" + (f", from {server})" if server else ")"), ""]
            if m.tool_call_id in verdicts:
                out += [f"*{verdicts[m.tool_call_id]}*", ""]
            out += [fence, m.content or "", fence, ""]
    table = engine_table(state, events)
    if table:
        out += ["## Engine, per turn", "", *table, ""]
    out += ["## Stop", ""] + [f"- {line}" for line in _ending(state, info, 10**6, store_opts)]
    return "\n".join(out) + "\n"


def transcript_json(state: RunState, events: Sequence[TraceEvent]) -> dict[str, Any]:
    """The state and its trace events as one JSON-ready object."""
    return {"state": state.model_dump(mode="json"),
            "events": [e.model_dump(mode="json", exclude_none=True) for e in events]}


_QUANT = re.compile(r"[.\-_](?:i?q\d[\w]*|f16|f32|bf16)$", re.IGNORECASE)
_TUNE = re.compile(r"[.\-_](?:instruct|chat|it)$", re.IGNORECASE)


def short_model(name: str) -> str:
    """The part of a model name that tells models apart in a narrow column: no folder, no
    ".gguf", no quantization or "-instruct" suffix ("…/SmolLM2-135M-Instruct.Q4_1.gguf" ->
    "SmolLM2-135M"); a scripted scenario by its name ("scripted/plan" -> "plan")."""
    if name.startswith("scripted/"):
        return name.removeprefix("scripted/")
    base = name.rsplit("/", 1)[-1].removesuffix(".gguf")
    for pattern in (_QUANT, _TUNE):
        base = pattern.sub("", base)
    return base or name


def short_models(names: Sequence[str]) -> dict[str, str]:
    """`short_model` of each name, keeping a name whole where two would look the same."""
    shorts = {n: short_model(n) for n in names}
    taken: dict[str, int] = {}
    for short in shorts.values():
        taken[short] = taken.get(short, 0) + 1
    return {n: s if taken[s] == 1 else n for n, s in shorts.items()}


GROUPINGS = ("model", "day", "status")


@dataclass
class Total:
    """Sums over a group of runs: counts, tokens, USD."""

    group: str
    runs: int = 0
    turns: int = 0
    tool_runs: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, state: RunState) -> None:
        self.runs += 1
        self.turns += state.turns
        self.tool_runs += state.tool_run_count
        self.prompt_tokens += state.prompt_tokens
        self.completion_tokens += state.completion_tokens
        self.cost_usd += state.cost_usd - state.child_cost_usd  # each child run is a row of its own


def run_totals(states: Sequence[tuple[RunState, str]], by: str | None) -> list[Total]:
    """Sums per group (`by`: "model", "day" (UTC, of the start) or "status" (as shown)), in
    order of first appearance, then a TOTAL row; one "all runs" row when `by` is None. When
    some runs are unpriced (a model on this machine, no price given: $0), a "priced" and an
    "unpriced" row come before the last, so $0 is never read as a cheap hosted run.
    `states` holds (state, shown status) pairs. Every run counts its own spend: a research
    child's cost, which its parent's `cost_usd` includes, is counted once, with the child.
    """
    from runner.models import known_name

    groups: dict[str, Total] = {}
    overall = Total("TOTAL" if by else "all runs")
    kinds = {True: Total("priced"), False: Total("unpriced")}
    known = {m: known_name(m) for m in {s.config.endpoint.model for s, _ in states}} if by == "model" else {}
    names = short_models(sorted(set(known.values())))
    for state, shown in states:
        model = known.get(state.config.endpoint.model, state.config.endpoint.model)
        key = {"model": names.get(model, model),
               "day": time.strftime("%Y-%m-%d", time.gmtime(state.created_at)), "status": shown}.get(by or "", "")
        if by:
            groups.setdefault(key, Total(key)).add(state)
        kinds[state.config.priced].add(state)
        overall.add(state)
    split = [k for k in kinds.values() if k.runs] if kinds[False].runs else []  # runs at $0: said apart
    return [*groups.values(), *split, overall]


def print_runs(infos: Sequence[RunInfo], store_opts: str = "") -> None:
    """The `runner runs` table: id, start, status, turns, cost, the model's distinguishing
    name, and, where the terminal has room for them, the prompt's first line and the reason
    (`runner show` has it all); `store_opts` (see `store_options`) goes into the commands it
    suggests."""

    def reason(i: RunInfo) -> str:
        if i.shown_status == "died":
            return "its process died; resume it with: runner resume " + resume_target(i.state, store_opts)
        if i.shown_status == "damaged":
            return i.damage or "damaged; repair it with: runner repair " + i.state.run_id + store_opts
        return f"driven by {i.driver}" if i.shown_status == "running" else i.state.reason or ""

    names = short_models(sorted({i.state.config.endpoint.model for i in infos}))
    wide = console().width >= 100
    print_table([("run id", "id"), ("started", "id"), ("status", "id"), ("turns", "num"),
                 ("cost USD", "num"), ("model", "text"), *([("prompt", "text"), ("reason", "text")] if wide else [])],
                [[i.state.run_id, when(i.state.created_at)[5:], i.shown_status, str(i.state.turns),
                  own_cost(i.state), names[i.state.config.endpoint.model],
                  *([first_line(i.state), reason(i)] if wide else [])] for i in infos])


def first_line(state: RunState) -> str:
    """The first line of a run's prompt (`policies.question`: its first user message)."""
    from runner.policies import question

    return next((line.strip() for line in question(state).splitlines() if line.strip()), "")


def own_cost(state: RunState) -> str:
    """A run's own spend for a list of runs, in USD: a research parent's without its children's
    (each child is a row of its own, so the column adds up)."""
    return f"{state.cost_usd - state.child_cost_usd:.6f}"


def print_totals(rows: Sequence[Total], by: str | None) -> None:
    """The `runner runs --totals` table."""
    print_table([(by or "", "text"), ("runs", "num"), ("turns", "num"), ("tools", "num"),
                 ("in tokens", "num"), ("out tokens", "num"), ("cost USD", "num")],
                [[r.group, str(r.runs), str(r.turns), str(r.tool_runs), f"{r.prompt_tokens:,}",
                  f"{r.completion_tokens:,}", f"{r.cost_usd:.6f}"] for r in rows])


def trace_lines(events: Sequence[TraceEvent], info: RunInfo | None, width: int, store_opts: str = "") -> list[str]:
    """A run's trace for `runner trace`: a header, then one line per event: the time since the
    first event ("+    1,234 ms"), its type and its fields (cut to `width` with "…"; `--json`
    has it all), then why it stopped and what it cost; `info` (the run as listed) says what
    a trace without a stop means (a process that died, a driver at work, a queued run), and
    whether the run is damaged."""
    lines = [fit(f"{'since start':>13}  {'event':<17} fields", width)] if events else []
    t0 = events[0].ts if events else 0.0
    for e in events:
        fields = e.model_dump(exclude={"runId", "ts", "type"}, exclude_none=True, exclude_defaults=True)
        shown = "  ".join(f"{k}={json.dumps(v) if not isinstance(v, (int, float)) else v}" for k, v in fields.items())
        lines.append(fit(f"+{(e.ts - t0) * 1000:9,.0f} ms  {e.type:<17} {shown}", width))
    stops = [e for e in events if e.type == "run_stopped"]
    processes = sum(1 for e in events if e.type in ("run_started", "run_resumed"))
    stopped = bool(events) and events[-1].type == "run_stopped"
    moving = info if info is not None and info.shown_status in ("died", "running", "queued") and not stopped else None
    if stops and moving is None:  # a stop followed by a resume is not how the run ended
        last = stops[-1]
        lines.append(f"stopped: {last.status}  turns={last.turns}  cost=${last.costUsd:.6f}  processes={processes}")
        lines += textwrap.wrap(f"reason: {last.reason}", width, subsequent_indent="  ",
                               break_on_hyphens=False, break_long_words=False)
    if moving is not None:
        s = moving.state
        lines.append(f"{moving.shown_status}  turns={s.turns}  cost=${s.cost_usd:.6f}  processes={processes}")
    if info is not None and (moving is not None or info.shown_status == "damaged"):
        lines += _not_stopped(info, width, store_opts)
    return lines


def repair_lines(report: RepairReport, store_opts: str = "") -> list[str]:
    """What `runner repair` did: the save it rebuilt from, what it dropped, what may have
    happened outside the kept state, and how to continue (`store_opts`: see `store_options`)."""
    if report.kept_seq == report.new_seq:
        return [f"run {report.run_id}: " + "; ".join(report.notes)]
    return [f"repaired run {report.run_id}: rebuilt from save {report.kept_seq} (now save {report.new_seq})",
            f"dropped {len(report.dropped)}:" if report.dropped else "dropped: nothing committed after it",
            *(f"  {line}" for line in report.dropped),
            "may have happened outside the kept state:" if report.outside else "nothing started outside it",
            *(f"  {line}" for line in report.outside),
            *(f"note: {line}" for line in report.notes),
            f"it is {report.status}: nothing to resume" if report.status in ("completed", "failed")
            else f"continue it with: runner resume {report.run_id}{store_opts}"]


def repaired(report: RepairReport, runs: RunStore, as_json: bool) -> None:
    """`runner repair` on `runs`: what it did (see `repair_lines`), or with `as_json` the
    report as JSON."""
    lines = repair_lines(report, store_options(runs.url))
    fitted = (part for line in lines for part in _wrapped(line, max(terminal_width(), 40), "  "))
    print(json.dumps(dataclasses.asdict(report)) if as_json else "\n".join(fitted))


def transcript(state: RunState, events: Sequence[TraceEvent], fmt: str, width: int, full: bool,
               info: RunInfo | None = None, store_opts: str = "") -> str:
    """`runner show`: the transcript as text fitted to `width` (`full`: nothing cut), Markdown
    (`fmt` "md") or JSON, ending with a newline; `info` (the run as `runner runs` lists it)
    gives the status to show; `store_opts` (see `store_options`) goes into its commands."""
    if fmt == "json":
        return json.dumps(transcript_json(state, events), ensure_ascii=False) + "\n"
    if fmt == "md":
        return transcript_markdown(state, events, info, store_opts)
    return "\n".join(transcript_lines(state, events, width, full, info, store_opts)) + "\n"


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


def print_models(rows: Sequence[ModelStatus], as_json: bool = False) -> None:
    """The `runner models list` table, or with `as_json` each model's status."""
    if as_json:
        print(json.dumps([r.model_dump(mode="json") for r in rows]))
        return
    print_table([("name", "id"), ("present", "id"), ("source", "id"), ("size MB", "num")],
                [[r.name, "yes" if r.present else "no", r.source, f"{r.size_bytes / 1e6:.0f}" if r.size_bytes else "-"]
                 for r in rows])
    print("where each is (or goes when pulled):")  # whole: a path cut short says nothing of where
    pad = max((len(r.name) for r in rows), default=0)
    print("".join(f"  {r.name:<{pad}}  {r.path or '-'}\n" for r in rows), end="")


def unkept(state: RunState) -> None:
    """Why a new run that never got a reply from its endpoint was not kept (as `error` prints)."""
    error(state.reason or "no reply")
    say(f"not kept: run {state.run_id} never got a reply; --keep keeps such runs")


def worker_done(report: WorkerReport) -> None:
    """The worker's last line: how many runs it drove, how they stopped, and its errors."""
    from collections import Counter

    stops = ", ".join(f"{n} {status}" for status, n in Counter(report.driven.values()).most_common())
    say(f"worker: drove {len(report.driven)} run(s){': ' + stops if stops else ''}; {len(report.errors)} error(s)")


def created_runs_dir(path: Path) -> None:
    say(f"created runs directory {path}")


def live_feedback(show_progress: bool = True, runs: RunStore | None = None) -> Feedback:
    """What a run driven in this terminal shows on stderr: the local model it starts, the live
    turn line and each tool's progress (only with `show_progress`), each retry of a failed
    request, a Ctrl-C while it runs (what stopping waits for), and a Ctrl-C that stopped it
    before the loop ran (how to continue it, with the options that find `runs`)."""
    from runner.interactive import Feedback

    turn_line = TurnLine()

    def on_progress(tool: str, label: str, ms: float) -> None:
        say(f"  progress: {tool}: {label}  (t+{ms:,.0f} ms)")

    def on_retry(attempt: int, most: int, error: str, wait_s: float) -> None:
        turn_line.close()
        say(wrap(f"  retry {attempt}/{most} in {wait_s:.1f} s: {' '.join(error.split())}"))

    def on_stopping(presses: int) -> None:
        turn_line.close()
        say(wrap("stopping at the run's next step: a model request is cut off; a running tool is asked to stop, "
                 "and one that does not check finishes first" if presses == 1 else
                 "still stopping: waiting for the running step to end (a kill -9 leaves the run resumable too)"))

    def on_stopped_early(state: RunState) -> None:
        again = resume_target(state, store_options(runs.url) if runs is not None else "")
        say(f"{state.status}: run {state.run_id}; continue it with: runner resume {again}")

    if not show_progress:
        return Feedback(on_retry=on_retry, on_stopping=on_stopping, on_stopped_early=on_stopped_early,
                        on_end=turn_line.close)
    return Feedback(on_note=say, on_progress=on_progress, on_turn=turn_line, on_retry=on_retry,
                    on_stopping=on_stopping, on_stopped_early=on_stopped_early, on_end=turn_line.close)


def result_json(state: RunState) -> dict[str, Any]:
    """The `--json` shape of a run: its `RunResult`."""
    from runner.result import RunResult

    return RunResult.of(state).model_dump(mode="json")


def started(started: Started, runs: RunStore, as_json: bool) -> None:
    """The end of `runner run` and `runner resume`: the run at its stop, a queued run and how
    a worker gets it, or why a new run was not kept (stderr); with `as_json`, its `RunResult`
    (with status "queued", or "kept": false)."""
    from runner.store import FileStore

    state, store_opts = started.state, store_options(runs.url)
    if as_json:
        marks = {"status": "queued"} if started.queued else {} if started.kept else {"kept": False}
        print(json.dumps({**result_json(state), **marks}))
        if not started.kept:
            unkept(state)  # on stderr, as without --json: the id printed names no stored run
    elif started.queued:
        print(f"queued run {state.run_id}; a worker drives it: runner worker{store_opts}")
    elif not started.kept:
        unkept(state)
    else:
        trace_at = (str(runs.trace_path(state.run_id)) if isinstance(runs, FileStore)
                    else f"runner trace {state.run_id}{store_opts}")
        print("\n".join(run_lines(state, trace_at, terminal_width(), store_opts)))


def trace(events: Sequence[TraceEvent], info: RunInfo | None, runs: RunStore, as_json: bool) -> None:
    """`runner trace`: a warning on stderr per problem reading it in `runs`, then the trace
    (see `trace_lines`), or with `as_json` each event as a line of JSON."""
    for problem in getattr(runs, "problems", []):
        say(f"warning: {problem}")
    if as_json:
        print("".join(e.model_dump_json(exclude_none=True) + "\n" for e in events), end="")
    else:
        print("\n".join(trace_lines(events, info, terminal_width(), store_options(runs.url))))


def runs_list(infos: Sequence[RunInfo], where: RunStore, as_json: bool, status: str | None = None,
              offset: int = 0) -> None:
    """`runner runs`: a warning on stderr per unreadable run skipped, then the table (or that
    there are none), or with `as_json` each run's `RunResult` (without its per-turn prompt
    tokens) with its shown status, its driver and any damage."""
    for problem in getattr(where, "problems", []):
        say(f"warning: skipped an unreadable run: {problem}")
    if as_json:
        print(json.dumps([{**{k: v for k, v in result_json(i.state).items() if k != "per_turn_prompt_tokens"},
                           "status": i.shown_status, "driver": i.driver, **({"damage": i.damage} if i.damage else {})}
                          for i in infos]))
    elif infos:
        print_runs(infos, store_options(where.url))
    elif said := _missing(where):
        print(said)
    else:
        print(f"no runs in {_shown(where.url)}" + (f" with status {status}" if status else "")
              + (f" past the first {offset} (--offset)" if offset else ""))


def runs_totals(infos: Sequence[RunInfo], where: RunStore, by: str | None, as_json: bool) -> None:
    """`runner runs --totals`: the sums (see `run_totals`) as a table, or as JSON rows."""
    rows = run_totals([(i.state, i.shown_status) for i in infos], by)
    if as_json:
        print(json.dumps([{**dataclasses.asdict(r), "cost_usd": round(r.cost_usd, 9)} for r in rows]))
    elif said := _missing(where):
        print(said)
    else:
        print_totals(rows, by)


def _missing(where: RunStore) -> str:
    """What to say for a runs directory that does not exist ('' for one that does, or a database)."""
    root = getattr(where, "root", None)
    return f"no runs: {_shown(where.url)} does not exist (yet)" if isinstance(root, Path) and not root.exists() else ""


def pruned(deleted: Sequence[str], skipped: Sequence[str], dry_run: bool, url: str, as_json: bool) -> None:
    """What `runner runs --prune` did: one line per run deleted (or that would be, with
    `dry_run`), each run skipped and why (stderr), then a count."""
    if as_json:
        print(json.dumps({"deleted" if not dry_run else "would_delete": list(deleted), "skipped": list(skipped)}))
        return
    verb = "would delete" if dry_run else "deleted"
    print("".join(f"{verb} {run_id}\n" for run_id in deleted), end="", flush=True)
    print("".join(wrap(f"skipped {line}") + "\n" for line in skipped), end="", file=sys.stderr, flush=True)
    print(f"{verb} {len(deleted)} run(s) from {_shown(url)}" + (f", skipped {len(skipped)}" if skipped else ""))


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


def settings(rows: Sequence[tuple[str, str, str]], files: Sequence[Path], user_file: Path, as_json: bool) -> None:
    """`runner config show`: the config files read, then each setting's (name, value, source)."""
    if as_json:
        print(json.dumps({"files": [str(p) for p in files],
                          "settings": [{"name": n, "value": v, "source": src} for n, v, src in rows]}))
        return
    print("config files read: " + (", ".join(map(str, files)) if files else f"none (./runner.toml or {user_file})"))
    print_table([("setting", "id"), ("value", "text"), ("source", "path")], [list(r) for r in rows])


def exported(report: ExportReport, as_json: bool) -> None:
    """What `runner export` sent: each run's trace id (and whether it is unfinished), then the
    spans sent; or with `as_json` the report as JSON."""
    if as_json:
        print(json.dumps(dataclasses.asdict(report)))
        return
    waits = "  (not stopped: its invoke_agent span waits)"
    for run_id, trace_id in report.traces.items():
        print(f"{run_id}  trace {trace_id}" + (waits if run_id in report.unfinished else ""))
    again = " (all were sent before)" if not report.spans_sent else ""
    print(f"sent {report.spans_sent} span(s) to {report.endpoint}{again}")


def view_ready(where: str, token: str | None) -> Callable[[str], None]:
    """What `runner view` prints once it listens: its URL, the store, how to stop it."""
    how = "; open it once as URL?token=TOKEN" if token else ""
    return lambda url: print(f"runner view: {url}  (store: {_shown(where)}; Ctrl-C stops{how})", flush=True)
