"""Property tests (hypothesis) for the pure pieces: state round-trips, call signatures,
pending(), fault specs, and the scripted provider's purity."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from runner.endpoints import Endpoint
from runner.scripted import SCENARIOS, parse_faults, reply_for
from runner.state import FunctionCall, Limits, Message, RunConfig, RunState, ToolCall, call_signature, new_run, pending

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
names = st.sampled_from(["list_files", "read_file", "delete_file", "scan_archive"])

# No per-example deadline: these check behaviour, and a loaded machine stalls an example now and
# then (timings are measured by scripts/, side by side, never by unit tests).
settings.register_profile("no_deadline", deadline=None)
settings.load_profile("no_deadline")


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5), names)
def test_signature_ignores_key_order_and_spacing(args: dict, name: str) -> None:  # type: ignore[type-arg]
    compact = json.dumps(args, separators=(",", ":"))
    spaced = json.dumps(dict(reversed(list(args.items()))), indent=2)
    assert call_signature(name, compact) == call_signature(name, spaced)


@given(st.dictionaries(st.text(max_size=8), json_values, min_size=1, max_size=5), names)
def test_signature_changes_with_arguments(args: dict, name: str) -> None:  # type: ignore[type-arg]
    changed = {**args, "__extra__": 1}
    assert call_signature(name, json.dumps(args)) != call_signature(name, json.dumps(changed))


messages = st.builds(
    Message,
    role=st.sampled_from(["user", "assistant", "tool"]),
    content=st.none() | st.text(max_size=30),
    tool_calls=st.none() | st.lists(st.builds(ToolCall, id=st.text(min_size=1, max_size=6),
                                             function=st.builds(FunctionCall, name=names,
                                                                arguments=st.just("{}"))), max_size=3),
    tool_call_id=st.none() | st.text(min_size=1, max_size=6),
)


@settings(max_examples=60)
@given(st.lists(messages, max_size=8), st.integers(0, 50), st.floats(0, 10, allow_nan=False))
def test_state_round_trips_through_json(msgs: list[Message], turns: int, cost: float) -> None:
    state = new_run("hi", RunConfig(endpoint=Endpoint(model="m"), limits=Limits(max_turns=7)))
    state.messages += msgs
    state.turns, state.cost_usd = turns, cost
    again = RunState.model_validate_json(state.model_dump_json())
    assert again == state


@given(st.lists(messages, max_size=8))
def test_pending_is_the_unanswered_calls_of_the_last_assistant(msgs: list[Message]) -> None:
    state = new_run("hi", RunConfig(endpoint=Endpoint(model="m")))
    state.messages += msgs
    result = pending(state)
    assistants = [i for i, m in enumerate(state.messages) if m.role == "assistant"]
    if not assistants:
        assert result == []
        return
    last = assistants[-1]
    answered = {m.tool_call_id for m in state.messages[last + 1:] if m.role == "tool"}
    assert all(c.id not in answered for c in result)
    assert all(c in (state.messages[last].tool_calls or []) for c in result)


@given(st.dictionaries(st.integers(1, 200), st.sampled_from(["429", "500", "401", "truncated", "slow"]), max_size=5))
def test_fault_specs_parse_back(faults: dict[int, str]) -> None:
    spec = ",".join(f"{kind}@{turn}" for turn, kind in faults.items())
    assert parse_faults(spec) == faults


@given(st.sampled_from(sorted(SCENARIOS)), st.lists(st.sampled_from(["assistant", "tool", "user"]), max_size=6),
       st.text(max_size=40))
def test_scripted_replies_are_a_pure_function_of_the_conversation(scenario: str, roles: list[str], text: str) -> None:
    convo = [{"role": r, "content": text} for r in roles]
    assert reply_for(scenario, convo) == reply_for(scenario, json.loads(json.dumps(convo)))
