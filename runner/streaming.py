"""Streamed replies: OpenAI server-sent events assembled into one completion, and the live
per-turn progress the CLI shows while a turn is generated.

`read_sse` turns the ``data:`` lines of a streamed ``chat.completion.chunk`` response into
the dict a non-streamed call would have returned (content joined, tool-call deltas merged by
index, usage from the last chunk), calling back with a `StreamProgress` after every chunk.
A stream is a reply only once a chunk gives its ``finish_reason`` (OpenAI's format ends every
choice with one): one that stops before, with or without ``[DONE]``, is incomplete
(`StreamError`), and an error object sent as a chunk is that error (`StreamedError`).
`TurnMeter` turns those into `TurnProgress` reports: one at the start of a turn, one per
chunk, one at the end, whether or not the provider streams.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any


class StreamError(ValueError):
    """The event stream was not a complete reply: a chunk that is not JSON, no chunk at all, or
    no ``finish_reason`` before the stream ended."""


class StreamedError(Exception):
    """The provider sent an error object as a chunk (``data: {"error": {...}}``).

    Attributes:
        error: the error object as sent ({"message", "type", "code", ...}, or a bare string).
        chunks: content or tool-call chunks received before it.
    """

    def __init__(self, error: Any, chunks: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.chunks = chunks


@dataclass(frozen=True)
class StreamProgress:
    """The reply so far: chunks with content or tool-call deltas, and the content text."""

    chunks: int
    text: str


@dataclass(frozen=True)
class TurnProgress:
    """One report about the turn being generated.

    Attributes:
        turn: 1-based turn number.
        elapsed_ms: since the turn's request started, ms.
        tokens: tokens so far (streamed chunks while running; the provider's count at the end).
        text: the reply's content so far.
        done: the last report of this turn.
    """

    turn: int
    elapsed_ms: float
    tokens: int
    text: str
    done: bool


async def read_sse(lines: AsyncIterator[str], on_delta: Callable[[StreamProgress], None]) -> dict[str, Any]:
    """Assemble a streamed chat completion from its SSE lines.

    Returns:
        {"id", "model", "choices": [{"index": 0, "message": {...}, "finish_reason"}], "usage"}
        in the non-streamed shape; usage is {} when the stream carried none; the choice's
        ``logprobs`` when chunks carried some (their ``content`` entries joined). A server's own
        extra object (llama.cpp's ``timings``, runner's local server's ``runner``) is kept.

    Raises:
        StreamError: a ``data:`` line that is not JSON, a stream with no chunk, or one that
            ended without a ``finish_reason``.
        StreamedError: an error object came as a chunk.
    """
    content: list[str] = []
    logprobs: list[Any] | None = None
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    usage: dict[str, Any] = {}
    head: dict[str, Any] = {}
    chunks = 0
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            raise StreamError(f"a streamed chunk is not JSON: {data[:80]!r}") from None
        if not isinstance(chunk, dict):
            raise StreamError(f"a streamed chunk is not an object: {data[:80]!r}")
        if chunk.get("error") and not chunk.get("choices"):
            raise StreamedError(chunk["error"], chunks)
        head = head or {k: chunk.get(k) for k in ("id", "model", "created")}
        head |= {k: chunk[k] for k in ("runner", "timings") if isinstance(chunk.get(k), dict)}
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for part in delta.get("tool_calls") or []:
                _merge_call(calls.setdefault(int(part.get("index", 0)), {}), part)
            if delta.get("content") or delta.get("tool_calls"):
                chunks += 1
                on_delta(StreamProgress(chunks, "".join(content)))
            finish = choice.get("finish_reason") or finish
            if isinstance(choice.get("logprobs"), dict) and isinstance(choice["logprobs"].get("content"), list):
                logprobs = (logprobs or []) + choice["logprobs"]["content"]
    if not head:
        raise StreamError("the stream carried no chunk")
    if finish is None:
        raise StreamError(f"the stream ended without a finish_reason after {chunks} chunks")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    scored = {} if logprobs is None else {"logprobs": {"content": logprobs}}
    return head | {"choices": [{"index": 0, "message": message, "finish_reason": finish, **scored}], "usage": usage}


def _merge_call(call: dict[str, Any], part: dict[str, Any]) -> None:
    """Fold one tool-call delta into the call being assembled (OpenAI: id, type and name come
    once; arguments arrive in pieces to concatenate)."""
    for key in ("id", "type"):
        if part.get(key):
            call[key] = part[key]
    function = call.setdefault("function", {"name": "", "arguments": ""})
    delta = part.get("function") or {}
    if delta.get("name"):
        function["name"] = delta["name"]
    function["arguments"] += delta.get("arguments") or ""


class TurnMeter:
    """Reports one turn's progress to `report`: at once (0 tokens), per streamed chunk, at the end."""

    def __init__(self, turn: int, report: Callable[[TurnProgress], None]) -> None:
        self.turn = turn
        self.report = report
        self.began = time.perf_counter()
        report(TurnProgress(turn, 0.0, 0, "", False))

    def _ms(self) -> float:
        return (time.perf_counter() - self.began) * 1000

    def update(self, progress: StreamProgress) -> None:
        self.report(TurnProgress(self.turn, self._ms(), progress.chunks, progress.text, False))

    def finish(self, tokens: int, text: str) -> None:
        self.report(TurnProgress(self.turn, self._ms(), tokens, text, True))
