"""Reproduce the chapter's measurements with the real harness, one experiment each.

Every experiment drives runs through the library: the scripted provider is served in-process
on loopback (`runner.scripted.ScriptedServer`), states come from `runner.state.new_run`, and
`runner.harness.drive` runs them, saving every transition under a throw-away runs root
(`runs/experiments/_runs/<name>/`, wiped when the experiment starts). Only `resume` uses the
CLI, because its point is two separate processes.

    python scripts/experiments.py                  # all eleven; local_suite alone takes 0.5-2 min
    python scripts/experiments.py --skip-local     # everything but the local model (~45 s)
    python scripts/experiments.py turn_cap cancel  # just these

For each experiment it prints a table and writes `runs/experiments/<name>.md` (the table and
what it shows, numbers from this run only) and `<name>.json` (the data); `turn_cap` also
draws `turn_cap.png`. `runs/experiments/README.md` concatenates the sections in order. Each
experiment's section is also appended, dated, with the commit and the load average, to a
journal: `journal.md` beside the reports, or `--journal FILE` (`--journal docs/journal.md`
keeps it in the checkout's journal, the history the docs point to).

Exit status 1 if a headline check fails (turn cap: input tokens cap100/cap50 in 3.3-4.2;
budgets: overshoot <= the last turn's cost; resume: same cost and tool runs as an
uninterrupted run; cancel: stop latency <= 50 ms) or an experiment crashes, naming which.

Money is USD at the defaults of `runner.state.RunConfig` ($2.00 / $12.00 per million
prompt / completion tokens); tokens are counted by the scripted provider with o200k_base.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from runner import store
from runner.cancel import CancelToken
from runner.endpoints import Endpoint
from runner.harness import drive, give_verdict
from runner.scripted import PROMPTS, ScriptedServer, ScriptedSettings
from runner.state import DEFAULT_TOOLS, RunConfig, RunState, new_run
from runner.store import FileStore, Lease
from runner.tools import ScanArchive, Tool, ToolContext, deleted_files
from runner.trace import read_trace

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = store.runs_dir() / "experiments"
"""Where reports go: `--out`, else `experiments/` in the runs directory (--runs-dir,
$RUNNER_RUNS_DIR, else ./runs of the current folder); never the checkout unless run from it."""
RUNS_DIR = OUT_DIR / "_runs"


# --------------------------------------------------------------------------- plumbing


@dataclass
class Check:
    """A headline claim of the chapter, checked against this run's numbers."""

    label: str
    ok: bool


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]]
    title: str = ""
    in_markdown: bool = True
    """False: printed only (the Markdown carries another rendering of the same data)."""


@dataclass
class Outcome:
    """What one experiment measured: tables, chapter-style lines, a summary, raw data, checks."""

    title: str
    tables: list[Table] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    summary: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    extra_md: str = ""
    elapsed_s: float = 0.0


@dataclass
class Lab:
    """One experiment's bench: the shared scripted provider and a fresh runs root."""

    base_url: str
    runs_root: Path

    def run(self, scenario: str, *, base_url: str | None = None, **config: Any) -> RunState:
        """Start a scripted run of `scenario` with its default prompt and run it to a stop."""
        state = new_run(PROMPTS[scenario], RunConfig.model_validate({"model": f"scripted/{scenario}", **config}))
        return self.resume(state, base_url=base_url)

    def resume(self, state: RunState, *, base_url: str | None = None) -> RunState:
        """Run (or resume) `state` through `runner.harness.drive`, saving under the runs root."""
        return asyncio.run(drive(state, base_url or self.base_url, self.runs_root))

    def workspace(self, state: RunState) -> Path:
        return self.runs_root / state.run_id / "workspace"


def usd(x: float) -> str:
    return f"${x:.6f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def spread(values: list[float], digits: int = 1) -> str:
    """'min / median / max' of `values`."""
    return " / ".join(f"{v:,.{digits}f}" for v in (min(values), statistics.median(values), max(values)))


def tool_labels(events: list[Any]) -> list[str]:
    """'read_file:errors.log' style labels of the tool_start events of a trace."""
    labels = []
    for e in events:
        if e.type == "tool_start":
            path = json.loads(e.args or "{}").get("path")
            labels.append(e.toolName + (f":{path}" if path else ""))
    return labels


def console() -> Any:
    from rich.console import Console

    return Console()  # the terminal's width, else $COLUMNS, else 80: tables wrap their cells to fit


def print_outcome(name: str, outcome: Outcome) -> None:
    from rich.table import Table as RichTable

    out = console()
    out.rule(f"[bold]{name}[/]: {outcome.title}")
    for t in outcome.tables:
        table = RichTable(*t.columns, title=t.title or None)
        for row in t.rows:
            table.add_row(*row)
        out.print(table)
    for line in outcome.lines:
        out.print(line, highlight=False, markup=False)
    out.print(outcome.summary, highlight=False, markup=False)
    for c in outcome.checks:
        out.print(f"check: {c.label}: " + ("ok" if c.ok else "[bold red]FAILED[/]"), highlight=False)


def markdown_table(t: Table) -> str:
    cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ([f"**{t.title}**", ""] if t.title else []) + [
        "| " + " | ".join(map(cell, t.columns)) + " |",
        "|" + "---|" * len(t.columns),
    ]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in t.rows]
    return "\n".join(lines)


def markdown(name: str, outcome: Outcome) -> str:
    parts = [f"## {name}: {outcome.title}", ""]
    for t in outcome.tables:
        if t.in_markdown:
            parts += [markdown_table(t), ""]
    if outcome.extra_md:
        parts += [outcome.extra_md, ""]
    if outcome.lines:
        parts += ["```", *outcome.lines, "```", ""]
    parts += [outcome.summary, ""]
    if outcome.checks:
        parts += [f"- check: {c.label}: {'ok' if c.ok else 'FAILED'}" for c in outcome.checks] + [""]
    parts += [f"_(experiment took {outcome.elapsed_s:.1f} s; run {time.strftime('%Y-%m-%d %H:%M')})_", ""]
    return "\n".join(parts)


