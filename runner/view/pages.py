"""What the view's pages show, as plain data built from a store: the runs list with its
filters and totals, one run's transcript (messages joined with what the trace says about
each turn and call), its stop and how to continue it, and the per-turn chart as inline SVG.

Nothing here writes to the store or knows about HTTP; `runner.view.app` renders these with
autoescaping templates, so every string from a run (prompts, replies, tool results, errors)
reaches the browser as text, never as markup.
"""

from __future__ import annotations

import json
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

from runner.render import Total, gen_tok_s
from runner.state import RunState, ToolRun, TurnRecord, call_signature, pending
from runner.store import RunInfo, RunStore, ShownStatus
from runner.trace import TraceEvent, TurnEvent

PAGE_SIZE = 50
"""Runs per page of the runs list."""
STATUSES: tuple[str, ...] = typing.get_args(ShownStatus)
"""The statuses the runs list filters by (`runner.store.ShownStatus`)."""


@dataclass
class RunsPage:
    """One page of the runs list: the rows shown, the filters, and totals over every run that
    matches the filters (not only this page)."""

    rows: list[RunInfo]
    totals: Total
    matching: int
    page: int
    pages: int
    status: str
    model: str
    text: str
    models: list[str]
    """Every model seen in the store (for the filter's choices)."""


