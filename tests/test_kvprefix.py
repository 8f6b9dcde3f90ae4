"""The saved prefix KV state on the real llama.cpp server and the packaged SmolLM2: a cold
server loads the system turn's KV entries saved by an earlier one and answers byte for byte as
a server that evaluates everything, and the folder stays within its bound."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx

from runner import models
from runner.engine import ChatRequest, Engine
from runner.kvprefix import PrefixStore, file_sha256
from runner.local import LocalServer
from runner.local_app import complete
from tests.test_hermes_adapter import TOOLS

SMOL = "smollm2-135m-instruct"
SYSTEM = "You are a careful assistant working on a folder of log files. Use the tools."
FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which log file mentions a timeout?"}]


def _post(server: LocalServer, messages: list[dict[str, Any]]) -> dict[str, Any]:
    reply = httpx.post(f"{server.base_url}/chat/completions", timeout=300,
                       json={"model": "smollm2", "messages": messages, "tools": TOOLS, "max_tokens": 48})
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def _two_turns(server: LocalServer) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The replies of turn 1 and of a turn 2 built on it, and the engine timings of each."""
    one = _post(server, FIRST)
    message = one["choices"][0]["message"]
    second = [*FIRST, {"role": "assistant", "content": message["content"] or "",
                       **({"tool_calls": message["tool_calls"]} if message.get("tool_calls") else {})}]
    second += ([{"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": "errors.log"}
                for c in message.get("tool_calls") or []]
               or [{"role": "user", "content": "Are you sure? Answer in one sentence."}])
    two = _post(server, second)
    return [one["choices"], two["choices"]], [one["runner"], two["runner"]]


def test_a_cold_server_starts_from_the_saved_prefix_and_answers_the_same(tmp_path: Path) -> None:
    gguf = models.resolve(SMOL)
    cache: dict[str, Any] = {"prefix_cache_dir": tmp_path / "kv", "model_name": "smollm2"}
    with LocalServer(gguf, **cache) as first:
        saved_replies, saved_timings = _two_turns(first)
        usage = httpx.get(first.base_url.removesuffix("/v1") + "/stats").json()["prefix_cache"]
    assert saved_timings[0]["prefix_disk_tokens"] == 0 and saved_timings[0]["cached_prompt_tokens"] == 0
    assert usage["saved"] == 1 and usage["files"] == 1 and 0 < usage["bytes"] <= usage["max_bytes"]
    with LocalServer(gguf, **cache) as cold:
        replies, timings = _two_turns(cold)
        usage = httpx.get(cold.base_url.removesuffix("/v1") + "/stats").json()["prefix_cache"]
    prefix = timings[0]["prefix_disk_tokens"]
    assert prefix > 100 and timings[0]["cached_prompt_tokens"] == prefix and usage["hits"] == 1
    assert timings[0]["prompt_eval_tokens"] == timings[0]["prompt_tokens"] - prefix
    assert replies == saved_replies  # byte for byte, turn 1 and turn 2
    with LocalServer(gguf, model_name="smollm2", prefix_cache_mb=0) as plain:
        assert _two_turns(plain)[0] == saved_replies  # and as a server that evaluates everything


def test_the_prefix_folder_stays_within_its_bound(tmp_path: Path) -> None:
    from llama_cpp import Llama

    gguf = models.resolve(SMOL)
    llama = Llama(model_path=str(gguf), n_ctx=2048, n_threads=2, verbose=False)
    store = PrefixStore(tmp_path, file_sha256(gguf, tmp_path), 2048)

    def engine() -> Engine:
        """A cold engine on the loaded model: nothing reused from memory."""
        fresh = Engine(llama)
        fresh.prefix_store = store
        return fresh

    warm = engine()

    def ask(system: str, on: Engine | None = None) -> None:
        request = ChatRequest(messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi."}],
                              tools=TOOLS, max_tokens=1)
        complete((on or warm).stream(request, threading.Event()), "m", 0, "x")

    ask(SYSTEM)
    one = store.usage()["bytes"]
    assert store.usage()["files"] == 1 and one > 0
    store.max_bytes = int(one * 1.5)
    ask(SYSTEM + " Be brief.")  # another prefix: its file replaces the older one
    usage = store.usage()
    assert usage["files"] == 1 and usage["bytes"] <= usage["max_bytes"] and usage["saved"] == 2
    ask(SYSTEM + " Be brief.", engine())  # cold: the newer prefix loads, the older one is gone
    ask(SYSTEM, engine())
    assert (store.hits, store.misses) == (1, 3)