def write_outcome(name: str, outcome: Outcome) -> None:
    (OUT_DIR / f"{name}.md").write_text(markdown(name, outcome), encoding="utf-8")
    data = {"name": name, "title": outcome.title, "elapsed_s": round(outcome.elapsed_s, 3),
            "checks": [{"label": c.label, "ok": c.ok} for c in outcome.checks], **outcome.data}
    (OUT_DIR / f"{name}.json").write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")


def append_journal(path: Path, name: str, outcome: Outcome) -> None:
    """Append the experiment's section to the journal at `path`: a dated heading with the
    command, the commit and the load average, then the section as `markdown` writes it."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "no checkout"
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    body = markdown(name, outcome).split("\n", 1)[1].lstrip("\n")
    section = (f"## {when} · `runner experiments {name}`: {outcome.title}\n\n"
               f"Commit {commit}; load average {load} when it finished.\n\n{body}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(JOURNAL_HEAD, encoding="utf-8")
    with path.open("a", encoding="utf-8") as f:
        f.write("\n" + section)


JOURNAL_HEAD = "# Journal\n\nWhat was measured, when, on which commit: one dated section per experiment run.\n"


def write_summary() -> Path:
    """README.md: every `<name>.md` present, in experiment order."""
    sections = [(OUT_DIR / f"{n}.md").read_text(encoding="utf-8")
                for n in EXPERIMENTS if (OUT_DIR / f"{n}.md").exists()]
    head = ("# Experiments: the chapter's measurements, reproduced\n\n"
            "Generated by `python scripts/experiments.py` (see its docstring); every number below "
            "comes from the run that wrote it. Costs are USD at $2.00 / $12.00 per million "
            "prompt / completion tokens; tokens are o200k_base counts from the scripted provider.\n")
    path = OUT_DIR / "README.md"
    path.write_text(head + "\n" + "\n".join(sections), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- experiments


def turn_cap(lab: Lab) -> Outcome:
    """runaway at caps 8, 20, 50, 100; the curve for every cap 1..100 comes from the cap-100 run."""
    caps = (8, 20, 50, 100)
    runs = {cap: lab.run("runaway", max_turns=cap) for cap in caps}
    rows, prev = [], None
    for cap in caps:
        s = runs[cap]
        rows.append([str(cap), str(s.turns), f"{s.prompt_tokens:,}", f"{s.completion_tokens:,}", usd(s.cost_usd),
                     ratio(s.prompt_tokens, prev.prompt_tokens) if prev else "-",
                     ratio(s.cost_usd, prev.cost_usd) if prev else "-"])
        prev = s
    quad = runs[100].prompt_tokens / runs[50].prompt_tokens
    cum_in, cum_cost, total_in, total_cost = [], [], 0, 0.0
    for t in runs[100].per_turn:
        total_in, total_cost = total_in + t.prompt_tokens, total_cost + t.cost_usd
        cum_in.append(total_in)
        cum_cost.append(total_cost)
    prefix_ok = all(runs[c].prompt_tokens == cum_in[c - 1] for c in caps)
    plot_turn_cap(cum_in, cum_cost, caps, OUT_DIR / "turn_cap.png")
    per_turn = [t.prompt_tokens for t in runs[100].per_turn]
    return Outcome(
        title="turn cap vs cost on `runaway`",
        tables=[Table(["turn cap", "turns", "input tokens", "output tokens", "cost USD",
                       "input x prev", "cost x prev"], rows)],
        extra_md="![cost and input tokens against the turn cap](turn_cap.png)",
        lines=[f"input tokens cap100/cap50 = {runs[100].prompt_tokens:,} / {runs[50].prompt_tokens:,} = {quad:.2f}x",
               f"per-turn prompt tokens: {per_turn[0]}, {per_turn[1]}, {per_turn[2]}, ... {per_turn[-1]} "
               f"(+{per_turn[1] - per_turn[0]} a turn)"],
        summary=(f"Doubling the cap from 50 to 100 multiplied input tokens by {quad:.2f} and cost by "
                 f"{runs[100].cost_usd / runs[50].cost_usd:.2f}: each turn resends the whole transcript, so "
                 f"the total grows with the square of the cap. Each capped run's input equals the first N "
                 f"turns of the cap-100 run ({'yes' if prefix_ok else 'NO'}), which is how the plot's curve "
                 f"for every cap 1..100 comes from one run."),
        data={"caps": {c: {"turns": runs[c].turns, "prompt_tokens": runs[c].prompt_tokens,
                           "completion_tokens": runs[c].completion_tokens, "cost_usd": runs[c].cost_usd}
                       for c in caps},
              "input_ratio_cap100_cap50": quad, "per_turn_prompt_tokens": per_turn,
              "cumulative_prompt_tokens": cum_in, "cumulative_cost_usd": cum_cost},
        checks=[Check(f"input tokens cap100/cap50 = {quad:.2f} within 3.3-4.2", 3.3 <= quad <= 4.2)],
    )


def plot_turn_cap(cum_in: list[int], cum_cost: list[float], caps: tuple[int, ...], path: Path) -> None:
    """Two panels against the turn cap: cumulative cost (USD) and input tokens, with a linear
    extrapolation of cap 8 dashed in for contrast."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    x = list(range(1, len(cum_in) + 1))
    fig, (ax_cost, ax_in) = plt.subplots(2, 1, sharex=True, figsize=(7.5, 6.5))
    for ax, ys, label, fmt in ((ax_cost, cum_cost, "cost (USD)", "${:.4f}"), (ax_in, cum_in, "input tokens", "{:,}")):
        ax.plot(x, ys, color="tab:red" if ax is ax_cost else "tab:blue", lw=2, label="measured (runaway)")
        ax.plot(x, [ys[caps[0] - 1] / caps[0] * n for n in x], "k--", lw=1, label=f"linear from cap {caps[0]}")
        for cap in caps:
            ax.scatter([cap], [ys[cap - 1]], color="black", zorder=3, s=18)
            ax.annotate(fmt.format(ys[cap - 1]), (cap, ys[cap - 1]), textcoords="offset points",
                        xytext=(-8, 8), ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.set_ylim(0, ys[-1] * 1.15)  # room for the last label
        # bind fmt and the value type now: a late-binding lambda would format both axes as tokens
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _, fmt=fmt, kind=type(ys[0]): fmt.format(kind(v))))
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    ax_cost.set_title("runaway: what a turn cap lets you spend")
    ax_in.set_xlabel("turn cap (turns)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def budgets(lab: Lab) -> Outcome:
    """runaway with no turn cap under three budgets, then the same with cap_max_tokens."""
    rows: list[list[str]] = []
    data: list[dict[str, Any]] = []
    checks: list[Check] = []
    for capped in (False, True):
        for budget_usd in (0.005, 0.010, 0.050):
            s = lab.run("runaway", max_turns=None, max_budget_usd=budget_usd, cap_max_tokens=capped)
            last = s.per_turn[-1]
            overshoot = s.cost_usd - budget_usd
            fits = overshoot <= last.cost_usd + 1e-12
            cut = sum(1 for t in s.per_turn if t.finish_reason == "length")
            rows.append(["check before each turn" + (" + cap max_tokens" if capped else ""), usd(budget_usd),
                         usd(s.cost_usd), usd(overshoot), usd(last.cost_usd), yes(fits), str(s.turns), s.status,
                         "-" if not capped else str(last.max_tokens), "-" if not capped else str(cut)])
            data.append({"budget_usd": budget_usd, "cap_max_tokens": capped, "spent_usd": s.cost_usd,
                         "overshoot_usd": overshoot, "last_turn_cost_usd": last.cost_usd, "turns": s.turns,
                         "status": s.status, "reason": s.reason,
                         "max_tokens_sent": [t.max_tokens for t in s.per_turn], "replies_cut_off": cut})
            checks.append(Check(f"budget {usd(budget_usd)}{' capped' if capped else ''}: overshoot "
                                f"{usd(overshoot)} <= last turn {usd(last.cost_usd)}", fits))
            if capped:
                checks.append(Check(f"budget {usd(budget_usd)} capped: spent {usd(s.cost_usd)} <= budget",
                                    s.cost_usd <= budget_usd))
    plain, capped_runs = data[:3], data[3:]
    return Outcome(
        title="three budgets on `runaway` (no turn cap)",
        tables=[Table(["mode", "budget USD", "spent USD", "overshoot USD", "last turn USD", "overshoot <= last turn",
                       "turns bought", "status", "max_tokens sent last turn", "replies cut off"], rows)],
        summary=(f"Each budget buys a different number of turns ({', '.join(str(d['turns']) for d in plain)}) and "
                 f"every plain run passes its cap, by less than one turn's cost, because the check runs before a "
                 f"turn whose price is only known afterwards. With cap_max_tokens the harness also estimates the "
                 f"next prompt (deliberately high) and caps max_tokens to what is left, stopping when no reply "
                 f"fits: those runs end under the cap (spent "
                 f"{', '.join(usd(d['spent_usd']) for d in capped_runs)}), at the price of a turn or so of budget "
                 f"left unused. The scripted provider honours max_tokens the way a model does (the reply is cut "
                 f"off)."),
        data={"runs": data},
        checks=checks,
    )


def tool_errors(lab: Lab) -> Outcome:
    """recover under the three tool-error policies."""
    runs = {p: lab.run("recover", tool_errors=p) for p in ("text", "generic", "fatal")}
    cheapest = min(s.cost_usd for s in runs.values())
    right = {p: "errors.log" in s.answer for p, s in runs.items()}
    rows = [[p, s.status, str(s.turns), str(s.tool_run_count), usd(s.cost_usd),
             s.answer or f"(none: {s.reason})", yes(right[p]), ratio(s.cost_usd, cheapest)]
            for p, s in runs.items()]
    text, generic = runs["text"], runs["generic"]
    return Outcome(
        title="three tool-error policies on `recover`",
        tables=[Table(["policy", "status", "turns", "tool runs", "cost USD", "answer", "right answer",
                       "cost x cheapest"], rows)],
        lines=["the tool result each policy wrote: " + " | ".join(
            f"{p}: {next((m.content for m in s.messages if m.role == 'tool'), '(none)')!r}" for p, s in runs.items())],
        summary=(f"Only the policy that hands the model the error's own words gets the right answer, for "
                 f"{ratio(text.cost_usd, cheapest)} the cheapest run's cost; the generic message keeps the loop "
                 f"alive but the model gives up politely after {generic.turns} turns."),
        data={p: {"status": s.status, "turns": s.turns, "tool_runs": s.tool_run_count, "cost_usd": s.cost_usd,
                  "answer": s.answer, "reason": s.reason, "right_answer": right[p]} for p, s in runs.items()},
    )


def permanent(lab: Lab) -> Outcome:
    """denied (a read the process may not do) with max_turns=12 under three detection settings."""
    settings: dict[str, dict[str, Any]] = {
        "no detection": {"permanent_errors": False, "max_identical_failures": 0},
        "identical-failure rule only (N=2)": {"permanent_errors": False},
        "permanent errors on (default)": {},
    }
    runs = {label: lab.run("denied", max_turns=12, **cfg) for label, cfg in settings.items()}
    best = runs["permanent errors on (default)"]
    rows = [[label, str(s.turns), str(s.tool_run_count), f"{s.prompt_tokens:,}", usd(s.cost_usd),
             ratio(s.cost_usd, best.cost_usd), s.status, s.reason or ""] for label, s in runs.items()]
    worst = runs["no detection"]
    return Outcome(
        title="a permanent error on `denied` (max_turns=12)",
        tables=[Table(["detection", "turns", "tool runs", "input tokens", "cost USD", "cost x detected",
                       "status", "reason"], rows)],
        summary=(f"Without detection the model retries a call that cannot succeed until the turn cap stops it: "
                 f"{worst.tool_run_count} identical tool runs, {usd(worst.cost_usd)} and no answer. Treating the "
                 f"error as permanent stops the run as failed after {best.turns} turn(s) with the reason on the state."),
        data={label: {"turns": s.turns, "tool_runs": s.tool_run_count, "prompt_tokens": s.prompt_tokens,
                      "cost_usd": s.cost_usd, "status": s.status, "reason": s.reason} for label, s in runs.items()},
    )


def dedupe(lab: Lab) -> Outcome:
    """repeat with and without dedupe, against plan as the same task without the repeat."""
    runs = {"plan (no repeat, baseline)": lab.run("plan"), "repeat": lab.run("repeat"),
            "repeat + dedupe": lab.run("repeat", dedupe=True)}
    base = runs["plan (no repeat, baseline)"]
    rows = []
    for label, s in runs.items():
        cached = sum(1 for r in s.tool_runs if r.source == "cache")
        extra = s.cost_usd - base.cost_usd
        rows.append([label, str(s.turns), f"{s.tool_run_count} (+{cached} cached)", usd(s.cost_usd), usd(extra),
                     f"{extra / base.cost_usd:+.0%}", yes(s.answer == base.answer)])
    rep, ded = runs["repeat"], runs["repeat + dedupe"]
    return Outcome(
        title="duplicate calls on `repeat`",
        tables=[Table(["run", "turns", "tool runs", "cost USD", "extra USD vs baseline", "extra %", "answer same"], rows)],
        summary=(f"The repeated call cost {usd(rep.cost_usd - base.cost_usd)} extra "
                 f"({(rep.cost_usd - base.cost_usd) / base.cost_usd:+.0%}) and dedupe recovered "
                 f"{usd(rep.cost_usd - ded.cost_usd)} of it: it saved a tool run, not a turn, because the model "
                 f"had already been paid to ask for the repeat."),
        data={label: {"turns": s.turns, "tool_runs": s.tool_run_count, "cost_usd": s.cost_usd, "answer": s.answer,
                      "sources": [r.source for r in s.tool_runs]} for label, s in runs.items()},
    )


def double_delete(lab: Lab) -> Outcome:
    """Two identical deletes with different call ids: read-only cache vs caching every tool."""
    settings: dict[str, dict[str, Any]] = {"read-only cache (dedupe)": {}, "naive cache on every tool (dedupe_all)": {"dedupe_all": True}}
    rows, data = [], {}
    for label, cfg in settings.items():
        s = lab.run("double_delete", auto_approve=True, dedupe=True, **cfg)
        second = next(r for r in s.tool_runs if r.call_id == "c2")
        deleted = deleted_files(lab.workspace(s))
        outcome = "cached (never ran)" if second.source == "cache" else ("ok" if second.ok else f"error: {second.error}")
        rows.append([label, str(s.turns), str(s.tool_run_count), json.dumps(deleted), yes(second.source == "run"),
                     outcome, s.answer])
        data[label] = {"turns": s.turns, "tool_runs": s.tool_run_count, "deleted": deleted,
                       "second_delete_ran": second.source == "run", "second_delete": second.model_dump(),
                       "answer": s.answer}
    return Outcome(
        title="two identical deletes on `double_delete` (auto-approved, dedupe on)",
        tables=[Table(["cache", "turns", "tool runs", "files deleted", "second delete ran", "second delete result",
                       "answer"], rows)],
        summary=("With the cache limited to read-only tools both delete calls really run (the second finds "
                 "nothing left to delete and says so); caching every tool silently swallows the second call, "
                 "which is only right when the two calls were meant as one: that is what an idempotency key is for."),
        data=data,
    )


def _stop_for_approval(lab: Lab) -> RunState:
    state = lab.run("destructive")
    if state.interruption is None or state.interruption.type != "approval":
        raise RuntimeError(f"destructive did not stop for approval: {state.status} {state.reason}")
    return state


def approval(lab: Lab) -> Outcome:
    """destructive stops for approval at turn 2; three verdicts, each resumed from disk."""
    first = _stop_for_approval(lab)
    it = first.interruption
    assert it is not None and it.type == "approval"
    verdicts: dict[str, Callable[[FileStore, Lease, RunState, str], None]] = {
        "approve": lambda fs, lease, s, cid: give_verdict(fs, lease, s, cid, "approve"),
        'reject, reason "keep it for the audit"':
            lambda fs, lease, s, cid: give_verdict(fs, lease, s, cid, "reject", "keep it for the audit"),
        "reject with nothing (demo switch)":
            lambda fs, lease, s, cid: give_verdict(fs, lease, s, cid, "reject", "", empty=True),
    }
    rows, data = [], {}
    for label, verdict in verdicts.items():
        stopped = _stop_for_approval(lab)
        runs = FileStore(lab.runs_root)
        lease = runs.claim(stopped.run_id)  # the verdict may come from another process
        state = runs.load(stopped.run_id)
        assert state.interruption is not None and state.interruption.type == "approval"
        verdict(runs, lease, state, state.interruption.call_id)  # committed with its operator event
        runs.release(lease)
        done = lab.resume(state)
        deleted = deleted_files(lab.workspace(done))
        claims_deleted = "deleted access.log" in done.answer.lower()
        true = claims_deleted == ("access.log" in deleted)
        rows.append([label, str(done.turns), json.dumps(deleted), done.answer, yes(true)])
        data[label] = {"turns": done.turns, "deleted": deleted, "answer": done.answer, "answer_true": true,
                       "status": done.status}
    so_far = deleted_files(lab.workspace(first))
    return Outcome(
        title="approval on `destructive`: approve, reject with a reason, reject with nothing",
        tables=[Table(["stopped at turn", "status", "interruption", "files deleted so far"],
                      [[str(first.turns), first.status, f"approval -> {it.tool_name}({json.dumps(it.args)})",
                        json.dumps(so_far)]]),
                Table(["verdict", "total turns", "files deleted", "the agent's final answer", "answer true"], rows)],
        lines=[f"stopped at turn {first.turns}: {first.status} / approval -> {it.tool_name}({json.dumps(it.args)})",
               f"files deleted so far: {json.dumps(so_far)}"],
        summary=("The approval gate held in all three runs, but only a refusal written into the transcript in "
                 "words gives a true report: with an empty tool result the agent tells the user it deleted a file "
                 "that is still there."),
        data={"stop": {"turns": first.turns, "status": first.status, "interruption": it.model_dump(),
                       "deleted_so_far": so_far}, "verdicts": data},
    )


def _cli_json(args: list[str], env: dict[str, str]) -> tuple[int, dict[str, Any] | None]:
    proc = subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=REPO, timeout=120)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        return proc.returncode, None


