"""Replies that are not answers: streams cut off at any point, error objects sent as chunks,
replies without a finish_reason, and calls the server dropped.

The provider is `tests.fakeprovider`, a real HTTP server on loopback that can stop a stream
at any byte; runner's own client reads it (streamed when someone watches the turn, as the
CLI does, plain otherwise).
"""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from runner.client import ChatClient, ChatReply
from runner.errors import ProviderError
from runner.state import Message
from tests.conftest import cli, cli_json, drive, scripted_run
from tests.fakeprovider import Answer, FakeProvider, completion, stream, tool_call

PROSE = {"role": "assistant", "content": "The file says to rotate your logs every week."}
CALL = {"role": "assistant", "content": None, "tool_calls": [tool_call("c1", "read_file", '{"path": "notes.txt"}')]}


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider(lambda body: completion(PROSE)) as server:
        yield server


def _ask(fake: FakeProvider, streamed: bool = True, max_retries: int = 0) -> ChatReply:
    async def go() -> ChatReply:
        async with ChatClient(fake.base_url, max_retries=max_retries, backoff_s=0.0) as client:
            return await client.chat("m", [Message(role="user", content="Go.")],
                                     on_delta=(lambda progress: None) if streamed else None)

    return asyncio.run(go())


def _failure(fake: FakeProvider, streamed: bool = True) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        _ask(fake, streamed)
    return caught.value


def _finish_index(events: list[Any]) -> int:
    return next(i for i, e in enumerate(events) if isinstance(e, dict) and any(
        c.get("finish_reason") for c in e.get("choices") or []))


@pytest.mark.parametrize("message", [PROSE, CALL], ids=["prose", "call"])
def test_a_stream_cut_at_any_chunk_boundary_is_a_provider_failure(fake: FakeProvider, message: dict[str, Any]) -> None:
    events = stream(message)
    fake.handler = lambda body: Answer(events=events)
    whole = _ask(fake)  # the uncut stream is a reply
    assert whole.finish_reason == ("tool_calls" if message is CALL else "stop")
    assert whole.message.content == message["content"] and whole.prompt_tokens == 100
    assert bool(whole.message.tool_calls) == (message is CALL)
    sizes = [len(Answer(events=events[:k]).stream_bytes()) for k in range(len(events) + 1)]
    for k in range(_finish_index(events) + 1):  # every cut that loses the finish chunk
        for answer in (Answer(events=events, cut=sizes[k]),  # the connection closes cleanly
                       Answer(events=[*events[:k], "[DONE]"]),  # a [DONE] right after the cut
                       Answer(events=events, cut=sizes[k], declared=True),  # a broken transfer
                       Answer(events=events, cut=sizes[k] + 9),  # mid-chunk
                       Answer(events=events, cut=sizes[k] + 9, declared=True)):
            fake.handler = functools.partial(_same, answer)
            err = _failure(fake)
            assert err.kind == "unavailable" and err.status is None, (k, answer.cut, str(err))
    fake.handler = lambda body: Answer(events=events, cut=sizes[-2])  # no [DONE], finish given
    assert _ask(fake).message.content == message["content"]


