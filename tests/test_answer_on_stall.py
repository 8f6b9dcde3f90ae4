"""Answer forcing that reacts to stalls: a turn of calls that brings nothing new, or an empty
reply after results, gets the request for the answer (``tool_choice: "none"``); the request
restates the successful results when the last calls failed; ``parallel_tool_calls`` is sent.

The provider is `tests.fakeprovider`, a real HTTP server on loopback; the loop, the client and
the tools run for real against the task workspace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from runner.steering.texts import ASK_FOR_ANSWER, ASK_WITHOUT_RESULTS
from tests.conftest import drive, scripted_run
from tests.fakeprovider import Answer, FakeProvider, completion, error, tool_call

ANSWER = completion({"role": "assistant", "content": "Done."})


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider(lambda body: error(500, "no handler set")) as server:
        yield server


def _calls(*calls: tuple[str, str]) -> Answer:
    return completion({"role": "assistant", "content": None,
                       "tool_calls": [tool_call(f"c{i}_{name}", name, args) for i, (name, args) in enumerate(calls)]})


def _play(fake: FakeProvider, turns: list[Answer]) -> None:
    """Reply with `turns` in order to requests that offer tools, and "Done." once the answer is asked for."""
    replies = iter(turns)

    def handler(body: dict[str, Any]) -> Answer:
        return ANSWER if body.get("tool_choice") == "none" else next(replies)

    fake.handler = handler


def _run(fake: FakeProvider, **config: Any) -> Any:
    return scripted_run("fake", prompt="Which file is it?", base_url=fake.base_url,
                        answer_on_stall=True, answer_after_tool_turns=6, **config)


def test_new_successful_calls_keep_going_and_a_repeated_call_asks_for_the_answer(fake: FakeProvider) -> None:
    _play(fake, [_calls(("list_files", "{}")), _calls(("read_file", '{"path": "notes.txt"}')),
                 _calls(("read_file", '{"path": "errors.log"}')), _calls(("list_files", "{}"))])
    state = drive(_run(fake), fake.base_url, None)
    assert state.status == "completed" and state.answer == "Done."
    assert [r.get("tool_choice") for r in fake.requests] == ["auto", "auto", "auto", "auto", "none"]
    asked = fake.requests[-1]["messages"][-1]
    assert asked["name"] == "runner" and asked["content"] == ASK_FOR_ANSWER.format(question="Which file is it?")


def test_a_failed_call_after_a_success_asks_for_the_answer_restating_what_succeeded(fake: FakeProvider) -> None:
    _play(fake, [_calls(("read_file", '{"path": "notes.txt"}')), _calls(("read_file", '{"path": "nope.txt"}'))])
    state = drive(_run(fake, answer_restates_results="after_failure"), fake.base_url, None)
    assert state.status == "completed" and len(fake.requests) == 3
    asked = fake.requests[-1]["messages"][-1]["content"]
    assert "--- read_file notes.txt ---\nRemember to rotate your logs." in asked
    assert "nope.txt" not in asked and asked.endswith(": Which file is it?")


def test_always_restating_restates_after_a_success_too(fake: FakeProvider) -> None:
    _play(fake, [_calls(("list_files", "{}")), _calls(("list_files", "{}"))])
    drive(_run(fake, answer_restates_results="always"), fake.base_url, None)
    asked = fake.requests[-1]["messages"][-1]["content"]
    assert asked.startswith("Here is what the tools returned:\n\n--- list_files ---\naccess.log (195 bytes)")
    assert asked.count("--- list_files ---") == 1  # a repeated call is restated once


def test_without_restating_the_request_is_the_plain_one(fake: FakeProvider) -> None:
    _play(fake, [_calls(("read_file", '{"path": "notes.txt"}')), _calls(("read_file", '{"path": "nope.txt"}'))])
    drive(_run(fake), fake.base_url, None)
    assert fake.requests[-1]["messages"][-1]["content"] == ASK_FOR_ANSWER.format(question="Which file is it?")


def test_when_every_call_failed_the_request_does_not_point_to_results(fake: FakeProvider) -> None:
    """Answer forcing after failures only: there are no results above to answer from."""
    _play(fake, [_calls(("read_file", '{"path": "nope.txt"}')), _calls(("read_file", '{"path": "gone.txt"}'))])
    run = scripted_run("fake", prompt="Which file is it?", base_url=fake.base_url, answer_on_stall=True,
                       answer_after_tool_turns=2, answer_restates_results="after_failure")
    state = drive(run, fake.base_url, None)
    assert state.status == "completed" and [r.get("tool_choice") for r in fake.requests] == ["auto", "auto", "none"]
    asked = fake.requests[-1]["messages"][-1]["content"]
    assert asked == ASK_WITHOUT_RESULTS.format(question="Which file is it?") and "results above" not in asked


def test_failures_alone_are_not_a_stall(fake: FakeProvider) -> None:
    """Nothing succeeded yet: there is nothing to answer from, so the model keeps its tools."""
    _play(fake, [_calls(("read_file", '{"path": "nope.txt"}')), _calls(("list_files", "{}")),
                 _calls(("list_files", "{}"))])
    state = drive(_run(fake), fake.base_url, None)
    assert state.status == "completed"
    assert [r.get("tool_choice") for r in fake.requests] == ["auto", "auto", "auto", "none"]


def test_an_empty_reply_after_results_asks_for_the_answer_with_tools_hidden(fake: FakeProvider) -> None:
    blank = completion({"role": "assistant", "content": ""})
    _play(fake, [_calls(("list_files", "{}")), blank])
    state = drive(_run(fake), fake.base_url, None)
    assert state.status == "completed" and state.answer == "Done."
    assert [t.slip for t in state.per_turn] == [None, "blank_content", None]
    assert fake.requests[-1]["tool_choice"] == "none"
    assert fake.requests[-1]["messages"][-1]["content"] == ASK_FOR_ANSWER.format(question="Which file is it?")


def test_without_answer_on_stall_a_repeated_call_is_run_again(fake: FakeProvider) -> None:
    _play(fake, [_calls(("list_files", "{}")), _calls(("list_files", "{}")), ANSWER])
    state = drive(scripted_run("fake", prompt="Go.", base_url=fake.base_url), fake.base_url, None)
    assert state.status == "completed" and state.tool_run_count == 2
    assert all(r.get("tool_choice") == "auto" for r in fake.requests)


def test_parallel_tool_calls_is_sent_when_set(fake: FakeProvider, tmp_path: Path) -> None:
    fake.handler = lambda body: ANSWER
    drive(scripted_run("fake", prompt="Go.", base_url=fake.base_url, parallel_tool_calls=False), fake.base_url, None)
    drive(scripted_run("fake", prompt="Go.", base_url=fake.base_url), fake.base_url, None)
    assert [r.get("parallel_tool_calls", "unset") for r in fake.requests] == [False, "unset"]


def test_a_declined_call_is_restated_with_the_results(fake: FakeProvider) -> None:
    """The user declined a call: when the answer is asked for with the results restated, the
    rejection is among them, so the model does not answer as if the call had run."""
    from runner import loop

    _play(fake, [_calls(("delete_file", '{"path": "access.log"}')), _calls(("list_files", "{}")),
                 _calls(("list_files", "{}"))])
    state = drive(_run(fake, answer_restates_results="always"), fake.base_url, None)
    assert state.status == "interrupted" and state.interruption is not None and state.interruption.type == "approval"
    loop.reject(state, state.interruption.call_id, "keep it for the audit")
    state = drive(state, fake.base_url, None)
    assert state.status == "completed"
    asked = fake.requests[-1]["messages"][-1]["content"]
    assert "--- delete_file access.log ---\nThe user declined this call: keep it for the audit" in asked, asked
    assert asked.count("--- list_files ---") == 1


def test_show_keeps_the_request_line_of_a_long_restated_request(fake: FakeProvider) -> None:
    """`runner show` cuts a long message of runner's, but never the line that says what it asks."""
    from runner.render import RESULT_LINES, transcript_lines

    _play(fake, [_calls(("list_files", "{}")), _calls(("list_files", "{}"))])
    state = drive(_run(fake, answer_restates_results="always"), fake.base_url, None)
    asked = fake.requests[-1]["messages"][-1]["content"]
    assert len(asked.splitlines()) > RESULT_LINES + 1
    lines = transcript_lines(state, [], width=80)
    at = lines.index(next(line for line in lines if line.startswith("── runner (asks for the answer; answer_on_stall)")))
    cut = lines[at + 1:at + RESULT_LINES + 3]
    assert cut[RESULT_LINES].startswith("… ") and cut[RESULT_LINES].endswith("(--full shows all)")
    assert cut[-1] == "Using only this, answer in one short sentence: Which file is it?"


def test_show_marks_a_reply_cut_off_at_its_token_limit(fake: FakeProvider) -> None:
    from runner.render import transcript_lines

    fake.handler = lambda body: completion({"role": "assistant", "content": "The file to rotate is"}, finish="length")
    state = drive(_run(fake, max_tokens=5), fake.base_url, None)
    assert state.per_turn[-1].finish_reason == "length"
    lines = transcript_lines(state, [], width=80)
    assert "  (cut off: the reply reached its token limit of 5)" in lines
