"""A run's transcript (`runner show`) as text fitted to a width, Markdown or JSON, with its
engine timings per turn; and its trace as lines (`runner trace`)."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runner.render.stop import next_steps, preview_lines, resume_target, writes_line
from runner.render.terminal import _wrapped, fit, when

if TYPE_CHECKING:
    from runner.state import Message, RunConfig, RunState, TurnRecord
    from runner.store import RunInfo
    from runner.trace import TraceEvent



RESULT_LINES = 6
"""Lines of a tool result (and of the system prompt) shown without --full."""
ANSWER_LINES = 4
"""Lines of the answer repeated at the end of a transcript (the whole reply is in its turn)."""


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
    who = m.role if m.harness is None else "runner (" + m.harness.label + (
        ", sent alone after the system prompt)" if alone else ", in that fresh context)" if afresh else ")")
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
    afresh = False  # from second_opinion's request on, the requests leave the conversation out
    for i, m in enumerate(state.messages):
        if m.role == "assistant" or m.harness is not None:  # a reply, or a message of runner's own
            out += slips()
        out += _resumed(resumes, i, records[at].turn if m.role == "assistant" and at < len(records) else None, width)
        out.append("")
        if m.role in ("system", "user"):
            alone = m.harness is not None and m.harness.fresh
            afresh = afresh or alone
            out += _heading(m, alone, afresh, width)
            out += _body(m.content or "", width, full, "", wrap=True, keep_last=m.harness is not None)
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
    if state.answer and state.answer_unsupported:
        lines += _wrap(f"unsupported: no tool result says {state.answer_unsupported} (runner's review)", width)
    why = [f"stopped: {state.status}" + (f" ({state.reason})" if state.reason else "")]
    if state.error is not None:
        why.append(f"error: {state.error.type}: {state.error.message}")
    return lines + [part for line in [*why, *writes_line(state), *next_steps(state, store_opts)]
                    for part in _wrap(line, width)] + [fit(line, width) for line in preview_lines(state)]


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