def resume(lab: Lab) -> Outcome:
    """plan killed (SIGKILL) after its 2nd tool result in one process, resumed in another."""
    env = {"RUNNER_RUNS_DIR": str(lab.runs_root)}
    code, _ = _cli_json(["run", "--base-url", lab.base_url, "--model", "scripted/plan", PROMPTS["plan"], "--json"],
                        {**env, "RUNNER_CRASH_AT": "tool_result:2"})
    if code != -9:
        raise RuntimeError(f"the first process should have been SIGKILLed, exit code {code}")
    (killed,) = store.list_runs(lab.runs_root)
    before = tool_labels(read_trace(store.trace_path(lab.runs_root, killed.run_id)))
    code, out = _cli_json(["resume", killed.run_id, "--json"], env)
    if code != 0 or out is None:
        raise RuntimeError(f"resume failed with exit code {code}")
    resumed = store.load(lab.runs_root, killed.run_id)
    across = tool_labels(read_trace(store.trace_path(lab.runs_root, killed.run_id)))
    ref = lab.run("plan")
    ref_tools = tool_labels(read_trace(store.trace_path(lab.runs_root, ref.run_id)))
    same_cost = abs(resumed.cost_usd - ref.cost_usd) < 1e-12
    same_tools = across == ref_tools
    rows = [["killed + resumed (2 processes)", str(resumed.turns), usd(resumed.cost_usd), str(len(across)),
             ", ".join(across), resumed.status],
            ["uninterrupted (1 process)", str(ref.turns), usd(ref.cost_usd), str(len(ref_tools)), ", ".join(ref_tools),
             ref.status],
            ["equal", yes(resumed.turns == ref.turns), yes(same_cost), yes(same_tools), "", yes(resumed.answer == ref.answer)]]
    return Outcome(
        title="kill -9 and resume on `plan`, across two processes",
        tables=[Table(["run", "turns", "cost USD", "tool runs", "tools (trace tool_start)", "status"], rows)],
        lines=[f"process died after turn {killed.turns}. tool runs so far: {', '.join(before)}",
               f"restored from disk: turns={killed.turns}  cost={usd(killed.cost_usd)}  messages={len(killed.messages)}"
               f"  status={killed.status}",
               f"resumed and finished: turns={resumed.turns}  cost={usd(resumed.cost_usd)}  status={resumed.status}",
               f"tool runs across BOTH processes: {', '.join(across)}"],
        summary=(f"The resumed run asked the model only for the turn it lacked and ran no tool twice: "
                 f"{len(across)} tool runs across both processes and the same final cost as the run that never "
                 f"crashed, because cost lives in the saved state."),
        data={"killed": {"run_id": killed.run_id, "turns": killed.turns, "cost_usd": killed.cost_usd,
                         "messages": len(killed.messages), "status": killed.status, "tools": before},
              "resumed": {"turns": resumed.turns, "cost_usd": resumed.cost_usd, "tools": across,
                          "status": resumed.status, "answer": resumed.answer},
              "uninterrupted": {"turns": ref.turns, "cost_usd": ref.cost_usd, "tools": ref_tools, "answer": ref.answer}},
        checks=[Check("resumed cost equals the uninterrupted cost", same_cost),
                Check("tool runs across both processes equal the uninterrupted run's", same_tools)],
    )


