"""`runner serve` for clients that do not steer, on the real llama.cpp server with the packaged
SmolLM2: what every reply gets (never empty, a call sent once, OpenAI's default
parallel_tool_calls), the server's steering (`--steer`) as its header and its log line say, and a
server with steering off that samples exactly the request it was sent."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runner import models
from runner.engine import ChatRequest, Engine
from runner.local import LocalServer, LocalSettings, load_llama
from runner.local_app import PARALLEL_HEADER, STEERING_HEADER, complete
from runner.steering.serve import Steering, for_mode, repeats_only, steer

SMOL = "smollm2-135m-instruct"
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
UNTAGGED_CALL = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'


def call(call_id: str, city: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


def looked_up(call_id: str, city: str) -> list[dict[str, Any]]:
    """The assistant's call for `city`'s weather and its result."""
    return [{"role": "assistant", "content": None, "tool_calls": [call(call_id, city)]},
            {"role": "tool", "tool_call_id": call_id, "content": f"{city}: 9 C"}]


AFTER_RESULTS = [{"role": "user", "content": "Weather in Oslo?"}, *looked_up("c0", "Oslo"),
                 {"role": "assistant", "content": ""},
                 {"role": "user", "content": "Weather in Paris?"}, *looked_up("c1", "Paris")]
"""A conversation after which SmolLM2's greedy reply ends its turn at once (it did so before)."""
REPEATED = [{"role": "user", "content": "Weather in Paris?"}, *looked_up("c0", "Paris"), *looked_up("c1", "Paris")]
"""The model's last turn repeated a call already answered."""
REPEATS_AGAIN = [{"role": "user", "content": "Weather in Rome?"}, *(m for i in range(3) for m in looked_up(f"a{i}", "Rome")),
                 {"role": "assistant", "content": "Rome: 9 C"},
                 {"role": "user", "content": "Weather in Oslo?"}, *looked_up("b0", "Oslo")]
"""After an earlier question looked up three times, SmolLM2 calls for Oslo's weather again."""
DOUBLED = [message for _ in range(3) for message in (
    {"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": f"{UNTAGGED_CALL}\n{UNTAGGED_CALL}"},
)] + [{"role": "user", "content": "Weather in Oslo?"}]
"""Earlier replies wrote the same untagged call twice: SmolLM2 does it again."""


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """Steering off, untagged calls read (SmolLM2's manifest entry: parallel calls allowed)."""
    log = tmp_path_factory.mktemp("plain") / "server.log"
    settings = LocalSettings(model=models.resolve(SMOL), port=0, n_threads=1, untagged_calls="on")
    with LocalServer(settings, log_path=log) as running:
        yield running


@pytest.fixture(scope="module")
def steered_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """`--steer default` under a manifest whose SmolLM2 entry says one call per reply and names
    two server policies."""
    folder = tmp_path_factory.mktemp("steered")
    manifest = json.loads(models.manifest_path().read_text(encoding="utf-8"))
    for entry in manifest["models"]:
        if entry["name"] == SMOL:
            entry.update(parallel_tool_calls=False, serve_policies=["first_turn_required", "answer_on_stall"])
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    settings = LocalSettings(model=models.resolve(SMOL), port=0, n_threads=1, steer="default")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RUNNER_MANIFEST", str(folder / "manifest.json"))
        with LocalServer(settings, log_path=folder / "server.log") as running:
            yield running


def chat(server: LocalServer, **body: Any) -> httpx.Response:
    reply = httpx.post(server.base_url + "/chat/completions", json={"model": "m", "tools": WEATHER, **body},
                       timeout=120)
    assert reply.status_code == 200, reply.text
    return reply


def log_lines(server: LocalServer, at_least: int = 0, timeout_s: float = 10.0) -> list[str]:
    """The server log's request lines, once it holds `at_least` of them (the server writes a
    request's line after its reply is sent, so the line may lag the reply a little)."""
    assert server.log_path is not None
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [line for line in server.log_path.read_text().splitlines() if line.startswith("request: POST")]
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_the_reply_after_tool_results_is_never_empty(plain_server: LocalServer) -> None:
    before = len(log_lines(plain_server))
    reply = chat(plain_server, messages=AFTER_RESULTS, max_tokens=24).json()
    message = reply["choices"][0]["message"]
    assert reply["runner"]["blank_refused"] >= 1  # greedy decoding would have ended the turn here
    assert (message["content"] or "").strip() or message.get("tool_calls")
    assert " reply=empty" not in log_lines(plain_server, at_least=before + 1)[before]


