"""Steering inside `runner serve`: how a reply is sampled for a client whose loop does not steer.

runner's own loop steers a small model with named policies (`runner.policies`): answer forcing,
one call per turn, a first turn that must call. An agent framework talking to the server sends
none of that. For a request that carries the conversation, the server can read the same signs
from the messages alone and choose how this one reply is sampled: its ``tool_choice``, and
whether a reply that only repeats calls already answered is sampled again under ``tool_choice``
none. A reply the server asks to be an answer is sampled with the tools left out of the prompt
(measured on Qwen2.5-Coder-1.5B: with the tool schemas in view it describes the tools instead
of answering from their results). The server never adds, removes or rewrites a message, and a
``tool_choice`` the client set to something other than "auto" is the client's to keep.

`SERVER_POLICIES` says what each policy does; `runner serve --steer off|default|on` picks none,
the model manifest's ``serve_policies``, or all of them; `steer` applies them to one request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

SteerMode = Literal["off", "default", "on"]
"""off: no policy; default: the manifest's ``serve_policies`` for the model; on: every policy."""

SERVER_POLICIES: dict[str, str] = {
    "first_turn_required": "the reply to a user's message is sampled with tool_choice \"required\" (tools "
                           "offered, no tool result since that message): the model looks before it answers",
    "answer_on_repeat": "a reply whose calls all repeat calls already answered since the user's message "
                        "(or after a client's turn that did) is sampled again with tool_choice \"none\": the "
                        "model answers from the results it has",
    "answer_after_turns": "after N turns of tool calls since the user's message (the manifest's "
                          "answer_after_tool_turns, else 6), the reply is sampled with tool_choice \"none\"",
}
"""Every server policy, by name, in words (the order in which they are tried)."""
DEFAULT_ANSWER_AFTER_TURNS = 6
"""answer_after_turns' N for a model whose manifest entry sets no answer_after_tool_turns."""
STEERABLE_CHOICES = (None, "auto")
"""The client's tool_choice values the policies may replace (unset, or said outright as auto)."""


@dataclass(frozen=True)
class Steering:
    """The policies a server applies to every request, and their parameter.

    Attributes:
        policies: names from `SERVER_POLICIES`, in that order.
        answer_after_turns: N of answer_after_turns, turns of tool calls.
    """

    policies: tuple[str, ...] = ()
    answer_after_turns: int = DEFAULT_ANSWER_AFTER_TURNS


@dataclass(frozen=True)
class Steered:
    """How one reply is sampled.

    Attributes:
        tool_choice: the ``tool_choice`` the engine gets (the client's, unless a policy fired).
        fired: the policy that chose it, or None when the client's stands.
        answered: with answer_on_repeat, the calls already answered since the user's message,
            as `signature`s: a reply whose calls are all among them is sampled again as an
            answer (`repeats_only`); empty: no such check.
    """

    tool_choice: Any
    fired: str | None = None
    answered: frozenset[tuple[str, str]] = frozenset()


def for_mode(mode: SteerMode, manifest_policies: Sequence[str], answer_after_turns: int | None) -> Steering:
    """The `Steering` of a server in `mode` for a model whose manifest entry names
    `manifest_policies` and sets `answer_after_turns` (None: `DEFAULT_ANSWER_AFTER_TURNS`).

    Raises:
        ValueError: a manifest policy that is no server policy.
    """
    unknown = [n for n in manifest_policies if n not in SERVER_POLICIES]
    if unknown:
        raise ValueError(f"unknown server policy {unknown[0]!r}; policies: {', '.join(SERVER_POLICIES)}")
    chosen = {"off": (), "default": tuple(manifest_policies), "on": tuple(SERVER_POLICIES)}[mode]
    return Steering(tuple(n for n in SERVER_POLICIES if n in chosen), answer_after_turns or DEFAULT_ANSWER_AFTER_TURNS)


def steer(steering: Steering, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any],
          tool_choice: Any) -> Steered:
    """How the reply to `messages` is sampled: the first policy of `steering` that applies sets
    its ``tool_choice``; with none, or tools not offered, or a client's `tool_choice` other than
    unset/"auto", the client's stands."""
    if not steering.policies or not tools or tool_choice not in STEERABLE_CHOICES:
        return Steered(tool_choice)
    turns = _turns_since_user(messages)
    applies = {
        "first_turn_required": lambda: not turns and _last_role(messages) == "user",
        "answer_on_repeat": lambda: _last_role(messages) == "tool" and _last_turn_repeats(turns),
        "answer_after_turns": lambda: len(turns) >= steering.answer_after_turns and _last_role(messages) == "tool",
    }
    chosen = {"first_turn_required": "required", "answer_on_repeat": "none", "answer_after_turns": "none"}
    for name in steering.policies:
        if applies[name]():
            return Steered(chosen[name], name)
    watch = "answer_on_repeat" in steering.policies and _last_role(messages) == "tool"
    return Steered(tool_choice, answered=frozenset(c for turn in turns for c in turn) if watch else frozenset())


def repeats_only(steered: Steered, calls: Sequence[Mapping[str, Any]]) -> bool:
    """answer_on_repeat, after sampling: the reply made `calls` (OpenAI shape), every one of
    them already answered since the user's message."""
    return bool(calls) and bool(steered.answered) and all(signature(c) in steered.answered for c in calls)


def _last_role(messages: Sequence[Mapping[str, Any]]) -> str:
    return str(messages[-1].get("role")) if messages else ""


def _turns_since_user(messages: Sequence[Mapping[str, Any]]) -> list[list[tuple[str, str]]]:
    """The assistant turns of tool calls after the last user message, oldest first, each as its
    calls' (name, arguments in canonical JSON)."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    return [[signature(call) for call in m.get("tool_calls") or []]
            for m in messages[last_user + 1:] if m.get("role") == "assistant" and m.get("tool_calls")]


def _last_turn_repeats(turns: list[list[tuple[str, str]]]) -> bool:
    """Every call of the last turn of calls was made in an earlier turn since the user's message."""
    if len(turns) < 2:
        return False
    earlier = {call for turn in turns[:-1] for call in turn}
    return all(call in earlier for call in turns[-1])


def signature(call: Mapping[str, Any]) -> tuple[str, str]:
    """A call as (name, arguments in canonical JSON); arguments that are no JSON stay as sent."""
    function = call.get("function") or {}
    arguments = function.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return str(function.get("name")), str(arguments)
    return str(function.get("name")), json.dumps(parsed, sort_keys=True)