@dataclass
class SlowRun:
    state: RunState
    total_ms: float
    stop_ms: float | None
    """From the Stop signal (token.cancelled_at) to execute returning, ms."""
    progress: list[tuple[float, str]]
    """(t+ms since start, label) of each progress report."""


class DeafScanArchive(ScanArchive):
    """scan_archive as a tool that never checks the Stop signal behaves: it gets a token of
    its own, so Stop reaches only the HTTP layer."""

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        return super().run_sync(args, dataclasses.replace(ctx, cancel=CancelToken()))


def _slow_run(lab: Lab, cancel_at_s: float | None, tools_hear_stop: bool = True) -> SlowRun:
    token = CancelToken()
    progress: list[tuple[float, str]] = []
    state = new_run(PROMPTS["slow"], RunConfig(endpoint=Endpoint(model="scripted/slow")))
    began = time.perf_counter()
    if cancel_at_s is not None:
        threading.Timer(cancel_at_s, token.cancel, args=("user pressed Stop",)).start()

    async def until_execute_returns() -> tuple[RunState, float]:
        tools: list[Tool | str] | None = None
        if not tools_hear_stop:
            tools = [*(t for t in DEFAULT_TOOLS if t != "scan_archive"), DeafScanArchive()]
        done = await drive(state, lab.base_url, lab.runs_root, cancel=token, tools=tools,
                             on_progress=lambda tool, label: progress.append(((time.perf_counter() - began) * 1000, label)))
        return done, time.perf_counter()  # before asyncio.run's own teardown

    state, ended = asyncio.run(until_execute_returns())
    stop_ms = (ended - token.cancelled_at) * 1000 if token.cancelled_at is not None else None
    return SlowRun(state, (ended - began) * 1000, stop_ms, progress)


