"""A run as a person reads it: the transcript behind `runner show`, and the lines that say how
a stopped run continues.

Pure functions of a `RunState` and its trace events, returning text; the CLI prints it.
Plain text fits a terminal width (each line cut with "…", tool results cut to a few lines
unless `full`); Markdown keeps everything.
"""

from __future__ import annotations

import json
import re
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runner.state import Message, RunState, TurnRecord
from runner.trace import TraceEvent

RESULT_LINES = 6
"""Lines of a tool result (and of the system prompt) shown without --full."""


def fit(line: str, width: int) -> str:
    """`line` cut to `width` characters, ending in "…" when cut."""
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def when(ts: float) -> str:
    """A Unix time as "YYYY-MM-DD HH:MM" in UTC."""
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def next_steps(state: RunState) -> list[str]:
    """What a person can do next with a stopped run, one line each (empty when it is final)."""
    rid = state.run_id
    it = state.interruption
    if it is not None and it.type == "approval":
        return [f"waiting for approval: {it.tool_name}({json.dumps(it.args)})  call id {it.call_id}"
                + ("  [in doubt: it may already have run]" if it.in_doubt else ""),
                f"approve with: runner resume {rid} --approve {it.call_id}",
                f"reject with:  runner resume {rid} --reject {it.call_id} --reason TEXT"]
    if state.status == "max_turns_exceeded":
        return [f"resume with: runner resume {rid} --max-turns N   (N > {state.turns}; 0: no cap)"]
    if state.status == "budget_exceeded":
        return [f"resume with: runner resume {rid} --max-budget USD   (more than ${state.cost_usd:.6f})"]
    if state.status in ("interrupted", "running"):
        return [f"resume with: runner resume {rid}"]
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


def _args(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments or "{}"), ensure_ascii=False)
    except json.JSONDecodeError:
        return arguments


def _body(text: str, width: int, full: bool, indent: str, *, wrap: bool = False, capped: bool = True) -> list[str]:
    """`text` indented: wrapped to `width` (prose) or each line cut to it (tool output); at most
    `RESULT_LINES` lines when `capped` and not `full`."""
    lines = text.splitlines() or [""]
    if wrap:
        lines = [part for line in lines
                 for part in (textwrap.wrap(line, max(width - len(indent), 20), break_on_hyphens=False) or [""])]
    shown = lines if full or not capped else lines[:RESULT_LINES]
    out = [indent + line if full else fit(indent + line, width) for line in shown]
    if len(shown) < len(lines):
        out.append(f"{indent}… {len(lines) - len(shown)} more lines (--full shows all)")
    return out


def header(state: RunState) -> list[str]:
    """Three lines: the run, its model and status; when it started, turns, tool runs and wall
    time; tokens and cost."""
    tools = state.tool_run_count
    return [f"run {state.run_id}  {state.config.model}  {state.status}",
            f"started {when(state.created_at)} UTC · {state.turns} turn{'s' * (state.turns != 1)} · "
            f"{tools} tool run{'s' * (tools != 1)} · {state.wall_ms / 1000:.1f} s",
            f"tokens {state.prompt_tokens:,} in / {state.completion_tokens:,} out · cost ${state.cost_usd:.6f}"]


def text_lines(state: RunState, events: Sequence[TraceEvent], width: int = 80, full: bool = False) -> list[str]:
    """The transcript as plain text lines of at most `width` characters (unless `full`)."""
    out = [fit(line, width) for line in header(state)]
    records = iter(_turns(state))
    verdicts = _verdicts(events)
    runs = {r.call_id: r for r in state.tool_runs}
    for m in state.messages:
        out.append("")
        if m.role in ("system", "user"):
            out.append(f"── {m.role} " + "─" * max(width - len(m.role) - 4, 0))
            out += _body(m.content or "", width, full, "", wrap=True)
        elif m.role == "assistant":
            out += _assistant(m, next(records, None), width, full)
        elif m.role == "tool":
            record = runs.get(m.tool_call_id or "")
            mark = "←" if record is None or record.ok else "✗"
            label = f"  {mark} {m.name or 'tool'}"
            if record is not None and record.source != "run":
                label += f" ({record.source})"
            if record is not None:
                label += f"  {record.ms:,.0f} ms"
            out.append(fit(label, width))
            if m.tool_call_id in verdicts:
                out.append(fit(f"    {verdicts[m.tool_call_id]}", width))
            out += _body(m.content or "", width, full, "    ")
        if out[-1] == "" and m.role != "assistant":
            out.pop()
    out.append("")
    out += [fit(line, width) if not full else line for line in _ending(state)]
    return out


def _assistant(m: Message, record: TurnRecord | None, width: int, full: bool) -> list[str]:
    head = f"── turn {record.turn}" if record else "── assistant"
    if record is not None:
        head += (f" · {record.prompt_tokens:,} in / {record.completion_tokens:,} out · "
                 f"{record.ms / 1000:.1f} s ")
    out = [fit(head + "─" * max(width - len(head), 0), width)]
    if m.content and m.content.strip():
        out += _body(m.content.strip(), width, full, "", wrap=True, capped=False)  # the model's words: all of them
    for call in m.tool_calls or []:
        out.append(fit(f"  → {call.function.name} {_args(call.function.arguments)}", width) if not full
                   else f"  → {call.function.name} {_args(call.function.arguments)}")
    return out


def _ending(state: RunState) -> list[str]:
    lines = []
    if state.answer:
        lines.append("answer: " + " ".join(state.answer.split()))
    lines.append(f"stopped: {state.status}" + (f" ({state.reason})" if state.reason else ""))
    if state.error is not None:
        lines.append(f"error: {state.error.type}: {state.error.message}")
    return lines + next_steps(state)


def markdown(state: RunState, events: Sequence[TraceEvent]) -> str:
    """The whole transcript as Markdown: nothing cut."""
    head = header(state)
    out = [f"# Run {state.run_id}", "", f"**{state.config.model}** · {state.status}", "", head[1], "", head[2], ""]
    records = iter(_turns(state))
    verdicts = _verdicts(events)
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
            out += [f"### Result of `{m.name}` (call `{m.tool_call_id}`)", ""]
            if m.tool_call_id in verdicts:
                out += [f"*{verdicts[m.tool_call_id]}*", ""]
            out += [fence, m.content or "", fence, ""]
    out += ["## Stop", ""] + [f"- {line}" for line in _ending(state)]
    return "\n".join(out) + "\n"


def as_json(state: RunState, events: Sequence[TraceEvent]) -> dict[str, Any]:
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


def totals(states: Sequence[tuple[RunState, str]], by: str | None) -> list[Total]:
    """Sums per group (`by`: "model", "day" (UTC, of the start) or "status" (as shown)), in
    order of first appearance, then a TOTAL row; one "all runs" row when `by` is None.
    `states` holds (state, shown status) pairs. Every run counts its own spend: a research
    child's cost, which its parent's `cost_usd` includes, is counted once, with the child.
    """
    groups: dict[str, Total] = {}
    overall = Total("TOTAL" if by else "all runs")
    names = short_models(sorted({s.config.model for s, _ in states}))
    for state, shown in states:
        key = {"model": names.get(state.config.model, state.config.model),
               "day": time.strftime("%Y-%m-%d", time.gmtime(state.created_at)), "status": shown}.get(by or "", "")
        if by:
            groups.setdefault(key, Total(key)).add(state)
        overall.add(state)
    return [*groups.values(), overall]