def test_identical_calls_in_one_reply_are_sent_once(plain_server: LocalServer) -> None:
    reply = chat(plain_server, messages=DOUBLED, max_tokens=80).json()
    assert reply["runner"]["parallel_tool_calls"] is True
    assert reply["runner"]["duplicate_calls"] == 1
    assert [c["function"]["arguments"] for c in reply["choices"][0]["message"]["tool_calls"]] == ['{"city": "Oslo"}']


def test_a_request_that_does_not_say_gets_openais_parallel_calls_whatever_the_manifest_says(
        plain_server: LocalServer, steered_server: LocalServer) -> None:
    """The manifest's parallel_tool_calls is a default for runner's own loop, which sends it; a
    client that does not say gets OpenAI's default, several calls allowed."""
    before = len(log_lines(steered_server))
    unsaid = chat(steered_server, messages=REPEATED, tool_choice="required")
    assert unsaid.headers[PARALLEL_HEADER] == "true" and unsaid.json()["runner"]["parallel_tool_calls"] is True
    said = chat(steered_server, messages=REPEATED, tool_choice="required", parallel_tool_calls=False)
    assert said.headers[PARALLEL_HEADER] == "false" and said.json()["runner"]["parallel_tool_calls"] is False
    assert chat(plain_server, messages=REPEATED, tool_choice="required").headers[PARALLEL_HEADER] == "true"
    assert log_lines(steered_server, at_least=before + 2)[before].count("parallel=true") == 1


def test_steering_is_reported_in_the_header_the_reply_and_the_log(steered_server: LocalServer) -> None:
    before = len(log_lines(steered_server))
    first = chat(steered_server, messages=[{"role": "user", "content": "Weather in Oslo?"}], max_tokens=60)
    assert first.headers[STEERING_HEADER] == "first_turn_required"
    assert first.json()["runner"]["tool_choice"] == "required" and first.json()["choices"][0]["message"]["tool_calls"]
    repeated = chat(steered_server, messages=REPEATED, max_tokens=40)
    assert repeated.headers[STEERING_HEADER] == "answer_on_stall"
    message = repeated.json()["choices"][0]["message"]
    assert repeated.json()["runner"]["tool_choice"] == "none" and not message.get("tool_calls")
    assert (message["content"] or "").strip()
    kept = chat(steered_server, messages=REPEATED, tool_choice="required", max_tokens=40)
    assert kept.headers[STEERING_HEADER] == "none"  # a client's own tool_choice stands
    lines = log_lines(steered_server, at_least=before + 3)[before:]
    assert [line.split(" steer=")[1].split()[0] for line in lines] == ["first_turn_required", "answer_on_stall", "none"]


def test_a_reply_sampled_again_counts_the_tokens_of_both_generations(steered_server: LocalServer) -> None:
    reply = chat(steered_server, messages=REPEATS_AGAIN, max_tokens=40)
    assert reply.headers[STEERING_HEADER] == "answer_on_stall"  # decided after the reply, not before
    body = reply.json()
    first, timings = body["runner"]["resampled_from_tokens"], body["runner"]
    assert first > timings["prompt_tokens"] > 0
    assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] == \
        timings["prompt_tokens"] + timings["eval_tokens"] + first


def test_with_steering_off_the_server_samples_the_request_as_sent(plain_server: LocalServer) -> None:
    engine = Engine(load_llama(LocalSettings(model=models.resolve(SMOL), n_threads=1)), untagged_calls=True)
    for messages in ([{"role": "user", "content": "Weather in Oslo?"}], REPEATED):
        reply = chat(plain_server, messages=messages, max_tokens=40)
        assert reply.headers[STEERING_HEADER] == "off"
        assert reply.json()["runner"]["tool_choice"] is None
        alone = complete(engine.stream(ChatRequest(messages=messages, tools=WEATHER, max_tokens=40), threading.Event()),
                         "m", 0, "x")
        assert reply.json()["choices"][0]["message"] == alone["choices"][0]["message"]


