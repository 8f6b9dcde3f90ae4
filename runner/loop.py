"""The harness loop: `run(state, runtime)` and the small steps it is made of.

Each iteration, in this order: run the pending tool calls of the last assistant message
(so resume and approval are one code path; the budget and turn cap are checked before each
call of a batch); else check the stop rules (turns, budget, cancellation) before paying for
anything; else ask the model, record its reply and cost; a reply without tool calls
completes the run. A protocol slip (no answer and no usable call) is billed, not kept, and
asked again a bounded number of times. Every transition is committed with its trace events
(`Runtime.commit`) before the next one starts. Expected endings are data on the state, never exceptions:
a provider that stays unavailable through its retries leaves the run `interrupted`
(resumable); what no resume fixes leaves it `failed` with a typed `error`.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from runner import steering
from runner.cancel import Cancelled, CancelToken, race
from runner.errors import DiskFull, NotPending, ProviderError
from runner.replies import ReplyClass
from runner.state import (
    FORMAT_VERSION,
    ApprovalInterruption,
    CancelledInterruption,
    ErrorType,
    Interruption,
    LimitStop,
    Message,
    ProviderUnavailableInterruption,
    RunError,
    RunState,
    RunStatus,
    ToolCall,
    ToolRun,
    TurnRecord,
    call_signature,
    pending,
)

if TYPE_CHECKING:  # these load where a run uses them, not with `from runner import run`: the trace's
    # event models, the tools, the streaming meter and json are imported in the functions that use them
    from runner.client import ChatClient, ChatReply
    from runner.store import RunHandle
    from runner.streaming import TurnProgress
    from runner.tools import Tool, Workspace
    from runner.trace import SkipReason, ToolSkipped, Tracer, _Event

GENERIC_TOOL_ERROR = "Error: the tool failed."
SLIPS = {
    "empty_tool_calls": 'finish_reason "tool_calls" with no tool calls',
    "blank_content": "no tool calls and blank content",
    "unparsed_tool_call": "a <tool_call> block the server could not parse",
    "dropped_call": "a tool call the server dropped (cut off or unparseable)",
}
"""The protocol slips, in words (see `ChatReply.slip`)."""
def _crash_point(name: str) -> None:
    """`runner.store.crash_point` (the kill tests' hook), imported on first use."""
    from runner.store.base import crash_point

    crash_point(name)


def default_tool_error_text(exc: Exception) -> str:
    """The default formatter: `Error: <message>` (a sentence written for the model)."""
    return f"Error: {exc}"


@dataclass(eq=False, repr=False)
class Runtime:
    """The live half of a run: everything `RunState` must not hold (live objects, never compared
    or printed: no generated `__eq__` or `__repr__` to compile on `from runner import run`).

    Attributes:
        client: the chat client for the run's endpoint.
        tools: the catalog offered to the model.
        workspace: where tools work: a `Workspace` (the run's copy, made on the first tool
            that may write), or a folder every tool works in as it is.
        run: the claimed run in its store, where every transition is committed with its
            trace events; None keeps the run in memory only.
        cancel: the run's Stop signal, shared with tools and child runs.
        on_progress: called with (tool name, label) for every tool progress report.
        on_turn: called with the progress of each model call (see `runner.streaming.TurnMeter`).
        tool_error_text: formats a tool's exception for the model under the "text" policy.
        run_child: drives a child run (load-or-create by its id, run, save) and returns its
            final state; wired by `runner.harness`. None: tools cannot start child runs.
        server_settings: what the endpoint runs with, for `run_started` (the local llama.cpp
            server fills it: context size, chat format, seed, threads); None: unknown.
    """

    client: ChatClient
    tools: list[Tool]
    workspace: Workspace | Path
    run: RunHandle | None = None
    cancel: CancelToken = field(default_factory=CancelToken)
    on_progress: Callable[[str, str], None] | None = None
    tool_error_text: Callable[[Exception], str] = default_tool_error_text
    tracer: Tracer = field(default_factory=lambda: _untraced())
    run_child: Callable[[RunState, CancelToken], Awaitable[RunState]] | None = None
    server_settings: dict[str, Any] | None = None
    on_turn: Callable[[TurnProgress], None] | None = None
    """Live progress of each model call (start, every streamed chunk, end); set, it makes the
    client ask for a streamed reply."""
    _deferred: list[_Event] = field(default_factory=list)
    _clock: tuple[float, float] = (0.0, 0.0)
    """(the run's wall_ms when this process took it, perf_counter then): each commit records the
    time so far, so a process killed mid-run still counts up to its last commit."""

    def workspace_for(self, tool: Tool) -> Path:
        from runner.tools import Workspace

        ws = self.workspace
        return ws.for_tool(tool) if isinstance(ws, Workspace) else ws

    def workspace_now(self) -> Path:
        """The folder as the run's tools see it now, without making the run's copy of it."""
        from runner.tools import Workspace

        ws = self.workspace
        return ws.now() if isinstance(ws, Workspace) else ws

    def ledger(self) -> Path | None:
        """Where write tools keep their ledger (see `runner.tools.Workspace`)."""
        from runner.tools import Workspace

        return self.workspace.ledger if isinstance(self.workspace, Workspace) else None

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    @functools.cached_property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The `tools` array sent with every request (built once: schema generation is slow)."""
        return [t.schema() for t in self.tools]

    def commit(self, state: RunState, *events: _Event) -> None:
        """Save `state` and this transition's trace events (after any deferred ones) together;
        in memory, only trace them. A save the full disk refused committed nothing: its events
        go with the next commit (the stop's), as its transition does."""
        if self._deferred:
            events, self._deferred = (*self._deferred, *events), []
        if self._clock[1]:
            state.wall_ms = self._clock[0] + (time.perf_counter() - self._clock[1]) * 1000
        if self.run is not None:
            try:
                self.run.commit(state, events)
            except DiskFull:
                self._deferred = list(events)
                raise
        else:
            for event in events:
                self.tracer.emit(event)

    def before_effect(self) -> None:
        """Called before something happens outside the run (a paid model request, a tool that
        may write): what was committed must survive first (a store may flush here)."""
        if self.run is not None:
            self.run.sync()

    def defer(self, event: _Event) -> None:
        """Trace `event` with the next commit (it describes the transition being made)."""
        self._deferred.append(event)


def _untraced() -> Tracer:
    """A tracer that drops every event (a run kept in memory, untraced)."""
    from runner.trace import Tracer

    return Tracer(None)


async def run(state: RunState, rt: Runtime) -> RunState:
    """Drive `state` until it stops; returns the same (mutated) state.

    Resumable statuses are reset to `running` first, so calling `run` on a loaded state is
    how a run is resumed. Final states (completed, failed) are returned unchanged.
    Raises only for bugs and bad configuration; provider failures and cancellation are
    recorded as `failed` (with `error`) / `interrupted` with a reason.
    """
    import asyncio  # here, not at the top: `from runner import run` need not load it (it runs under asyncio)

    from runner.trace import RunStopped

    if state.status in ("completed", "failed"):
        return state
    rt._clock = (state.wall_ms, time.perf_counter())
    fresh = state.turns == 0 and not state.tool_runs and not rt.tracer.has_events()
    state.status, state.interruption, state.reason = "running", None, None
    state.format_version = FORMAT_VERSION  # from here on it is written in this version's shape
    opening = _opening(state, rt, fresh)
    try:
        if fresh:
            rt.tracer.emit(opening)
        else:  # committed as running before it acts: a kill from here on shows as `died`, not as the last stop
            rt.commit(state, opening)
        while state.status == "running":
            calls = pending(state)
            if calls:
                await _run_tool_calls(state, rt, calls)
                continue
            if _answered(state):  # prose, no calls (maybe saved just before a kill)
                _stop(state, "completed", None, _answer_reason(state))
                break
            limit = _check_limits(state, rt)
            if limit is not None:
                _stop(state, *limit)
                break
            rt.before_effect()
            try:
                reply, max_tokens = await race(_ask_model(state, rt), rt.cancel)
            except ProviderError as exc:
                if exc.kind == "context_overflow" and _elide_one_more(state):
                    continue  # asked again with one more early result cut to a line
                raise
            _record_reply(state, rt, reply, max_tokens)
    except Cancelled as exc:
        _stop(state, "interrupted", CancelledInterruption(reason=exc.reason), f"cancelled: {exc.reason}")
    except asyncio.CancelledError:  # the task itself (asyncio.run's own Ctrl-C handling): saved, then passed on
        _stop(state, "interrupted", CancelledInterruption(reason="task cancelled"), "cancelled: the run's task was cancelled")
        raise
    except ProviderError as exc:
        _stop_for_provider(state, exc)
    except DiskFull as exc:  # the stop below still commits: the store freed its reserve
        _stop(state, "interrupted", CancelledInterruption(reason="disk full"), str(exc))
    finally:
        if state.status == "running":  # an unexpected exception is escaping: keep it resumable
            _stop(state, "interrupted", CancelledInterruption(reason="crashed"), "the harness crashed")
        rt.commit(state, RunStopped(runId=state.run_id, status=state.status, reason=state.reason,
                                  turns=state.turns, costUsd=state.cost_usd))
    return state


def _opening(state: RunState, rt: Runtime, fresh: bool) -> _Event:
    """The run's first event in this process: `run_started` for a fresh run, else `run_resumed`."""
    from runner.trace import TRACE_FORMAT_VERSION, RunResumed, RunStarted

    if fresh:
        return RunStarted(runId=state.run_id, formatVersion=TRACE_FORMAT_VERSION, model=state.config.endpoint.model,
                          parentRunId=state.parent_run_id, prompt=steering.question(state), endpoint=rt.client.base_url,
                          server=rt.server_settings)
    return RunResumed(runId=state.run_id, turns=state.turns, costUsd=state.cost_usd,
                      approved=[c.id for c in pending(state) if c.id in state.approved], endpoint=rt.client.base_url,
                      messages=len(state.messages))


def _answered(state: RunState) -> bool:
    """The last message is the model's prose, not a reply the budget cap cut short."""
    if state.messages[-1].role != "assistant":
        return False
    last = state.per_turn[-1] if state.per_turn else None
    return not (last and last.finish_reason == "length" and last.budget_capped)


def _answer_reason(state: RunState) -> str:
    last = state.per_turn[-1] if state.per_turn else None
    if last and last.finish_reason == "length":
        limit = f"max_tokens={last.max_tokens}" if last.max_tokens else "the server's token limit"
        return f"the model answered, cut off at {limit}"
    return "the model answered"


def _stop(state: RunState, status: RunStatus, interruption: Interruption | None, reason: str) -> None:
    state.status, state.interruption, state.reason = status, interruption, reason


def _fail(state: RunState, kind: ErrorType, message: str, reason: str, http_status: int | None = None,
          details: dict[str, Any] | None = None) -> None:
    _stop(state, "failed", None, reason)
    state.error = RunError(type=kind, message=message, http_status=http_status, details=details)


def _stop_for_provider(state: RunState, exc: ProviderError) -> None:
    """Unavailable through every retry, or not asked at all (the run's key is not at hand):
    interrupted (a plain resume asks again). An endpoint that no longer answers as one (HTTP
    404, not an API) once the run has paid turns: interrupted too, so a wrong or moved base URL
    never throws the run away (resume it with `--base-url`). Anything else deterministic
    (401/403 included): failed, with the provider's own message and numbers."""
    if exc.kind == "unavailable":
        after = f" after {exc.retries} {'retry' if exc.retries == 1 else 'retries'}" if exc.retries else ""
        reason = f"provider unavailable{after}: {exc}"
    elif exc.kind in ("not_found", "bad_endpoint") and state.turns > 0:
        reason = f"the endpoint does not answer as it did: {exc}"
    else:
        _fail(state, exc.kind, str(exc), f"provider error: {exc}", exc.status, exc.details)
        return
    unavailable = ProviderUnavailableInterruption(http_status=exc.status, message=str(exc), retries=exc.retries)
    _stop(state, "interrupted", unavailable, reason)


def _check_limits(state: RunState, rt: Runtime) -> LimitStop | None:
    """The stop rules, checked before each model call: the Stop signal, then the limits."""
    if rt.cancel.is_cancelled:
        reason = rt.cancel.reason or "cancelled"
        return LimitStop("interrupted", CancelledInterruption(reason=reason), f"cancelled: {reason}")
    cfg = state.config
    return cfg.limits.before_request(state, functools.partial(_next_prompt_tokens, state, rt), cfg.prices)


def _next_prompt_tokens(state: RunState, rt: Runtime) -> int:
    """A deliberately high estimate of the next request's prompt tokens: the last prompt, the
    last reply, and `tokens.upper_bound` (conservative for any script: CJK, emoji, digits)
    plus 8 tokens of framing per message for what was appended since (turn 1: everything)."""
    import json

    from runner.tokens import upper_bound

    if not state.per_turn:
        return sum(upper_bound(m.content or "") + 8 for m in state.messages) + upper_bound(json.dumps(rt.tool_schemas))
    last = state.per_turn[-1]
    since = state.messages[_last_assistant_index(state) + 1:]
    return last.prompt_tokens + last.completion_tokens + sum(upper_bound(m.content or "") + 8 for m in since)


def _last_assistant_index(state: RunState) -> int:
    return max((i for i, m in enumerate(state.messages) if m.role == "assistant"), default=-1)


def _reply_token_budget(state: RunState, rt: Runtime) -> int | None:
    """With `cap_max_tokens`, the reply tokens the budget still pays for; None when not capping."""
    cfg = state.config
    return cfg.limits.reply_tokens(state, functools.partial(_next_prompt_tokens, state, rt), cfg.prices)


async def _ask_model(state: RunState, rt: Runtime) -> tuple[ChatReply, int | None]:
    """One model call; returns the reply and the max_tokens sent (None: none sent)."""
    from runner.streaming import TurnMeter

    cfg = state.config
    max_tokens = cfg.max_tokens
    cap = _reply_token_budget(state, rt)
    if cap is not None:
        max_tokens = cap if max_tokens is None else min(max_tokens, cap)
    steering.before_request(state)
    tool_choice = steering.tool_choice(state, bool(rt.tool_schemas))
    extra: dict[str, Any] = {"tool_choice": tool_choice} if tool_choice else {}
    if cfg.parallel_tool_calls is not None:
        extra["parallel_tool_calls"] = cfg.parallel_tool_calls
    meter = TurnMeter(state.turns + 1, rt.on_turn) if rt.on_turn else None  # live per-turn line
    tools = steering.offered_tools(state, rt.tool_schemas)
    if narrower := steering.grammar_tools(state, rt.tool_schemas):
        extra["grammar_tools"] = narrower
    extra |= steering.request_fields(state)
    reply = await rt.client.chat(cfg.endpoint.model, sent_messages(state), tools, max_tokens=max_tokens,
                                 extra=extra or None,
                                 on_delta=meter.update if meter else None, call_ids=call_id_stem(state))
    if meter:
        meter.finish(reply.completion_tokens, reply.message.content or "")
    return reply, max_tokens


ELIDED = ("[An earlier result of {tool}, {chars:,} characters, is left out here to fit the model's context "
          "window; call the tool again if you need it.]")
"""What a request sends in place of a tool result elided to fit the context window."""


def sent_messages(state: RunState) -> list[Message]:
    """The messages the next request sends: the policies' (`steering.request_messages`), the
    first `RunState.elided_results` of its elidable tool results (`_elidable`) each cut to one
    line (`ELIDED`). The run keeps every result whole."""
    messages = steering.request_messages(state)
    cut = set(_elidable(messages)[:state.elided_results])
    if not cut:
        return messages
    return [m.model_copy(update={"content": ELIDED.format(tool=m.name or "a tool", chars=len(m.content or ""))})
            if i in cut else m for i, m in enumerate(messages)]


def _elidable(messages: list[Message]) -> list[int]:
    """Where the tool results that may be cut to a line are, earliest first: all but those after
    the last reply (the model has not seen them yet) and any of a line already."""
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=len(messages))
    return [i for i, m in enumerate(messages[:last]) if m.role == "tool" and len(m.content or "") > len(ELIDED)]


def _elide_one_more(state: RunState) -> bool:
    """After a request refused as longer than the context window: send one more early tool
    result as a line from now on; False when none is left to cut (the run then fails)."""
    if state.elided_results >= len(_elidable(steering.request_messages(state))):
        return False
    state.elided_results += 1
    return True


def call_id_stem(state: RunState) -> str:
    """The stem of the ids given to this turn's calls that came without one:
    `call_<8 hex of sha256(run id)>_<turn>`, so the ids are the same on every resume and in
    every run replayed under the same id."""
    import hashlib

    digest = hashlib.sha256(state.run_id.encode()).hexdigest()[:8]
    return f"call_{digest}_{state.turns + 1}"


def _record_reply(state: RunState, rt: Runtime, reply: ChatReply, max_tokens: int | None) -> None:
    """Bill the reply; keep it unless it is a protocol slip (then it is asked again, up to
    `max_protocol_retries` times, and the run fails past that)."""
    from runner.trace import TurnEvent, engine_fields

    cfg = state.config
    tool_choice = steering.tool_choice(state, bool(rt.tool_schemas))  # what `_ask_model` sent: the state has not changed since
    cost = (reply.prompt_tokens * cfg.price_in_usd_per_mtok
            + reply.completion_tokens * cfg.price_out_usd_per_mtok) / 1e6
    state.turns += 1
    state.prompt_tokens += reply.prompt_tokens
    state.completion_tokens += reply.completion_tokens
    state.cost_usd += cost
    slip = reply.slip
    rewrites = list(reply.rewrites)
    if slip is None:
        rewrites += _unique_call_ids(state, reply.message)
        state.messages.append(reply.message)
    ms = reply.provider_ms
    state.per_turn.append(TurnRecord(
        turn=state.turns, prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
        cost_usd=cost, ms=ms, provider_ms=reply.provider_ms, finish_reason=reply.finish_reason,
        retries=len(reply.retries), max_tokens=max_tokens,
        budget_capped=max_tokens is not None and max_tokens != state.config.max_tokens,
        usage_estimated=reply.usage_estimated, slip=slip, engine=reply.engine,
    ))
    corrective = None
    if slip is not None:
        _fail_if_slipping(state)
        if state.status == "running" and cfg.on_slip == "corrective":
            corrective = steering.correction(state, [t.name for t in rt.tools], slip)
    else:
        corrective = steering.review_answer(state) or _final_word(state)
    rt.commit(state, TurnEvent(
        runId=state.run_id, turn=state.turns, promptTokens=reply.prompt_tokens,
        completionTokens=reply.completion_tokens,
        totalTokens=reply.prompt_tokens + reply.completion_tokens,
        costUsd=round(state.cost_usd, 9), finish=reply.finish_reason, ms=round(ms, 3),
        retries=reply.retries or None, usageEstimated=reply.usage_estimated or None,
        slip=slip, content=(reply.message.content or "")[:500] if slip else None,
        rewrites=rewrites or None, neutralised=reply.neutralised or None, corrective=corrective,
        toolChoice=tool_choice, **engine_fields(reply.engine),
    ))
    _crash_point("reply")


def _final_word(state: RunState) -> str | None:
    """A reply that would end the run (prose, no calls) is judged (`steering.final_verdict`):
    an answer is taken, marked when the run's own review found it unsupported; no answer, or
    one that says a file was changed when runner's write tools changed none, gets
    one fresh request for the answer (whose text is returned), and then fails the run
    (`no_answer`), the reply kept in the transcript."""
    last = state.messages[-1]
    if last.role != "assistant" or last.tool_calls or not _answered(state):
        return None
    verdict = steering.final_verdict(state)
    if verdict.kind != "no_answer" and (unmade := steering.unmade_change(state)) is not None:
        verdict = ReplyClass("no_answer", f"says a file was changed, and no write was made ({unmade})")
    if verdict.kind != "no_answer":
        state.answer_unsupported = steering.unsupported_claim(state)
        return None
    if steering.ask_once_more(state, verdict):
        return state.messages[-1].content
    what = f"the model's last reply {verdict.why}: no answer"
    _fail(state, "no_answer", what, what)
    return None


def _fail_if_slipping(state: RunState) -> None:
    """Fail once the last `max_protocol_retries` + 1 replies in a row were all slips (with
    ``on_slip: fail``, at the first)."""
    slips = 0
    for record in reversed(state.per_turn):
        if record.slip is None:
            break
        slips += 1
    if slips > (0 if state.config.on_slip == "fail" else state.config.limits.max_protocol_retries):
        last = state.per_turn[-1].slip or ""
        what = f"the model replied {slips} times in a row with {SLIPS.get(last, last)} ({last})"
        _fail(state, "protocol_slip", what, f"protocol slip: {what}")


def _unique_call_ids(state: RunState, message: Message) -> list[dict[str, Any]]:
    """Give a reused call id a fresh one, so answers and approvals stay bound to one call;
    returns the rewrites made ({"callId", "field": "id", "original", "sent"})."""
    used = {c.id for m in state.messages for c in (m.tool_calls or [])}
    rewrites: list[dict[str, Any]] = []
    for i, call in enumerate(message.tool_calls or []):
        if call.id in used:
            new_id = f"{call.id}~{state.turns}.{i}"
            rewrites.append({"callId": new_id, "field": "id", "original": call.id, "sent": new_id})
            call.id = new_id
        used.add(call.id)
    return rewrites


async def _run_tool_calls(state: RunState, rt: Runtime, calls: list[ToolCall]) -> None:
    """Answer each pending call in order, or stop the run (approval, failure, cancel).
    Before each call: the Stop signal (the rest stay pending), then the budget and turn cap
    (the rest are answered "not run", so the transcript stays valid)."""
    from runner.tools import ToolError

    for call in calls:
        if rt.cancel.is_cancelled:
            raise Cancelled(rt.cancel.reason or "cancelled")
        refusal = _batch_limit(state, call)
        if refusal is not None:
            _answer(state, rt, call, refusal, ToolRun(
                call_id=call.id, tool_name=call.function.name, signature="skipped", ok=False, ms=0,
                source="skipped", error=refusal))
            continue
        tool = rt.tool(call.function.name)
        try:
            if tool is None:
                names = ", ".join(t.name for t in rt.tools)
                raise ToolError(f"unknown tool {call.function.name!r}; available tools: {names}")
            args = tool.parse(call.function.arguments)
        except ToolError as exc:
            record = ToolRun(call_id=call.id, tool_name=call.function.name, ok=False, ms=0, source="invalid",
                             signature=_invalid_signature(call, known=tool is not None), error=str(exc))
            _answer(state, rt, call, rt.tool_error_text(exc), record)
            _fail_if_invalid_again(state, record, known=tool is not None)
            if state.status != "running":
                return
            continue
        signature = call_signature(tool.name, call.function.arguments)
        if _needs_verdict(state, tool, call, signature):
            if not _refused_before_approval(state, rt, tool, call, args, signature):
                _ask_approval(state, rt, tool, call, args)
                return
            if state.status != "running":
                return
            continue
        cached = _cached_result(state, tool, signature)
        if cached is not None:
            record = ToolRun(call_id=call.id, tool_name=tool.name, signature=signature, ok=True, ms=0,
                             source="cache")
            _answer(state, rt, call, cached, record)
            _fail_if_repeating(state, record)
        else:
            await _execute(state, rt, tool, call, args, signature)
        if state.status != "running":
            return


def _invalid_signature(call: ToolCall, known: bool) -> str:
    """The repeat key of a call that could not run: an unknown tool's name alone (whatever
    its arguments, it fails the same way), else the tool and its arguments as sent."""
    if not known:
        return f"{call.function.name}:unknown"
    return call_signature(call.function.name, call.function.arguments)


def _fail_if_invalid_again(state: RunState, record: ToolRun, known: bool) -> None:
    """Stop `failed` when the same invalid call (an unknown tool, or arguments that do not
    parse or fit the tool's schema) came again: the identical-failure bound and the
    repeated-call bound both count it, the smaller set one deciding (0 turns a bound off)."""
    limits = state.config.limits
    bounds = [n for n in (limits.max_identical_failures, limits.max_identical_calls) if n > 0]
    streak = _streak(state, record)
    if not bounds or streak < min(bounds):
        return
    what = (f"the model called the unknown tool {record.tool_name!r} {streak} times in a row" if not known
            else f"{record.tool_name} was called with the same invalid arguments {streak} times in a row")
    _fail(state, "repeated_failure", f"{what}: {record.error}", f"repeated invalid call: {what}")


def _batch_limit(state: RunState, call: ToolCall) -> str | None:
    """Why `call` must not run (budget spent, or past the turn cap), in words for the model;
    None to run it. A write already started (in doubt) is never answered "not run"."""
    if call.id in state.started or call.id in state.in_doubt:
        return None
    return state.config.limits.before_tool_call(state)


def _needs_verdict(state: RunState, tool: Tool, call: ToolCall, signature: str) -> bool:
    """True if a person must decide first: the tool needs approval (and this exact call was
    not approved), or a write started in an earlier process has an unknown outcome."""
    if call.id in state.started and not tool.idempotent:
        # In doubt: it may or may not have happened. Never re-run it blindly.
        del state.started[call.id]
        state.approved.pop(call.id, None)
        state.in_doubt.append(call.id)
    from runner.tools import acts_on_folder

    if call.id not in state.in_doubt and not state.config.needs_verdict(tool.name, tool.needs_approval,
                                                                         tool.read_only, acts_on_folder(tool)):
        return False
    return state.approved.get(call.id) != signature


def _refused_before_approval(state: RunState, rt: Runtime, tool: Tool, call: ToolCall, args: Any,
                             signature: str) -> bool:
    """A call that could only fail (`Tool.check`: a delete of a file that does not exist) is
    answered with its error at once, as if it had run, and no one is asked to approve it; so is
    a call the user declined before with the same arguments (`DECLINED_BEFORE`; asked for again
    in a row, it fails the run). A call in doubt after a crash is asked about whatever the files
    say now."""
    from runner.tools import ToolError

    if call.id in state.in_doubt:
        return False
    declined = _declined_before(state, signature)
    if declined is not None:
        record = ToolRun(call_id=call.id, tool_name=tool.name, signature=signature, ok=False, ms=0, source="rejected",
                         error=f"declined by the user earlier: {declined}")
        _answer(state, rt, call, DECLINED_BEFORE.format(reason=declined), record)
        streak, limit = _streak(state, record), state.config.limits.max_identical_failures
        if 0 < limit <= streak:
            what = f"{tool.name} was asked for again {streak} times in a row after the user declined it"
            _fail(state, "repeated_failure", f"{what}: {declined}", f"repeated call: {what}")
        return True
    try:
        tool.check(args, rt.workspace_now())
    except ToolError as exc:
        record = ToolRun(call_id=call.id, tool_name=tool.name, signature=signature, ok=False, ms=0, source="refused",
                         error=str(exc))
        _answer(state, rt, call, _error_text(state, rt, exc), record)
        _fail_if_fatal(state, exc, record)
        return True
    return False


DECLINED_BEFORE = ("The user declined this same call earlier ({reason}), so it was not asked again. Do something "
                   "else, or answer.")
"""The tool result of a call the user declined before with the same arguments."""


def _declined_before(state: RunState, signature: str) -> str | None:
    """The user's reason (or "no reason given") when they declined a call with `signature`
    earlier in the run; a rejection, like an approval, holds for those exact arguments."""
    calls = {c.id: c for m in state.messages if m.role == "assistant" for c in (m.tool_calls or [])}
    for record in state.tool_runs:
        call = calls.get(record.call_id)
        if record.signature == "rejected" and call is not None and \
                call_signature(call.function.name, call.function.arguments) == signature:
            return (record.error or "").removeprefix("declined by the user: ") or "no reason given"
    return None


def _ask_approval(state: RunState, rt: Runtime, tool: Tool, call: ToolCall, args: Any) -> None:
    """Stop `interrupted` for a verdict on `call` (`args`: its parsed arguments), with what it
    would change as the files are now (`Tool.preview`)."""
    from runner.trace import ApprovalRequired

    in_doubt = call.id in state.in_doubt
    try:
        preview = tool.preview(args, rt.workspace_now())
    except Exception:  # a tool of one's own whose preview fails: the person is asked without one
        preview = None
    rt.defer(ApprovalRequired(runId=state.run_id, toolName=tool.name,
                              args=call.function.arguments, callId=call.id, inDoubt=in_doubt))
    reason = (f"{tool.name} was started before a crash and its outcome is unknown; approve to run it again"
              if in_doubt else f"{tool.name} needs approval")
    _stop(state, "interrupted", ApprovalInterruption(
        call_id=call.id, tool_name=tool.name, args=args.model_dump(), in_doubt=in_doubt, preview=preview), reason)


def _cached_result(state: RunState, tool: Tool, signature: str) -> str | None:
    """The earlier successful result of the same call, when dedupe applies to this tool."""
    cfg = state.config
    if not cfg.dedupe or not (tool.read_only or cfg.dedupe_all):
        return None
    for record in state.tool_runs:
        if record.signature == signature and record.ok and record.source == "run":
            return next(m.content or "" for m in state.messages
                        if m.role == "tool" and m.tool_call_id == record.call_id)
    return None


async def _execute(state: RunState, rt: Runtime, tool: Tool, call: ToolCall, args: Any, signature: str) -> None:
    """Run one tool call and record its result; errors become text, or stop the run."""
    from runner.tools import ToolContext
    from runner.trace import ToolCancelled, ToolStart

    start = ToolStart(runId=state.run_id, toolName=tool.name, args=call.function.arguments, callId=call.id)
    if not tool.read_only:
        state.started[call.id] = signature  # from here until recorded, the call is in doubt
        rt.commit(state, start)
        rt.before_effect()
    _crash_point("tool_start")
    if tool.read_only:
        rt.tracer.emit(start)
    cancel = rt.cancel
    children: list[str] = []

    async def spawn(child: RunState) -> RunState:
        assert rt.run_child is not None
        children.append(child.run_id)
        try:
            child = await rt.run_child(child, cancel)
        finally:
            _record_child_cost(state, child)
        return child

    ctx = ToolContext(
        cancel=cancel, workspace=rt.workspace_for(tool),
        progress=lambda label: _progress(state, rt, tool, call, label),
        idempotency_key=f"{state.run_id}/{call.id}", call_id=call.id, run_id=state.run_id,
        spawn=spawn if rt.run_child is not None else None, ledger=rt.ledger(),
        max_chars=state.config.max_tool_result_chars,
    )
    began = time.perf_counter()
    error: Exception | None = None
    try:
        text = _as_text(tool, await tool.run(args, ctx))
    except Cancelled as exc:  # the call stays pending: a resume runs it again
        rt.tracer.emit(ToolCancelled(runId=state.run_id, toolName=tool.name, callId=call.id,
                                     ms=round((time.perf_counter() - began) * 1000, 3), reason=exc.reason))
        raise
    except Exception as exc:
        error, text = exc, ""
    _crash_point("tool_done")
    ms = (time.perf_counter() - began) * 1000
    record = ToolRun(call_id=call.id, tool_name=tool.name, signature=signature, ok=error is None,
                     ms=ms, error=None if error is None else str(error))
    if error is not None:
        text = _error_text(state, rt, error)
    state.started.pop(call.id, None)
    _answer(state, rt, call, text, record, child=children[-1] if children else None)
    if error is not None:
        _fail_if_fatal(state, error, record)
    else:
        _fail_if_repeating(state, record)


def _error_text(state: RunState, rt: Runtime, error: Exception) -> str:
    """What the model reads for a call that failed."""
    return GENERIC_TOOL_ERROR if state.config.tool_errors == "generic" else rt.tool_error_text(error)


def _record_child_cost(state: RunState, child: RunState) -> None:
    """Record a child run's spend on the parent as a value per child, not an increment, so a
    child resumed after a crash is counted exactly once."""
    before = state.child_costs.get(child.run_id, 0.0)
    state.child_costs[child.run_id] = child.cost_usd
    state.cost_usd += child.cost_usd - before
    state.child_cost_usd += child.cost_usd - before


def _progress(state: RunState, rt: Runtime, tool: Tool, call: ToolCall, label: str) -> None:
    from runner.trace import ToolProgress

    rt.tracer.emit(ToolProgress(runId=state.run_id, toolName=tool.name, callId=call.id, label=label))
    if rt.on_progress is not None:
        rt.on_progress(tool.name, label)


def _as_text(tool: Tool, value: object) -> str:
    """What a tool returned, as the text the model reads: a str as it is, data (a dict, a
    list, a number) as JSON.

    Raises:
        TypeError: anything else (None: the tool returned nothing), as the call's error.
    """
    import json

    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple, int, float)):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            pass
    raise TypeError(f"the tool {tool.name} returned {type(value).__name__}, not text (a tool returns a str)")


