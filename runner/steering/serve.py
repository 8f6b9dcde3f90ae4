"""The steering inside `runner serve`, for a client whose loop does not steer: the same policy
code as runner's loop, run on the client's conversation.

An agent framework talking to the server sends none of runner's steering. For a request that
carries the conversation, the server reads it as a run (`as_run`: the messages since the last
user message are the run's turns, each tool result a call that succeeded) and asks the same
functions runner's loop asks which ``tool_choice`` the reply is sampled with
(`runner.steering.turns.tool_choice`). Only the policies whose `Policy.where` names "serve"
run there (first_turn_required, answer_forcing, answer_on_stall), and the server only chooses
how a reply is sampled: it never adds, removes or rewrites a message, and a ``tool_choice``
the client set to something other than "auto" is the client's to keep. With answer_on_stall it
also samples again, as an answer, a reply whose calls all repeat calls already answered
(`repeats_only`). A reply the server asks to be an answer is sampled with the tools left out
of the prompt (measured on Qwen2.5-Coder-1.5B: with the tool schemas in view it describes the
tools instead of answering from their results).

`runner serve --steer off|default|on` picks none, the model manifest's ``serve_policies``, or
every policy that can run on the server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from runner.state import Endpoint, FunctionCall, Limits, Message, RunConfig, RunState, ToolCall, ToolRun, call_signature
from runner.steering.registry import DEFAULT_ANSWER_AFTER_TURNS, REGISTRY
from runner.steering.turns import answer_is_due, tool_choice
from runner.steering.view import view

SteerMode = Literal["off", "default", "on"]
"""off: no policy; default: the manifest's ``serve_policies`` for the model; on: every policy."""
SERVER_POLICIES: dict[str, str] = {p.name: p.description for p in REGISTRY if "serve" in p.where}
"""The policies that can run on the server, by name, in words."""
STEERABLE_CHOICES = (None, "auto")
"""The client's tool_choice values the policies may replace (unset, or said outright as auto)."""


@dataclass(frozen=True)
class Steering:
    """The policies a server applies to every request, and their parameter.

    Attributes:
        policies: names from `SERVER_POLICIES`, in registry order.
        answer_after_turns: N of answer_forcing, turns of tool calls since the user's message.
    """

    policies: tuple[str, ...] = ()
    answer_after_turns: int = DEFAULT_ANSWER_AFTER_TURNS


@dataclass(frozen=True)
class Steered:
    """How one reply is sampled.

    Attributes:
        tool_choice: the ``tool_choice`` the engine gets (the client's, unless a policy fired).
        fired: the policy that chose it, or None when the client's stands.
        answered: with answer_on_stall, the calls already answered since the user's message, as
            `call_signature`s: a reply whose calls are all among them is sampled again as an
            answer (`repeats_only`); empty: no such check.
    """

    tool_choice: Any
    fired: str | None = None
    answered: frozenset[str] = frozenset()


def for_mode(mode: SteerMode, manifest_policies: Sequence[str], answer_after_turns: int | None) -> Steering:
    """The `Steering` of a server in `mode` for a model whose manifest entry names
    `manifest_policies` and sets `answer_after_turns` (None: `DEFAULT_ANSWER_AFTER_TURNS`).

    Raises:
        ValueError: a manifest policy that cannot run on the server.
    """
    unknown = [n for n in manifest_policies if n not in SERVER_POLICIES]
    if unknown:
        raise ValueError(f"unknown server policy {unknown[0]!r}; policies: {', '.join(SERVER_POLICIES)}")
    chosen = {"off": (), "default": tuple(manifest_policies), "on": tuple(SERVER_POLICIES)}[mode]
    return Steering(tuple(n for n in SERVER_POLICIES if n in chosen), answer_after_turns or DEFAULT_ANSWER_AFTER_TURNS)