def test_the_policies_read_the_conversation_alone() -> None:
    on = for_mode("on", [], None)
    asked = [{"role": "user", "content": "How warm is it in Oslo?"}]
    assert steer(on, asked, WEATHER, None).tool_choice == "required"
    assert steer(on, asked, [], None).fired is None  # no tools offered
    assert steer(on, [{"role": "user", "content": "Hi"}], WEATHER, None).fired is None  # small talk: nothing to look up
    assert steer(on, REPEATED, WEATHER, "auto").fired == "answer_on_stall"
    assert steer(on, REPEATED, WEATHER, {"type": "function", "function": {"name": "get_weather"}}).fired is None
    after_one = steer(on, REPEATED[:3], WEATHER, None)
    assert after_one.fired is None and repeats_only(after_one, [call("c9", "Paris")])
    assert not repeats_only(after_one, [call("c9", "Rome")])
    turns = [{"role": "user", "content": "Weather?"}] + [m for i in range(3) for m in looked_up(f"c{i}", f"city{i}")]
    assert steer(Steering(("answer_forcing",), answer_after_turns=3), turns, WEATHER, None).tool_choice == "none"
    assert steer(Steering(("answer_forcing",), answer_after_turns=4), turns, WEATHER, None).fired is None
    assert for_mode("off", ["answer_on_stall"], None).policies == ()
    assert for_mode("default", ["answer_on_stall"], 2) == Steering(("answer_on_stall",), 2)
    with pytest.raises(ValueError, match="unknown server policy 'guess'"):
        for_mode("default", ["guess"], None)


def test_a_streamed_reply_carries_the_steering_in_its_header_and_last_chunk(steered_server: LocalServer) -> None:
    body = {"model": "m", "tools": WEATHER, "messages": REPEATED, "max_tokens": 40, "stream": True}
    with httpx.stream("POST", steered_server.base_url + "/chat/completions", json=body, timeout=120) as reply:
        assert reply.headers[STEERING_HEADER] == "answer_on_stall" and reply.headers[PARALLEL_HEADER] == "true"
        chunks = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["runner"]["steering"] == "answer_on_stall"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]).strip()


def test_the_loop_and_the_server_run_the_same_policy_and_decide_alike() -> None:
    """answer_on_stall and answer_forcing in runner's loop (a real run against a fake provider)
    and in `runner serve`'s steering (the same conversation, as a client would send it): the
    same turn is asked for as an answer, by the same policy."""
    from tests.conftest import drive, scripted_run
    from tests.fakeprovider import FakeProvider, completion, tool_call

    for settings, policy in (({"answer_on_stall": True}, "answer_on_stall"),
                             ({"answer_after_tool_turns": 2}, "answer_forcing")):
        def model(body: dict[str, Any]) -> Any:
            if body.get("tool_choice") == "none":
                return completion({"role": "assistant", "content": "Paris: 9 C."})
            turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
            return completion({"role": "assistant", "content": None, "tool_calls": [
                tool_call(f"c{turn}", "read_file", json.dumps({"path": "notes.txt"}))]})

        with FakeProvider(model) as fake:
            state = drive(scripted_run("fake", prompt="What does notes.txt say?", base_url=fake.base_url,
                                       first_turn_tool_choice="required", **settings), fake.base_url, None)
        loop_choices = [r.get("tool_choice") for r in fake.requests]
        assert loop_choices == ["required", "auto", "none"]
        assert [m.harness.policy for m in state.messages if m.harness] == [policy]
        tools = fake.requests[0]["tools"]
        steering = Steering(("first_turn_required", policy), answer_after_turns=2)
        client = [m for m in fake.requests[-1]["messages"] if m.get("name") != "runner"]
        served = [steer(steering, client[:i + 1], tools, None)
                  for i, m in enumerate(client) if m["role"] in ("user", "tool")]
        assert [s.tool_choice for s in served] == ["required", None, "none"]  # None: the client's (auto) stands
        assert [s.fired for s in served] == ["first_turn_required", None, policy]