def test_the_failure_says_what_was_wrong_with_the_stream(fake: FakeProvider) -> None:
    events = stream(PROSE)
    fake.handler = lambda body: Answer(events=events[:3])
    assert "ended without a finish_reason after 2 chunks" in str(_failure(fake))
    cut = len(Answer(events=events[:3]).stream_bytes()) + 9
    fake.handler = lambda body: Answer(events=events, cut=cut, declared=True)
    assert "the stream broke off" in str(_failure(fake))
    fake.handler = lambda body: Answer(events=events, cut=cut)
    assert "not JSON" in str(_failure(fake))


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "plain"])
def test_a_reply_without_finish_reason_is_retried_then_interrupted_and_resumes(
    fake: FakeProvider, runs: Path, streamed: bool,
) -> None:
    cut = stream(PROSE, finish="")  # every content chunk, usage and [DONE], but no finish_reason
    plain = completion(PROSE)
    plain.body["choices"][0]["finish_reason"] = None
    fake.handler = lambda body: Answer(events=cut) if streamed else plain
    watch = {"on_turn": (lambda progress: None)} if streamed else {}
    state = drive(scripted_run("fake", base_url=fake.base_url, max_retries=1), fake.base_url, runs, **watch)
    assert state.status == "interrupted" and state.answer == "" and len(fake.requests) == 2
    assert state.interruption is not None and state.interruption.type == "provider_unavailable"
    assert "finish_reason" in state.interruption.message and state.interruption.retries == 1
    assert state.turns == 0 and state.cost_usd == 0 and [m.role for m in state.messages] == ["user"]

    fake.handler = lambda body: Answer(events=stream(PROSE)) if streamed else completion(PROSE)
    state = drive(state, fake.base_url, runs, **watch)
    assert state.status == "completed" and state.answer == PROSE["content"] and state.turns == 1


def test_the_cli_never_prints_a_cut_stream_as_the_answer(fake: FakeProvider, runs: Path) -> None:
    events = stream(PROSE)
    fake.handler = lambda body: Answer(events=events[:4])  # "I will read the " and no finish
    proc = cli("run", "Go.", "--base-url", fake.base_url, "--model", "m", "--max-retries", "1", runs_dir=runs)
    assert proc.returncode == 1 and "not kept" in proc.stderr, proc.stdout + proc.stderr  # nothing was paid
    assert "I will read the" not in proc.stdout + proc.stderr
    proc = cli("run", "Go.", "--base-url", fake.base_url, "--model", "m", "--max-retries", "1", "--keep", runs_dir=runs)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "interrupted" in proc.stdout and "I will read the" not in proc.stdout + proc.stderr
    assert "ended without a finish_reason" in proc.stdout + proc.stderr
    assert all(body.get("stream") for body in fake.requests)  # the CLI's default path streams
    code, out = cli_json("runs", runs_dir=runs)
    assert code == 0 and [r["status"] for r in out] == ["interrupted"]


ERROR = {"message": "Internal server error", "type": "server_error"}


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "plain"])
@pytest.mark.parametrize("error, kind, status", [
    (ERROR, "unavailable", None),
    ({"message": "overloaded", "code": 503}, "unavailable", 503),
    ({"message": "Incorrect API key provided", "type": "invalid_request_error", "code": 401}, "auth", 401),
    ({"message": "This model's maximum context length is 4096 tokens", "code": "context_length_exceeded"},
     "context_overflow", None),
    ("Internal server error", "unavailable", None),
])
def test_an_error_object_is_the_same_error_in_a_stream_and_in_a_body(
    fake: FakeProvider, streamed: bool, error: Any, kind: str, status: int | None,
) -> None:
    if streamed:
        head = stream(PROSE)[:2]  # the error may come after some content
        fake.handler = lambda body: Answer(events=[*head, {"error": error}, "[DONE]"])
    else:
        fake.handler = lambda body: Answer(200, {"error": error})
    err = _failure(fake, streamed)
    assert (err.kind, err.status) == (kind, status)
    message = error["message"] if isinstance(error, dict) else error
    assert message in str(err) and ("a stream" if streamed else "a 200 body") in str(err)


def test_a_streamed_error_is_retried_and_its_message_kept(fake: FakeProvider, runs: Path) -> None:
    fake.handler = lambda body: Answer(events=[{"error": ERROR}, "[DONE]"])
    state = drive(scripted_run("fake", base_url=fake.base_url, max_retries=2), fake.base_url, runs,
                  on_turn=lambda progress: None)
    assert state.status == "interrupted" and len(fake.requests) == 3
    assert state.interruption is not None and state.interruption.type == "provider_unavailable"
    assert state.interruption.message == "error in a stream: Internal server error"
    assert state.per_turn == [] and state.error is None


