"""The KV cache is kept on every kind of turn: a ``tool_choice: "none"`` request (the loop's
request for the answer) renders the tools where every other turn has them, so it evaluates only
the messages new since the turn before, and a grammar, not a rewritten prompt, rules out the
call. On the real llama.cpp server over loopback: SmolLM2 (tagged calls) and, pulled into the
models cache, Qwen2.5-Coder-0.5B (untagged calls)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from runner import models
from runner.chat_adapter import CALL_OPEN, PROSE_GRAMMAR, TAGLESS_GRAMMAR, no_call_grammar
from runner.local import LocalServer
from tests.test_local_server import ALL_TOOLS, SMOL, ask, grammar_allows, post

pytestmark = pytest.mark.llama

READ = '{"name": "read_file", "arguments": {"path": "notes.txt"}}'


def header_tokens(server: LocalServer) -> int:
    root = server.base_url.removesuffix("/v1")
    reply = httpx.post(f"{root}/extras/tokenize/count", json={"input": "<|im_start|>assistant\n"}, timeout=10)
    count: int = reply.json()["count"]
    return count


def conversation() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Turn 2's messages (after a call and its result) and turn 3's (the request for the answer)."""
    turn2 = ask("Which log file mentions a timeout?") + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "errors.log"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "2026-12-01 10:02 ERROR upstream timeout after 30 s"},
    ]
    turn3 = turn2 + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "access.log"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "GET /index.html 200"},
        {"role": "user", "content": "Using the tool results above, answer my question in one short sentence: "
                                    "Which log file mentions a timeout?"},
    ]
    return turn2, turn3


def test_a_tool_choice_none_turn_reuses_the_whole_conversation(smollm2_server: LocalServer) -> None:
    turn2, turn3 = conversation()
    before = post(smollm2_server, messages=turn2, tools=ALL_TOOLS, tool_choice="auto", max_tokens=8)
    forced = post(smollm2_server, messages=turn3, tools=ALL_TOOLS, tool_choice="none", max_tokens=48)
    header = header_tokens(smollm2_server)
    # Everything turn 2 sent but its assistant header stays in the cache; only the new
    # messages (a call, its result, the request) and the header are evaluated.
    assert forced["runner"]["cached_prompt_tokens"] == before["usage"]["prompt_tokens"] - header
    new = forced["usage"]["prompt_tokens"] - before["usage"]["prompt_tokens"]
    assert forced["runner"]["prompt_eval_tokens"] == new + header
    choice = forced["choices"][0]
    assert "tool_calls" not in choice["message"] and CALL_OPEN not in (choice["message"]["content"] or "")
    # The same turn with the tools left out of the request re-evaluates from the system turn on.
    hidden = post(smollm2_server, messages=turn3, max_tokens=1)
    assert hidden["runner"]["cached_prompt_tokens"] == 0


def test_the_tagless_grammar_admits_any_text_but_a_tagged_call() -> None:
    from llama_cpp import Llama

    vocab_model = Llama(model_path=str(models.resolve(SMOL)), vocab_only=True, verbose=False)
    for text in ["errors.log mentions the timeout.", "", "a < b and <tool> <tool_cal", "x <<tool_call", "{\"a\": 1}",
                 "Use <tool_callx>"]:
        assert grammar_allows(vocab_model, TAGLESS_GRAMMAR, text), text
    for text in [f"<tool_call>\n{READ}\n</tool_call>", f"Sure. <tool_call>{READ}", "<<tool_call>", "a<tool_call>"]:
        assert not grammar_allows(vocab_model, TAGLESS_GRAMMAR, text), text
    assert no_call_grammar(untagged_calls=False) == TAGLESS_GRAMMAR
    assert no_call_grammar(untagged_calls=True) == PROSE_GRAMMAR


def test_qwen_tool_call_token_is_refused_by_the_tagless_grammar() -> None:
    """Qwen2.5 spells ``<tool_call>`` as one special token; the grammar refuses it as a token too."""
    from llama_cpp import Llama

    vocab_model = Llama(model_path=str(models.pull("qwen2.5-coder-0.5b-instruct")), vocab_only=True, verbose=False)
    assert len(vocab_model.tokenize(CALL_OPEN.encode(), add_bos=False, special=True)) == 1
    assert not grammar_allows(vocab_model, TAGLESS_GRAMMAR, f"{CALL_OPEN}\n{READ}")
    assert grammar_allows(vocab_model, TAGLESS_GRAMMAR, "errors.log mentions a timeout.")


def test_an_untagged_model_under_none_keeps_the_cache_and_answers_in_prose() -> None:
    """Qwen2.5-Coder-0.5B writes calls as bare JSON: under "none", with its tools in view, the
    prose grammar still holds it to text, and the turn reuses the conversation."""
    turn2, turn3 = conversation()
    with LocalServer(models.pull("qwen2.5-coder-0.5b-instruct"), model_name="coder", prefix_cache_mb=0) as server:
        before = post(server, messages=turn2, tools=ALL_TOOLS, max_tokens=8, timeout=600)
        forced = post(server, messages=turn3, tools=ALL_TOOLS, tool_choice="none", max_tokens=40, timeout=600)
        header = header_tokens(server)
    assert forced["runner"]["cached_prompt_tokens"] == before["usage"]["prompt_tokens"] - header
    new = forced["usage"]["prompt_tokens"] - before["usage"]["prompt_tokens"]
    assert forced["runner"]["prompt_eval_tokens"] == new + header
    message = forced["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"], message
    assert "{" not in message["content"] and "<" not in message["content"], json.dumps(message)
