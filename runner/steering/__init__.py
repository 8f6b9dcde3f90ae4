"""Steering: what the harness adds to a run so that a small model finishes it, as policies.

A large hosted model needs none of this; a 0.5-1.5B local model does. Each policy
(`registry.REGISTRY`) has a name, the hooks it implements, a scope (when it applies) and where
it can run; a model's manifest entry, ``--policy`` and the suite turn policies on by name.
Runner's loop asks this package, before each request, for its ``tool_choice``
(`tool_choice`), the tools it offers and the narrower set its calls must match
(`offered_tools`, `grammar_tools`), its extra fields (`request_fields`), its messages
(`request_messages`) and what to add before it (`before_request`); after a reply, what to say
after a protocol slip (`correction`) and whether to take an answer (`review_answer`, then
`final_verdict`: no answer gets one more attempt, `ask_once_more`, then fails the run); after
a tool call, the text of its result (`tool_result_text`). A new run gets its opening
(`opening`). `runner serve` runs the same code on a client's conversation (`serve`).

Every message the harness adds is a user message named ``runner`` carrying a
`runner.state.HarnessNote` (its kind and policy); every decision is a function of the run's
messages and tool runs (`view.View`), so a resumed run decides what the killed one would have.
"""

from runner.state import RunState
from runner.steering.checks import answer_keys, disagree
from runner.steering.prompt import folder_listing, grammar_tools, offered_tools, opening, tool_result_text
from runner.steering.questions import FOLDER_QUESTION, mentions, question_words
from runner.steering.registry import (
    BY_NAME,
    NEW_POLICIES,
    POLICIES,
    REGISTRY,
    Policy,
    active,
    active_for_entry,
    edited,
    fields_for,
    split_fields,
    with_endpoint,
)
from runner.steering.reviews import (
    ask_once_more,
    final_verdict,
    non_answers,
    review_answer,
    unmade_change,
    unsupported_claim,
)
from runner.steering.texts import CORRECTIVE_NAME
from runner.steering.turns import (
    TOP_LOGPROBS,
    answers_repeat,
    before_request,
    correction,
    first_turn_choice,
    request_fields,
    request_messages,
    tool_choice,
)
from runner.steering.view import View, view

__all__ = [
    "BY_NAME", "CORRECTIVE_NAME", "FOLDER_QUESTION", "NEW_POLICIES", "POLICIES", "REGISTRY", "TOP_LOGPROBS", "Policy",
    "View", "active", "active_for_entry", "answer_keys", "answers_repeat", "ask_once_more", "before_request",
    "correction", "disagree", "edited", "fields_for", "final_verdict", "first_turn_choice", "folder_listing",
    "grammar_tools", "mentions", "non_answers", "offered_tools", "opening", "question", "question_words",
    "request_fields", "request_messages", "review_answer", "small_talk", "split_fields",
    "tool_choice", "tool_result_text", "unmade_change", "unsupported_claim", "view", "with_endpoint",
]


def question(state: RunState) -> str:
    """The run's task: the last user message the harness did not write (a run's prompt)."""
    return view(state).question


def small_talk(state: RunState) -> bool:
    """The run's task is only small talk: nothing to look up, its answer not reviewed."""
    return view(state).small_talk