def as_run(steering: Steering, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any]) -> RunState:
    """A client's conversation read as a run under `steering`'s policies: its messages, each
    tool result since the last user message a call that succeeded, its turns those since then."""
    kept = [_message(m) for m in messages]
    since = max((i for i, m in enumerate(kept) if m.role == "user"), default=-1) + 1
    calls = {c.id: c for m in kept[since:] for c in (m.tool_calls or [])}
    runs = [ToolRun(call_id=m.tool_call_id, tool_name=calls[m.tool_call_id].function.name, ok=True, ms=0.0,
                    signature=call_signature(calls[m.tool_call_id].function.name,
                                             calls[m.tool_call_id].function.arguments))
            for m in kept[since:] if m.role == "tool" and m.tool_call_id in calls]
    names = [str((t.get("function") or {}).get("name")) for t in tools if isinstance(t, Mapping)]
    policies = set(steering.policies)
    config = RunConfig(
        endpoint=Endpoint(model="serve", first_turn_tool_choice="required" if "first_turn_required" in policies
                          else "auto"),
        limits=Limits(max_turns=None), tools=names, answer_on_stall="answer_on_stall" in policies,
        answer_after_tool_turns=steering.answer_after_turns if "answer_forcing" in policies else None)
    turns = sum(1 for m in kept[since:] if m.role == "assistant")
    return RunState(run_id="serve", config=config, messages=kept or [Message(role="user", content="")],
                    tool_runs=runs, turns=turns)


def steer(steering: Steering, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any],
          client_choice: Any) -> Steered:
    """How the reply to `messages` is sampled: the ``tool_choice`` runner's loop would send
    under `steering`'s policies; with none, tools not offered, or a client's choice other than
    unset/"auto", the client's stands."""
    if not steering.policies or not tools or client_choice not in STEERABLE_CHOICES:
        return Steered(client_choice)
    state = as_run(steering, messages, tools)
    chosen = tool_choice(state)
    v = view(state)
    if chosen == "none" and answer_is_due(v):
        forced = state.config.answer_after_tool_turns
        return Steered("none", "answer_forcing" if forced is not None and v.call_turns >= forced else "answer_on_stall")
    if chosen == "required":
        return Steered("required", "first_turn_required")
    watch = "answer_on_stall" in steering.policies and v.last.role == "tool"
    return Steered(client_choice, answered=frozenset(r.signature for r in state.tool_runs) if watch else frozenset())


def repeats_only(steered: Steered, calls: Sequence[Mapping[str, Any]]) -> bool:
    """answer_on_stall, after sampling: the reply made `calls` (OpenAI shape), every one of
    them already answered since the user's message."""
    return bool(calls) and bool(steered.answered) and all(signature(c) in steered.answered for c in calls)


def signature(call: Mapping[str, Any]) -> str:
    """A call's `call_signature` (its name and canonical arguments), from the OpenAI shape."""
    return call_signature(str((call.get("function") or {}).get("name")), _arguments(call))


def _message(m: Mapping[str, Any]) -> Message:
    """An OpenAI-shaped message as runner's `Message` (a developer message is a system one; a
    content of parts is its text parts joined)."""
    role = {"developer": "system"}.get(str(m.get("role")), str(m.get("role")))
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    calls = [ToolCall(id=str(c.get("id") or f"call_{i}"),
                      function=FunctionCall(name=str((c.get("function") or {}).get("name")),
                                            arguments=_arguments(c)))
             for i, c in enumerate(m.get("tool_calls") or []) if isinstance(c, Mapping)]
    return Message(role=role if role in ("system", "user", "assistant", "tool") else "user",  # type: ignore[arg-type]
                   content=content if isinstance(content, str) else None, tool_calls=calls or None,
                   tool_call_id=m.get("tool_call_id"))


def _arguments(call: Mapping[str, Any]) -> str:
    import json

    arguments = (call.get("function") or {}).get("arguments")
    return arguments if isinstance(arguments, str) else json.dumps(arguments or {})