DROPPED = {"role": "assistant", "content": "Let me read it."}


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "plain"])
def test_a_reply_whose_call_the_server_dropped_is_a_slip(fake: FakeProvider, runs: Path, streamed: bool) -> None:
    def dropped() -> Answer:
        if streamed:
            return Answer(events=stream(DROPPED, finish="length", extra={"runner": {"dropped_call": True}}))
        answer = completion(DROPPED, finish="length")
        answer.body["runner"] = {"dropped_call": True}
        return answer

    fake.handler = lambda body: dropped()
    watch = {"on_turn": (lambda progress: None)} if streamed else {}
    state = drive(scripted_run("fake", base_url=fake.base_url), fake.base_url, runs, **watch)
    assert state.status == "failed" and state.answer == "" and state.turns == 3
    assert state.error is not None and state.error.type == "protocol_slip" and "dropped_call" in (state.reason or "")
    assert [t.slip for t in state.per_turn] == ["dropped_call"] * 3

    replies = iter([dropped(), Answer(events=stream(PROSE)) if streamed else completion(PROSE)])
    fake.handler = lambda body: next(replies)
    state = drive(scripted_run("fake", base_url=fake.base_url), fake.base_url, None, **watch)
    assert state.status == "completed" and state.answer == PROSE["content"]
    assert [t.slip for t in state.per_turn] == ["dropped_call", None]


def test_a_dropped_call_is_answered_with_a_correction_of_its_own(fake: FakeProvider) -> None:
    """Corrective retries say the call was not complete, not that the reply was empty."""
    answer = completion(DROPPED, finish="length")
    answer.body["runner"] = {"dropped_call": True}
    replies = iter([answer, completion(PROSE)])
    fake.handler = lambda body: next(replies)
    state = drive(scripted_run("fake", base_url=fake.base_url, on_slip="corrective"), fake.base_url, None)
    assert state.status == "completed" and [t.slip for t in state.per_turn] == ["dropped_call", None]
    said = fake.requests[-1]["messages"][-1]["content"]
    assert said.startswith("Your last reply began a tool call that was not complete") and "empty" not in said


def test_dropped_call_false_is_an_answer(fake: FakeProvider) -> None:
    answer = completion(PROSE)
    answer.body["runner"] = {"dropped_call": False}
    fake.handler = lambda body: answer
    state = drive(scripted_run("fake", base_url=fake.base_url), fake.base_url, None)
    assert state.status == "completed" and state.answer == PROSE["content"]


def test_the_fake_stream_is_valid_sse() -> None:
    text = Answer(events=stream(CALL)).stream_bytes().decode()
    datas = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    assert datas[-1] == "[DONE]" and all(json.loads(d) for d in datas[:-1])


def _same(answer: Answer, body: dict[str, Any]) -> Answer:
    """A fake-provider handler that gives `answer` to every request."""
    return answer


@pytest.fixture(scope="module")
def smollm2() -> Iterator[str]:
    from runner import models
    from runner.local import LocalServer

    with LocalServer(models.resolve("smollm2-135m-instruct"), model_name="smollm2", prefix_cache_mb=0) as server:
        yield server.base_url


@pytest.mark.llama
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "plain"])
def test_the_local_servers_dropped_call_is_a_slip(smollm2: str, streamed: bool) -> None:
    """The real llama.cpp server: turn 1 must be a call (tool_choice required) and max_tokens
    cuts it off, so the server drops it and says so; the run never takes it as an answer."""
    watch = {"on_turn": (lambda progress: None)} if streamed else {}
    state = drive(scripted_run("fake", model="smollm2", base_url=smollm2, max_tokens=6, max_turns=2,
                               first_turn_tool_choice="required"), smollm2, None, **watch)
    first = state.per_turn[0]
    assert first.slip == "dropped_call" and first.finish_reason == "length"
    assert all(m.role != "assistant" for m in state.messages[:2])  # the dropped reply was not kept