def cancel_reason(state: RunState) -> str | None:
    it = state.interruption
    return it.reason if it is not None and it.type == "cancelled" else None


def cancel(lab: Lab) -> Outcome:
    """slow (a ~3 s tool) uncancelled, Stop at 1.2 s x5, and Stop delivered only to HTTP."""
    plain = _slow_run(lab, None)
    stopped = [_slow_run(lab, 1.2) for _ in range(5)]
    http_only = _slow_run(lab, 1.2, tools_hear_stop=False)
    stop_ms = [r.stop_ms for r in stopped if r.stop_ms is not None]

    def progress(r: SlowRun) -> str:
        return ", ".join(f"{label.split()[1]} @ t+{ms:,.0f}" for ms, label in r.progress)

    def row(label: str, r: SlowRun, total: str | None = None, stop: str | None = None) -> list[str]:
        return [label, total or f"{r.total_ms:,.0f}", stop or (f"{r.stop_ms:,.1f}" if r.stop_ms is not None else "-"),
                progress(r), r.state.status, r.state.reason or ""]

    rows = [row("no cancellation", plain),
            row("Stop at 1.2 s, reaches the tool (5 runs)", stopped[0],
                total=spread([r.total_ms for r in stopped], 0), stop=spread(stop_ms)),
            row("Stop at 1.2 s, HTTP only (a scan_archive deaf to Stop)", http_only)]
    lines = [f"progress: {label}  (t+{ms:,.0f} ms)" for ms, label in plain.progress[:2]] + [
        f"no cancellation:            stopped after {plain.total_ms:,.0f} ms, status={plain.state.status}",
        f"user presses Stop at 1.2 s: stopped after {stopped[0].total_ms:,.0f} ms, status={stopped[0].state.status}, "
        f"reason={cancel_reason(stopped[0].state)!r}",
        f"Stop wired to HTTP only:    stopped after {http_only.total_ms:,.0f} ms "
        f"({http_only.stop_ms or 0:,.0f} ms after Stop), status={http_only.state.status}",
        "stop latency of the 5 cancelled runs (ms): " + ", ".join(f"{v:.1f}" for v in stop_ms)]
    return Outcome(
        title="cancellation on `slow` (scan_archive, ~3 s)",
        tables=[Table(["case", "total ms (min / median / max)", "stop latency ms (min / median / max)",
                       "progress: files scanned @ t+ms (first run)", "status", "reason"], rows)],
        lines=lines,
        summary=(f"When the Stop signal reaches the tool the run stops {statistics.median(stop_ms):.1f} ms (median of "
                 f"5, max {max(stop_ms):.1f}) after the click; delivered only to the HTTP call, the same Stop waits "
                 f"{(http_only.stop_ms or 0) / 1000:.1f} s for the scan to finish and cancels work that is already done."),
        data={"no_cancel": {"total_ms": plain.total_ms, "status": plain.state.status, "progress": plain.progress},
              "cancelled": [{"total_ms": r.total_ms, "stop_ms": r.stop_ms, "status": r.state.status,
                             "reason": r.state.reason, "progress": r.progress} for r in stopped],
              "http_only": {"total_ms": http_only.total_ms, "stop_ms": http_only.stop_ms,
                            "status": http_only.state.status, "reason": http_only.state.reason,
                            "progress": http_only.progress}},
        checks=[Check(f"stop latency {max(stop_ms):.1f} ms (max of 5) <= 50 ms", max(stop_ms) <= 50)],
    )


