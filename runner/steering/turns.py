"""What the next request sends: its ``tool_choice``, the fields it adds, the messages it
carries, and the harness message added before it (the request for the answer, a nudge, a
correction after a slip). Answer forcing, the stall rule and reading on live here; they decide
from a `View`, so runner's loop and `runner serve` (`runner.steering.serve`) decide alike.
"""

from __future__ import annotations

from typing import Any

import runner.steering.texts as texts
from runner.state import Message, RunState
from runner.steering.questions import FOLDER_QUESTION
from runner.steering.registry import on
from runner.steering.view import View, call_label, view

TOP_LOGPROBS = 3
"""With confidence_check, the likeliest tokens asked for beside each generated one."""
RESTATED_RESULT_CHARS = 4_000
"""Each restated tool result is cut to this many characters."""


def tool_choice(state: RunState, sends_tools: bool = True) -> str | None:
    """The ``tool_choice`` the next request sends: "none" when an answer is due, the one the
    last harness message asks for, "required" while the run must read on, the first turn's
    setting before the model replied, else "auto", said outright; None without tools."""
    if not sends_tools:
        return None
    v = view(state)
    if answer_is_due(v):
        return "none"
    note = v.last_note
    if note is not None and note.tool_choice is not None:
        return "none" if v.turns_left == 1 else note.tool_choice
    if read_on(v) or read_on_stall(v):
        return "required"
    return first_turn_choice(state) if not v.replied else "auto"


def first_turn_choice(state: RunState) -> str:
    """The first request's ``tool_choice``: the endpoint's, but "none" instead of "required"
    for small talk, which asks for no call."""
    first = state.config.endpoint.first_turn_tool_choice
    return "none" if first == "required" and view(state).small_talk else first


def read_on(v: View) -> bool:
    """related_first: a turn of calls just ended, the files read so far hold no word of the
    question while listed files are unread, and two turns or more are left."""
    from runner.steering.checks import unrelated

    return on(v, "related_first") and v.last.role == "tool" and v.turns_left >= 2 and unrelated(v)


def read_on_stall(v: View) -> bool:
    """read_on_stall: a turn of calls just brought nothing new while listed files are unread
    and the question is not about the files themselves, with two turns or more left."""
    return (on(v, "read_on_stall") and v.last.role == "tool" and v.turns_left >= 2
            and not FOLDER_QUESTION.search(v.question) and stalled(v) and bool(v.unread))


def answer_is_due(v: View) -> bool:
    """Answer forcing: the last message is a tool result (or a harness message that asks for
    nothing of its own), and there were N turns of tool calls since the question, or
    (answer_on_stall) the last of them brought nothing new, or the reply after results was
    empty. With evidence_first a stall asks for the answer only once a call that looked inside
    a file succeeded."""
    cfg = v.state.config
    if v.last.role == "assistant" or (v.last_note is not None and v.last_note.kind in ("nudge", "review",
                                                                                        "second_opinion",
                                                                                        "disagreement",
                                                                                        "last_attempt")):
        return False
    after = cfg.answer_after_tool_turns
    if after is not None and v.call_turns >= after:
        return True
    if not cfg.answer_on_stall:
        return False
    if (on(v, "evidence_first") and not v.has_evidence) or read_on_stall(v):
        return False
    return stalled(v) or blank_after_results(v)


def stalled(v: View) -> bool:
    """The last turn of tool calls brought nothing new: each of its calls failed or repeated
    an earlier successful call, and some earlier call had succeeded."""
    last = next((m for m in reversed(v.messages) if m.role == "assistant"), None)
    if last is None or not last.tool_calls:
        return False
    ids = {c.id for c in last.tool_calls}
    runs = v.state.tool_runs
    known = {r.signature for r in runs if r.call_id not in ids and r.ok}
    these = [r for r in runs if r.call_id in ids]
    if not known or len(these) < len(ids):
        return False
    return all(not r.ok or r.signature in known for r in these)


def blank_after_results(v: View) -> bool:
    """The model's last reply was empty, after some tool call succeeded."""
    last = v.state.per_turn[-1] if v.state.per_turn else None
    return last is not None and last.slip == "blank_content" and any(r.ok for r in v.state.tool_runs)


def nudge_due(v: View) -> bool:
    """evidence_first: the last turn of calls stalled before anything but a listing succeeded."""
    return (on(v, "evidence_first") and v.state.config.answer_on_stall and not v.has_evidence
            and stalled(v) and not read_on_stall(v))