def runs_page(store: RunStore, *, status: str = "", model: str = "", text: str = "", page: int = 1) -> RunsPage:
    """The runs list, newest first, filtered by shown status, model (exact) and `text` (a
    case-insensitive substring of the run id, model, prompt, answer or stop reason)."""
    infos = store.list_runs(status=status or None)
    models = sorted({i.state.config.endpoint.model for i in infos})
    needle = text.strip().lower()
    chosen = [i for i in infos if (not model or i.state.config.endpoint.model == model) and (not needle or needle in _haystack(i))]
    totals = Total("shown")
    for info in chosen:
        totals.add(info.state)
    pages = max(1, -(-len(chosen) // PAGE_SIZE))
    page = min(max(1, page), pages)
    rows = chosen[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
    return RunsPage(rows, totals, len(chosen), page, pages, status, model, text, models)


def _haystack(info: RunInfo) -> str:
    state = info.state
    prompt = next((m.content or "" for m in state.messages if m.role == "user"), "")
    return " ".join([state.run_id, state.config.endpoint.model, prompt, state.answer, state.reason or ""]).lower()


def first_prompt(state: RunState) -> str:
    """The run's first user message (what it was asked)."""
    return next((m.content or "" for m in state.messages if m.role == "user"), "")


@dataclass
class VerdictView:
    verdict: str
    by: str
    reason: str | None
    at: str


@dataclass
class CallView:
    """One tool call with everything known about it: arguments, result, timings, verdicts."""

    call_id: str
    name: str
    arguments: str
    """Pretty-printed JSON when the arguments parse, else as the model sent them."""
    signature: str
    """Tool name + digest of the canonical arguments: what an approval is bound to."""
    result: str | None = None
    run: ToolRun | None = None
    child_run_id: str | None = None
    omitted_chars: int | None = None
    verdicts: list[VerdictView] = field(default_factory=list)
    approval_required: bool = False
    in_doubt: bool = False
    cancelled: str | None = None
    progress: str | None = None
    """The last progress label the tool reported."""
    server: str | None = None
    """The MCP server that answered the call (its name in the run), if one did."""
    pending: bool = False
    awaiting_verdict: bool = False
    """The run stopped for the operator's verdict on this call."""


@dataclass
class Entry:
    """One transcript entry: a message, or a note from the trace (a slip, a retry)."""

    role: str
    """system, user, assistant, tool (a result with no call), or note."""
    text: str = ""
    turn: int | None = None
    calls: list[CallView] = field(default_factory=list)
    turn_event: TurnEvent | None = None
    rewrites: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""
    """For a message the harness added: what it is and the policy that sent it."""


@dataclass
class RunView:
    """One run as its page shows it."""

    info: RunInfo
    events: list[TraceEvent]
    entries: list[Entry]
    continue_with: list[str]
    """CLI commands that continue the run from where it stopped (empty when final)."""
    children: list[str]
    created: str

    @property
    def state(self) -> RunState:
        return self.info.state


def run_view(store: RunStore, run_id: str) -> RunView:
    """Everything the run page shows.

    Raises:
        RunNotFound, CorruptState: as `RunStore.info`.
    """
    info = store.info(run_id)
    events = store.read_trace(run_id)
    state = info.state
    children = sorted({e.childRunId for e in events if e.type == "tool_result" and e.childRunId})
    return RunView(info, events, transcript(state, events), continue_with(info), children, _iso(state.created_at))


def transcript(state: RunState, events: list[TraceEvent]) -> list[Entry]:
    """The run's messages in order, each tool call joined with its result message, its tool
    run record and the trace's events for it; protocol slips (billed replies that were not
    kept) appear as notes before the turn that was asked again."""
    results = {m.tool_call_id: m.content or "" for m in state.messages if m.role == "tool" and m.tool_call_id}
    runs = {r.call_id: r for r in state.tool_runs}
    waiting = state.interruption.call_id if state.interruption and state.interruption.type == "approval" else None
    unanswered = {c.id for c in pending(state)}
    kept: dict[int, TurnEvent] = {}
    slips: list[TurnEvent] = []
    for e in events:
        if e.type == "turn" and e.slip:
            slips.append(e)
        elif e.type == "turn":
            kept[e.turn] = e
    replies = [kept[t] for t in sorted(kept)]  # the k-th kept reply is the k-th assistant message
    calls_seen = {c.id for m in state.messages for c in (m.tool_calls or [])}
    entries: list[Entry] = []
    turn, answered = 0, 0
    for message in state.messages:
        if message.role == "assistant":
            event = replies[answered] if answered < len(replies) else None
            answered += 1
            before, turn = turn, event.turn if event else turn + 1
            entries.extend(Entry("note", f"turn {s.turn}: a protocol slip ({s.slip}) was billed and asked again"
                                 + (f"; it said: {s.content}" if s.content else ""), turn=s.turn)
                           for s in slips if before < s.turn < turn)
            calls = [_call_view(c.id, c.function.name, c.function.arguments, results, runs, events,
                                pending=c.id in unanswered, waiting=c.id == waiting) for c in message.tool_calls or []]
            entries.append(Entry("assistant", message.content or "", turn, calls, event,
                                 list(event.rewrites or []) if event else []))
        elif message.role == "tool":
            if message.tool_call_id not in calls_seen:
                entries.append(Entry("tool", message.content or "", turn))
        else:
            entries.append(Entry(message.role, message.content or "", turn or None,
                                 label=f"runner · {message.harness.label}" if message.harness else ""))
    entries.extend(Entry("note", f"turn {s.turn}: a protocol slip ({s.slip}) was billed, not kept"
                         + (f"; it said: {s.content}" if s.content else ""), turn=s.turn)
                   for s in slips if s.turn > turn)
    return entries


def _call_view(call_id: str, name: str, arguments: str, results: dict[str, str], runs: dict[str, ToolRun],
               events: list[TraceEvent], *, pending: bool, waiting: bool) -> CallView:
    try:
        shown = json.dumps(json.loads(arguments or "{}"), indent=1, ensure_ascii=False)
    except ValueError:
        shown = arguments
    view = CallView(call_id, name, shown, call_signature(name, arguments), results.get(call_id), runs.get(call_id),
                    pending=pending,
                    awaiting_verdict=waiting)
    for e in events:
        if getattr(e, "callId", None) != call_id:
            continue
        if e.type == "tool_result":
            view.child_run_id = e.childRunId or view.child_run_id
            view.omitted_chars = e.omittedChars or view.omitted_chars
        elif e.type == "verdict":
            view.verdicts.append(VerdictView(e.verdict, e.by, e.reason, _iso(e.ts)))
        elif e.type == "approval_required":
            view.approval_required, view.in_doubt = True, e.inDoubt
        elif e.type == "tool_cancelled":
            view.cancelled = e.reason
        elif e.type == "tool_progress":
            view.progress = e.label
        elif e.type == "mcp_call":
            view.server = e.server
    return view


def continue_with(info: RunInfo) -> list[str]:
    """How to continue a run from its stop, as the CLI's own summary says it."""
    state, run_id = info.state, info.state.run_id
    it = state.interruption
    if info.shown_status == "queued":
        return ["runner worker   (a worker drives queued runs)", f"runner resume {run_id}"]
    if info.shown_status == "damaged":
        return [f"runner repair {run_id}   (rebuilds it from its last good record, saying what it drops)"]
    if info.shown_status == "died":
        return [f"runner resume {run_id}", "runner worker"]
    if state.status in ("completed", "failed", "running"):
        return []
    if it is not None and it.type == "approval":
        return [f"runner resume {run_id} --approve {it.call_id}",
                f"runner resume {run_id} --reject {it.call_id} --reason TEXT"]
    if state.status == "max_turns_exceeded":
        return [f"runner resume {run_id} --max-turns N   (N > {state.turns}; 0: no cap)"]
    if state.status == "budget_exceeded":
        return [f"runner resume {run_id} --max-budget USD   (more than ${state.cost_usd:.6f})"]
    return [f"runner resume {run_id}"]


def trace_lines(events: list[TraceEvent]) -> list[str]:
    """The raw trace: one JSON object per event, as `runner trace --json` prints it."""
    return [e.model_dump_json(exclude_none=True) for e in events]


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


# --- the per-turn chart ---------------------------------------------------------------------

CHART_SERIES = (
    ("prompt_tokens", "prompt tokens", "{:,.0f}"),
    ("completion_tokens", "completion tokens", "{:,.0f}"),
    ("cost_usd", "cost USD", "{:.6f}"),
    ("ms", "ms", "{:,.0f}"),
)
_PANEL_W, _PANEL_H, _LABEL_W = 640, 64, 150


def tok_s(record: TurnRecord) -> str:
    """A turn's generation speed, tokens/s, as the run page shows it ("—" without engine timings)."""
    rate = gen_tok_s(record)
    return "—" if rate is None else f"{rate:.1f}"


def turn_chart(state: RunState) -> Markup:
    """An inline SVG: one row of bars per series (prompt tokens, completion tokens, cost in
    USD, wall ms), one bar per model call in `state.per_turn`, each bar titled with its value.
    Every number is formatted here; the only text is the fixed series names."""
    turns = state.per_turn
    if not turns:
        return Markup('<p class="muted">no model calls yet</p>')
    bar_w = max(2.0, min(36.0, (_PANEL_W - _LABEL_W) / len(turns)))
    height = len(CHART_SERIES) * (_PANEL_H + 18) + 18
    width = _LABEL_W + bar_w * len(turns) + 10
    parts = [f'<svg class="chart" role="img" aria-label="per-turn chart" width="{width:.0f}" height="{height}" '
             f'viewBox="0 0 {width:.0f} {height}" data-turns="{len(turns)}" xmlns="http://www.w3.org/2000/svg">']
    for row, (key, label, fmt) in enumerate(CHART_SERIES):
        values = [float(getattr(t, key)) for t in turns]
        top = row * (_PANEL_H + 18) + 14
        peak = max(values) or 1.0
        parts.append(f'<text class="label" x="0" y="{top + _PANEL_H / 2:.0f}">{escape(label)}</text>')
        parts.append(f'<text class="peak" x="0" y="{top + _PANEL_H / 2 + 14:.0f}">max {escape(fmt.format(peak))}</text>')
        parts.append(f'<line class="axis" x1="{_LABEL_W}" x2="{width - 4:.0f}" y1="{top + _PANEL_H}" y2="{top + _PANEL_H}"/>')
        for i, (t, value) in enumerate(zip(turns, values)):
            h = max(1.0, value / peak * _PANEL_H)
            x = _LABEL_W + i * bar_w
            kind = "bar slip" if t.slip else f"bar s{row}"
            tip = f"turn {t.turn}: {fmt.format(value)} {label}" + (" (slip)" if t.slip else "")
            parts.append(f'<rect class="{kind}" data-series="{key}" x="{x + 1:.1f}" y="{top + _PANEL_H - h:.1f}" '
                         f'width="{max(1.0, bar_w - 2):.1f}" height="{h:.1f}"><title>{escape(tip)}</title></rect>')
    parts.append(f'<text class="peak" x="{_LABEL_W}" y="{height - 2}">turns 1–{turns[-1].turn} →</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


# --- suite reports ----------------------------------------------------------------------------


@dataclass
class SuiteFile:
    name: str
    """The report's stem, e.g. suite-20261201-060921."""
    path: Path
    has_plot: bool
    created: str


def suite_files(runs_root: Path) -> list[SuiteFile]:
    """The suite reports under the runs directory, newest first."""
    if not runs_root.is_dir():
        return []
    found = [SuiteFile(p.stem, p, p.with_suffix(".png").exists(), _iso(p.stat().st_mtime))
             for p in runs_root.glob("suite-*.json")]
    return sorted(found, key=lambda f: f.name, reverse=True)


def suite_file(runs_root: Path, name: str) -> SuiteFile | None:
    """One report by name; None for a name that is not a report here (no paths accepted)."""
    return next((f for f in suite_files(runs_root) if f.name == name), None)