def _answer(state: RunState, rt: Runtime, call: ToolCall, text: str, record: ToolRun,
            child: str | None = None) -> None:
    """Append the tool result for `call` (capped at `max_tool_result_chars`) and its record;
    save; trace."""
    from runner.tools import cap_text
    from runner.trace import ToolResult

    if record.ok:
        text = steering.tool_result_text(state, call, text, record.signature)
    text, omitted = cap_text(text, state.config.max_tool_result_chars)
    state.messages.append(Message(role="tool", tool_call_id=call.id, name=call.function.name, content=text))
    state.tool_runs.append(record)
    result = ToolResult(runId=state.run_id, toolName=record.tool_name, callId=call.id, ms=round(record.ms, 3),
                        ok=record.ok, source=record.source, error=record.error, childRunId=child,
                        omittedChars=omitted or None)
    skipped = _skipped(state, call, record)
    rt.commit(state, *([skipped] if skipped is not None else []), result)
    _crash_point("tool_result")


SKIP_REASONS: dict[str, SkipReason] = {"refused": "refused", "rejected": "declined_before", "cache": "cached",
                                       "skipped": "limit", "invalid": "invalid"}
"""A `ToolRun.source` that did not run the tool -> the `tool_skipped` reason (a rejection answered
through `_answer` is a call declined before; one given as a verdict is traced by `reject`)."""


