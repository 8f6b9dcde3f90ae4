"""Everything runner shows a person: tables fitted to the terminal, a run at its stop, the live
per-turn line, and the suite's reports (a terminal table, Markdown, a turn-time plot).

The library never prints: it returns data or reports through callbacks, and the CLI hands what
it gets to the functions here. One helper, `print_table`, fits every table to the terminal
(80 columns when piped, or `$COLUMNS`): ids and numbers are never cut, text is, with "…".
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.state import RunState
    from runner.suite import SuiteReport, TaskResult


def console() -> Any:
    """A rich console for stdout: the terminal's width, else $COLUMNS, else 80 when piped.
    Tables shorten their text columns to fit and never wrap a number (`--json` has it all)."""
    from rich.console import Console

    return Console()


def print_table(columns: list[tuple[str, str]], rows: list[list[str]]) -> None:
    """Print a compact table that fits the console. Each column is (header, kind): "id" and
    "num" cells are never cut or wrapped; "text" columns share the width that is left, cut at
    the end with "…" ("path": cut at the start, where names differ least), and the rightmost
    goes first when fewer than 8 characters would remain for each."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    def build(keep: list[int], share: int) -> Table:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0), collapse_padding=True)
        for i in keep:
            header, kind = columns[i]
            fixed_width = share if kind in ("text", "path") else None
            table.add_column(header, no_wrap=True, width=fixed_width, justify="right" if kind == "num" else "left")
        for row in rows:
            table.add_row(*(cut(row[i], share, columns[i][1]) for i in keep))
        return table

    def width_of(table: Table) -> int:
        probe = Console(file=io.StringIO(), width=10_000)
        probe.print(table)
        return max(len(line.rstrip()) for line in probe.file.getvalue().splitlines())  # type: ignore[attr-defined]

    out = console()
    keep = list(range(len(columns)))
    while True:
        texts = [i for i in keep if columns[i][1] in ("text", "path")]
        if not texts:
            break
        share = 1 + (out.width - width_of(build(keep, 1))) // len(texts)
        if share >= 8:
            break
        keep.remove(texts[-1])
    out.print(build(keep, share if texts else 0))


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
        self.width = shutil.get_terminal_size((80, 24)).columns
        self.drawn_at = 0.0
        self.open = False

    def __call__(self, p: Any) -> None:
        head = f"  turn {p.turn}  {p.elapsed_ms / 1000:5.1f} s  {p.tokens:>4} tokens"
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


def run_lines(state: RunState, trace_at: str) -> list[str]:
    """A stopped run for a person: the figures, the answer, where its trace is, and how to
    continue it when it can be continued (`trace_at`: a path or the command that prints it)."""
    lines: list[str] = []
    echo = lines.append
    name = state.config.endpoint.model.removeprefix("scripted/")
    echo(f"{name}  turns={state.turns}  tools={state.tool_run_count}  in={state.prompt_tokens:,}  "
               f"out={state.completion_tokens:,}  cost=${state.cost_usd:.6f}  ms={state.wall_ms:,.0f}  "
               f"status={state.status}")
    if state.answer:
        echo(f"   answer: {json.dumps(state.answer, ensure_ascii=False)}")
    if state.per_turn:
        echo("   per-turn prompt tokens: " + ", ".join(str(t.prompt_tokens) for t in state.per_turn))
    echo(f"   run id: {state.run_id}   trace: {trace_at}")
    if state.status not in ("completed",):
        echo(f"   stopped: {state.reason}")
    it = state.interruption
    if it is not None and it.type == "approval":
        echo(f"   waiting for approval: {it.tool_name}({json.dumps(it.args)})  call id {it.call_id}"
                   + ("  [in doubt: it may already have run]" if it.in_doubt else ""))
        echo(f"   decide with: runner resume {state.run_id} --approve {it.call_id}"
                   f"  |  --reject {it.call_id} --reason TEXT")
    elif state.status == "max_turns_exceeded":
        echo(f"   resume with: runner resume {state.run_id} --max-turns N   (N > {state.turns}; 0: no cap)")
    elif state.status == "budget_exceeded":
        echo(f"   resume with: runner resume {state.run_id} --max-budget USD   (more than ${state.cost_usd:.6f})")
    elif state.status == "interrupted":
        echo(f"   resume with: runner resume {state.run_id}")
    return lines


def progress_line(result: TaskResult) -> str:
    """One finished suite task, at most ~76 characters: one line in an 80-column terminal."""
    status = "" if result.status == "completed" else f" {result.status}"
    return (f"  {result.model[:12]:<12} {result.task:<12} #{result.repeat:<2} turns={result.turns:<2} "
            f"tools={result.tool_runs:<2} {result.wall_ms:>7,.0f} ms  ok={'yes' if result.correct else 'no'}{status}")


def _column_title(report: SuiteReport, model: str) -> str:
    return "scripted provider" if model == "scripted" else f"local model: {model}"


def markdown(report: SuiteReport) -> str:
    """The report as Markdown: per model column, the summary over repeats, then one line per run."""
    from runner.suite import totals

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

    from rich import box
    from rich.console import Console
    from rich.table import Table

    from runner.suite import TaskSummary, summarize, totals

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

    out = Console()  # the terminal's width, else $COLUMNS, else 80
    probe = Console(file=io.StringIO(), width=1000)
    probe.print(build(0))
    numbers_width = max(len(line) for line in probe.file.getvalue().splitlines()[1:])  # type: ignore[attr-defined]
    room = out.width - numbers_width - 3
    answer_chars = room if len(locals_) == 1 and room >= 20 else 0
    out.print(build(answer_chars))