def _timed_plan(lab: Lab, base_url: str) -> dict[str, float]:
    """One plan run. wall_ms is measured around execute(); loop_ms is the state's own wall time
    (inside loop.run); provider_ms is summed over the turns' HTTP calls. All in ms."""
    state = new_run(PROMPTS["plan"], RunConfig(endpoint=Endpoint(model="scripted/plan")))
    began = time.perf_counter()
    state = lab.resume(state, base_url=base_url)
    wall_ms = (time.perf_counter() - began) * 1000
    provider_ms = sum(t.provider_ms for t in state.per_turn)
    return {"wall_ms": wall_ms, "loop_ms": state.wall_ms, "provider_ms": provider_ms, "turns": state.turns,
            "overhead_ms": wall_ms - provider_ms, "setup_ms": wall_ms - state.wall_ms,
            "overhead_per_turn_ms": (wall_ms - provider_ms) / state.turns,
            "loop_overhead_per_turn_ms": (state.wall_ms - provider_ms) / state.turns}


def _latency_row(label: str, samples: list[dict[str, float]]) -> list[str]:
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    return [label, str(len(samples)), f"{med['wall_ms']:,.1f}", f"{med['provider_ms']:,.1f}",
            f"{med['provider_ms'] / med['wall_ms']:.1%}", f"{med['overhead_ms']:,.1f}",
            spread([s["overhead_per_turn_ms"] for s in samples], 2), f"{med['setup_ms']:,.1f}",
            f"{med['loop_overhead_per_turn_ms']:,.2f}"]


def latency(lab: Lab) -> Outcome:
    """plan at provider latencies 0, 100, 500, 1000 ms: wall vs provider time, the harness's overhead."""
    repeats = {0: 5, 100: 3, 500: 3, 1000: 3}
    rows, data = [], {}
    for latency_ms, n in repeats.items():
        with ScriptedServer(ScriptedSettings(latency_ms=latency_ms)) as server:
            _timed_plan(lab, server.base_url)  # warm-up, discarded: first connection, first tokenizer call
            data[str(latency_ms)] = [_timed_plan(lab, server.base_url) for _ in range(n)]
            if latency_ms == 0:
                data["0_x30"] = [_timed_plan(lab, server.base_url) for _ in range(30)]
        rows.append(_latency_row(str(latency_ms), data[str(latency_ms)]))
    rows.append(_latency_row("0 (30 runs)", data["0_x30"]))
    long_run = data["0_x30"]
    per_turn = [s["overhead_per_turn_ms"] for s in long_run]
    setup_ms = statistics.median(s["setup_ms"] for s in long_run)
    loop_ms = statistics.median(s["loop_overhead_per_turn_ms"] for s in long_run)
    slowest_ms = statistics.median(s["wall_ms"] for s in data["1000"])
    return Outcome(
        title="provider latency vs wall time on `plan` (3 turns)",
        tables=[Table(["provider latency ms", "runs", "wall ms", "provider ms", "provider share", "harness overhead ms",
                       "overhead per turn ms (min / median / max)", "of which setup ms", "in-loop overhead per turn ms"],
                      rows)],
        lines=[f"harness overhead per turn at 0 ms over 30 runs (min / median / max): {spread(per_turn, 2)} ms"],
        summary=(f"Harness overhead is wall time around execute() minus time inside the HTTP calls (every "
                 f"transition committed with its trace lines at the default durability, a client per run; medians "
                 f"unless a spread is shown; one warm-up run per server discarded). It is about {statistics.median(per_turn):.1f} ms a turn at 0 ms, "
                 f"{setup_ms:.0f} ms of it per run spent before the loop starts (the client and the run's creation) and "
                 f"{loop_ms:.1f} ms a turn inside it, while at 1000 ms the same three turns take "
                 f"{slowest_ms / 1000:.1f} s: wall time is turns times provider latency, and the model picks the turns."),
        data={"definitions": {"wall_ms": "around harness.execute()", "loop_ms": "state.wall_ms (inside loop.run)",
                              "provider_ms": "sum of per_turn provider_ms", "overhead_ms": "wall_ms - provider_ms",
                              "setup_ms": "wall_ms - loop_ms"},
              "samples": data},
    )