def _skipped(state: RunState, call: ToolCall, record: ToolRun) -> ToolSkipped | None:
    """The `tool_skipped` event of a call answered without running its tool; None for one that ran."""
    from runner.trace import ToolSkipped

    reason = SKIP_REASONS.get(record.source)
    if reason is None:
        return None
    return ToolSkipped(runId=state.run_id, toolName=record.tool_name, callId=call.id, args=call.function.arguments,
                       reason=reason, detail=record.error)


def _fail_if_fatal(state: RunState, error: Exception, record: ToolRun) -> None:
    """Stop `failed` for the fatal policy, a permanent error, or the same failure N times."""
    cfg = state.config
    if cfg.tool_errors == "fatal":
        _fail(state, "tool_error", str(error), f"tool {record.tool_name} failed: {error}")
    elif cfg.permanent_errors and getattr(error, "permanent", False):
        _fail(state, "permanent_tool_error", str(error), f"permanent error from {record.tool_name}: {error}")
    elif cfg.limits.max_identical_failures > 0:
        streak = _streak(state, record)
        if streak >= cfg.limits.max_identical_failures:
            _fail(state, "repeated_failure", str(error),
                  f"permanent error: {record.tool_name} failed the same way {streak} times in a row: {error}")


def _fail_if_repeating(state: RunState, record: ToolRun) -> None:
    """Stop `failed` when the same successful call came `max_identical_calls` times in a row."""
    limit = state.config.limits.max_identical_calls
    streak = _streak(state, record)
    if limit > 0 and streak >= limit and not steering.answers_repeat(state):
        what = f"{record.tool_name} was called with the same arguments {streak} times in a row"
        _fail(state, "repeated_call", what, f"repeated call: {what}; the model is not making progress")