def before_request(state: RunState) -> None:
    """Add what the policies add before the next request: the request for the answer when it
    is due, or a nudge after a repeated call (unless the harness's last message is still
    unanswered, e.g. written just before a crash)."""
    v = view(state)
    if v.last_note is not None or v.last.role == "assistant":
        return
    if answer_is_due(v):
        policy = "answer_forcing" if (state.config.answer_after_tool_turns is not None
                                      and v.call_turns >= state.config.answer_after_tool_turns) else "answer_on_stall"
        state.messages.append(texts.harness_message(answer_request(v), "answer_request", policy))
    elif nudge_due(v):
        state.messages.append(texts.harness_message(texts.NUDGE.format(question=v.question), "nudge",
                                                    "evidence_first"))


def answer_request(v: View) -> str:
    """The request for the answer: the task restated, after the run's successful tool results
    as `RunConfig.answer_restates_results` says (or saying there are none when every call
    failed or found nothing); once abstain_check has asked the model to look again, with leave
    to say the information is not there."""
    mode = v.state.config.answer_restates_results
    restate = mode == "always" or (mode == "after_failure" and _last_calls_failed(v))
    results = restated_results(v) if restate else ""
    if results:
        text = texts.ASK_WITH_RESULTS.format(results=results, question=v.question)
    elif not any((r.ok and r.call_id not in v.found_nothing) or r.source == "rejected" for r in v.state.tool_runs):
        text = texts.ASK_WITHOUT_RESULTS.format(question=v.question)
    else:
        text = texts.ASK_FOR_ANSWER.format(question=v.question)
    return text + (texts.MAY_ABSTAIN["files" if v.folder_run else "tools"] if v.sent("review", "abstention") else "")


def _last_calls_failed(v: View) -> bool:
    last = next((m for m in reversed(v.messages) if m.role == "assistant" and m.tool_calls), None)
    ids = {c.id for c in last.tool_calls or []} if last is not None else set()
    return any(not r.ok for r in v.state.tool_runs if r.call_id in ids)


def restated_results(v: View) -> str:
    """Every distinct successful tool result of the run, and every call the user declined, in
    order, each under a header naming the call, each cut to `RESTATED_RESULT_CHARS`; "" when none."""
    from runner.tools import cap_text

    results = {m.tool_call_id: m.content or "" for m in v.messages if m.role == "tool"}
    seen: set[str] = set()
    parts = []
    for record in v.state.tool_runs:
        declined = record.source == "rejected"
        key = record.call_id if declined else record.signature
        if not (record.ok or declined) or key in seen or record.call_id not in v.calls:
            continue
        seen.add(key)
        parts.append(f"--- {call_label(v.calls[record.call_id])} ---\n"
                     f"{cap_text(results.get(record.call_id, ''), RESTATED_RESULT_CHARS)[0]}")
    return "\n\n".join(parts)


def request_fields(state: RunState) -> dict[str, Any]:
    """Fields the next request adds: with confidence_check, the reply's token log probabilities."""
    return {"logprobs": True, "top_logprobs": TOP_LOGPROBS} if on(view(state), "confidence_check") else {}


def request_messages(state: RunState) -> list[Message]:
    """The messages the next request sends: the run's, or, after a request made in a fresh
    context, the system prompt and everything from that request on."""
    at = view(state).fresh_at
    if at is None:
        return state.messages
    return [*state.messages[:1 if state.messages[0].role == "system" else 0], *state.messages[at:]]


def correction(state: RunState, tool_names: list[str], slip: str) -> str:
    """Add the corrective message for `slip` (replacing one added before, so corrections never
    pile up) and return its text. When the answer is due, the correction is the request for
    the answer itself, sent with tool_choice "none"."""
    v = view(state)
    text = texts.CORRECTIONS.get(slip, texts.CORRECTIONS["blank_content"]).format(
        tools=", ".join(tool_names), question=v.question)
    if answer_is_due(v):
        text = answer_request(v)
        message = texts.harness_message(text, "answer_request", "answer_on_stall")
    else:
        message = texts.harness_message(text, "correction", "corrective_retries", detail=slip)
    if v.last_note is not None:
        state.messages[-1] = message
    else:
        state.messages.append(message)
    return text


def answers_repeat(state: RunState) -> bool:
    """evidence_first: a call repeated right after its nudge is answered with the request for
    the answer, not stopped by the repeated-call rule (the listing may hold the answer)."""
    v = view(state)
    if not on(v, "evidence_first"):
        return False
    last_assistant = max((i for i, m in enumerate(v.messages) if m.role == "assistant"), default=-1)
    before = v.messages[last_assistant - 1] if last_assistant > 0 else None
    return before is not None and before.harness is not None and before.harness.kind == "nudge"