def local_suite(lab: Lab) -> Outcome:
    """The six suite tasks on the local model (llama.cpp; Qwen if pulled, else the packaged SmolLM2)."""
    try:
        from runner import render, suite

        def say(line: str) -> None:
            print(line, file=sys.stderr, flush=True)

        report = suite.run_suite("local", runs_root=lab.runs_root, max_turns=8,
                                 on_result=lambda r: say(render.progress_line(r)), on_note=say)
    except (ImportError, AttributeError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
        return Outcome(title="the six tasks on the local model", summary=f"skipped: {reason}",
                       data={"skipped": reason})
    results = report.results
    rows = [[r.task, r.status, str(r.turns), str(r.tool_runs), f"{r.prompt_tokens:,}", f"{r.completion_tokens:,}",
             f"{r.wall_ms:,.0f}", f"{r.mean_turn_ms:,.0f}", yes(r.correct),
             " ".join((r.answer or f"({r.reason})").split())[:90]]
            for r in results]
    t = suite.totals(results)
    rows.append(["TOTAL", "", str(t["turns"]), str(t["tool_runs"]), f"{t['prompt_tokens']:,}",
                 f"{t['completion_tokens']:,}", f"{t['wall_ms']:,.0f}", f"{t['mean_turn_ms']:,.0f}",
                 f"{t['correct']}/{len(results)}", ""])
    turns = sorted({r.turns for r in results})
    cut_off = [r.task for r in results
               if any(t.finish_reason == "length" for t in store.load(lab.runs_root, r.run_id).per_turn)]
    return Outcome(
        title=f"the six tasks on the local model ({report.model})",
        tables=[Table(["task", "status", "turns", "tool runs", "prompt tok", "completion tok", "wall ms",
                       "mean turn ms", "correct", "answer"], rows, in_markdown=False)],
        extra_md=render.markdown(report).strip(),
        summary=(f"{report.model} answered {t['correct']} of {len(results)} tasks correctly in "
                 f"{t['turns']} turns ({', '.join(map(str, turns))} per task) and {t['tool_runs']} tool runs; a "
                 f"turn took {t['mean_turn_ms']:,.0f} ms on average on this CPU. {len(cut_off)} answer(s) were cut "
                 f"off by the token limit (finish_reason=length: {', '.join(cut_off) or 'none'}) and still count as "
                 f"completed. The harness ran every task to a recorded stop; whether the answers are right is the "
                 f"model's business."),
        data={**report.model_dump(), "cut_off_by_token_limit": cut_off},
    )


HARNESS_STEPS: list[tuple[str, list[str]]] = [
    ("tagged calls only", []),
    ("+ wave 3's set: first-turn required, untagged calls, corrective retries, answer forcing, answer on stall, "
     "one call per turn, results restated",
     ["first_turn_required", "untagged_calls", "corrective_retries", "answer_forcing", "answer_on_stall",
      "one_call_per_turn", "restate_results"]),
    ("+ listing in prompt (with the extremes for a size question), evidence first",
     ["listing_in_prompt", "listing_extremes", "evidence_first", "abstain_check"]),
    ("+ path choices, answer check, table extremes", ["path_choices", "answer_check", "table_extremes"]),
    ("+ confidence check", ["confidence_check"]),
]
"""The techniques of `local_harness` by policy name (`runner policies`), each row adding its
names to those above; a model gets only the names of its manifest set (`runner policies`)
plus the ones it lacks on the earlier rows, so the last row is the manifest's own set."""
HARNESS_SUITES = ("test", "six-task")
"""Where `local_harness` measures: the test half of the development set, beside the six-task suite."""


def local_harness(lab: Lab) -> Outcome:
    """Per local model: the test half and the six-task suite, with each group of steering
    policies added in turn; every row from this one run."""
    from runner import models
    from runner import steering as policies
    from runner.local import LocalServer
    from runner.suite import load_suite, run_suite, shipped_suites

    suites = [load_suite(f) for f in shipped_suites("test")] + [load_suite()]
    present = [r.name for r in models.list_models() if r.present and r.name in LOCAL_HARNESS_MODELS]
    only = os.environ.get("RUNNER_HARNESS_MODELS")
    present = [n for n in present if not only or n in only.split(",")]
    first = int(os.environ.get("RUNNER_HARNESS_FIRST_ROW", "0"))
    rows: list[list[str]] = []
    data: list[dict[str, Any]] = []
    load_before = [round(x, 2) for x in os.getloadavg()]
    for name in present:
        path = models.resolve(name)
        entry = models.entry_for(name, path)
        assert entry is not None
        kept = set(policies.active_for_entry(entry))
        names: list[str] = []
        for i, (label, step) in enumerate(HARNESS_STEPS):
            before = names
            names = [n for n in policies.POLICIES if n in names or (n in step and (n in kept or n in NEW_UNKEPT))]
            if i < first:
                rows.append([entry.name, label, "not run (RUNNER_HARNESS_FIRST_ROW)", "", "", "", "", ""])
                continue
            if i and names == before:
                rows.append([entry.name, label, "not run: no change for this model", "", "", "", "", ""])
                continue
            print(f"local_harness: {name}: {label}: {', '.join(names) or 'none'}", file=sys.stderr, flush=True)
            server = LocalServer(path, model_name=path.stem, untagged_calls="on" if "untagged_calls" in names else "off").start()
            try:
                row = _harness_row(lab, name, path, server, names, entry, suites, run_suite)
            finally:
                server.stop()
            rows.append([entry.name, label, *[f"{row['correct'][s]}/{row['n'][s]}" for s in HARNESS_SUITES],
                         str(row["wrong"]["test"]), str(row["abstained"]["test"]), str(row["malformed"]),
                         f"{row['mean_turn_ms']:,.0f}"])
            data.append({"model": name, "technique": label, "policies": names, **row})
    load_after = [round(x, 2) for x in os.getloadavg()]
    return Outcome(
        title="what the harness adds to small local models, on the test half and the six-task suite",
        tables=[Table(["model", "policies (added to those above)", "test correct", "six-task correct", "test wrong",
                       "test abstained", "malformed calls", "mean turn ms"], rows)],
        summary=(f"Every row is the test half of the development set and the six-task suite (max 8 turns, greedy) "
                 f"run in this one experiment; load average {' '.join(map(str, load_before))} at the start, "
                 f"{' '.join(map(str, load_after))} at the end (2 cores shared). Policies not in a model's manifest "
                 f"set are left out of its rows (the last row is the manifest's set). 'malformed calls' counts "
                 f"calls naming an unknown tool or with arguments their schema rejects, plus unparsable call blocks."),
        data={"rows": data, "load_before": load_before, "load_after": load_after},
    )


NEW_UNKEPT: frozenset[str] = frozenset()
"""Policies measured on every model's rows even when its manifest does not keep them."""
LOCAL_HARNESS_MODELS = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct")
"""The models `local_harness` measures, in this order, when they are on disk (RUNNER_HARNESS_MODELS=a,b: only
those; RUNNER_HARNESS_FIRST_ROW=N: leave out the rows before the N-th, from 0)."""


def _harness_row(lab: Lab, name: str, path: Path, server: Any, names: list[str], entry: Any, suites: list[Any],
                 run_suite: Callable[..., Any]) -> dict[str, Any]:
    """The suites on `server` with exactly the policies `names`; counts per split."""
    from runner import steering as policies

    root = lab.runs_root / f"{name}-{len(list(lab.runs_root.glob(name + '-*')))}"
    fields = policies.fields_for(names, entry.harness_defaults())
    own, at_endpoint = policies.split_fields(fields)
    column = Endpoint(model=path.stem, base_url=server.base_url, local_model=str(path), **at_endpoint)
    report = run_suite("local", root, columns=[column], max_turns=8, run_settings=own, system_addendum="",
                       suites=suites)
    results = report.results
    per_turn = [t for r in results for t in store.load(root, r.run_id).per_turn]
    unparsed = sum(1 for t in per_turn if t.slip == "unparsed_tool_call")

    def count(split: str, verdict: str | None = None) -> int:
        return sum(1 for r in results if (r.split or "six-task") == split and (verdict is None or r.verdict == verdict))

    return {
        "n": {s: count(s) for s in HARNESS_SUITES},
        "correct": {s: count(s, "correct") for s in HARNESS_SUITES},
        "wrong": {s: count(s, "wrong") for s in HARNESS_SUITES},
        "abstained": {s: count(s, "abstained") for s in HARNESS_SUITES},
        "malformed": sum(r.invalid_calls for r in results) + unparsed,
        "mean_turn_ms": statistics.fmean(t.ms for t in per_turn) if per_turn else 0.0,
        "statuses": dict(Counter(r.status for r in results)),
        "answers": [{"task": r.task, "verdict": r.verdict, "answer": r.answer, "why_wrong": r.why_wrong,
                     "status": r.status} for r in results],
    }


EXPERIMENTS: dict[str, Callable[[Lab], Outcome]] = {
    "turn_cap": turn_cap, "budgets": budgets, "tool_errors": tool_errors, "permanent": permanent,
    "dedupe": dedupe, "double_delete": double_delete, "approval": approval, "resume": resume,
    "cancel": cancel, "latency": latency, "local_suite": local_suite, "local_harness": local_harness,
}


def main(argv: list[str] | None = None) -> int:
    global OUT_DIR, RUNS_DIR
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"experiments to run (default: all): {', '.join(EXPERIMENTS)}")
    parser.add_argument("--skip-local", action="store_true", help="leave out local_suite and local_harness (the slow ones)")
    parser.add_argument("--list", action="store_true", help="list the experiments and exit")
    parser.add_argument("--out", type=Path, help="where reports go [default: experiments/ in the runs directory]")
    parser.add_argument("--runs-dir", type=Path, help="the runs directory [default: $RUNNER_RUNS_DIR or ./runs]")
    parser.add_argument("--journal", type=Path, help="append each experiment's dated section to this file "
                        "[default: journal.md beside the reports; docs/journal.md: the checkout's journal]")
    args = parser.parse_args(argv)
    if args.list:
        width = max(shutil.get_terminal_size().columns, 40)  # $COLUMNS, the terminal, else 80
        for name, fn in EXPERIMENTS.items():
            about = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
            print(textwrap.fill(about, width, initial_indent=f"{name:<14} ", subsequent_indent=" " * 15))
        return 0
    unknown = [n for n in args.names if n not in EXPERIMENTS]
    if unknown:
        print(f"error: unknown experiment(s) {', '.join(unknown)}; known: {', '.join(EXPERIMENTS)}", file=sys.stderr)
        return 2
    names = [n for n in (args.names or EXPERIMENTS) if not (args.skip_local and n.startswith("local_"))]
    if not names:
        print("error: nothing to run: --skip-local leaves out local_suite, the only experiment named", file=sys.stderr)
        return 2
    OUT_DIR = args.out or store.runs_dir(args.runs_dir) / "experiments"
    RUNS_DIR = OUT_DIR / "_runs"
    if not OUT_DIR.exists():
        print(f"creating {OUT_DIR}", file=sys.stderr)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    failures: list[str] = []
    with ScriptedServer(ScriptedSettings()) as server:
        for name in names:
            root = RUNS_DIR / name
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            started = time.perf_counter()
            try:
                outcome = EXPERIMENTS[name](Lab(server.base_url, root))
            except Exception as exc:
                traceback.print_exc()
                failures.append(f"{name}: crashed: {type(exc).__name__}: {exc}")
                continue
            outcome.elapsed_s = time.perf_counter() - started
            print_outcome(name, outcome)
            write_outcome(name, outcome)
            append_journal(args.journal or OUT_DIR / "journal.md", name, outcome)
            failures += [f"{name}: {c.label}" for c in outcome.checks if not c.ok]
    summary = write_summary()
    print(f"\nwrote {', '.join(f'{name}.md' for name in names)} (each with its .json) in {OUT_DIR}")
    print(f"summary: {summary}")
    print(f"journal: {args.journal or OUT_DIR / 'journal.md'}")
    print(f"total time: {time.perf_counter() - began:.1f} s for {len(names)} experiment(s)")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