def _streak(state: RunState, record: ToolRun) -> int:
    """How many tool runs in a row, ending with the last, match `record` (signature, ok, error);
    a reply in words in between (the model answered, and was asked again) ends the row."""
    since = set()
    for m in reversed(state.messages):
        if m.role == "assistant" and not m.tool_calls:
            break
        since |= {c.id for c in m.tool_calls or []}
    streak = 0
    for earlier in reversed(state.tool_runs):
        if earlier.call_id not in since or \
                (earlier.signature, earlier.ok, earlier.error) != (record.signature, record.ok, record.error):
            break
        streak += 1
    return streak


def approve(state: RunState, call_id: str) -> None:
    """Approve one pending call; the approval holds only for its current arguments.

    Raises:
        NotPending: `call_id` is not a pending call of this run, or is approved already.
    """
    call = verdict_call(state, call_id)
    state.approved[call_id] = call_signature(call.function.name, call.function.arguments)


def reject(state: RunState, call_id: str, reason: str = "", *, empty: bool = False,
           tracer: Tracer | None = None) -> None:
    """Refuse one pending call: its tool result says so in words, so the model reads it.

    Args:
        empty: demonstration only; writes an empty result (the model then misreports).
        tracer: where to record the verdict as a `tool_result` event (source "rejected").

    Raises:
        NotPending: `call_id` is not a pending call of this run, or is approved already.
    """
    call = verdict_call(state, call_id)
    text = "" if empty else f"The user declined this call: {reason or 'no reason given'}"
    state.messages.append(Message(role="tool", tool_call_id=call.id, name=call.function.name, content=text))
    record = ToolRun(call_id=call.id, tool_name=call.function.name, signature="rejected",
                     ok=False, ms=0, source="rejected", error=f"declined by the user: {reason}")
    state.tool_runs.append(record)
    if tracer is not None:
        from runner.trace import ToolResult, ToolSkipped

        tracer.emit(ToolSkipped(runId=state.run_id, toolName=record.tool_name, callId=call.id,
                                args=call.function.arguments, reason="rejected", detail=record.error))
        tracer.emit(ToolResult(runId=state.run_id, toolName=record.tool_name, callId=call.id, ms=0,
                               ok=False, source="rejected", error=record.error))
    state.approved.pop(call_id, None)  # an approval of other arguments under this call id
    if call_id in state.in_doubt:
        state.in_doubt.remove(call_id)


def verdict_call(state: RunState, call_id: str) -> ToolCall:
    """The pending call a verdict names: one verdict per call, as the trace records it.

    Raises:
        NotPending: `call_id` is not pending (it ran or was rejected already, or is no call of
            the run), or it is approved already (a resume carries it out).
    """
    call = _pending_call(state, call_id)
    if state.approved.get(call_id) == call_signature(call.function.name, call.function.arguments):
        raise NotPending(f"call {call_id} ({call.function.name}) of run {state.run_id} is approved already; "
                         "a resume without a verdict carries it out")
    return call


def _pending_call(state: RunState, call_id: str) -> ToolCall:
    for call in pending(state):
        if call.id == call_id:
            return call
    ids = ", ".join(c.id for c in pending(state)) or "none"
    done = next((r for r in reversed(state.tool_runs) if r.call_id == call_id), None)
    if done is not None:
        what = "was rejected already" if done.source == "rejected" else "has run already"
        raise NotPending(f"call {call_id} ({done.tool_name}) of run {state.run_id} {what}: there is no verdict "
                         f"to give on it (pending: {ids})")
    raise NotPending(f"{call_id!r} is not a pending tool call of run {state.run_id} (pending: {ids})")
