"""A small fake chat-completions provider for tests: a real HTTP server on 127.0.0.1 whose
answers come from a Python function.

For replies no real server gives on demand: an outage that lasts until the test ends it,
usage left out, protocol slips, error objects inside a 200 body or a stream, a context
overflow, a server that answers 500 to any history holding invalid tool-call arguments, a
stream cut off at any byte (`Answer.events` with `cut`). Everything goes over
loopback HTTP through runner's real client; nothing in runner is patched.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from runner.scripted import reply_for


@dataclass
class Answer:
    """One HTTP answer: status, body (a dict is sent as JSON, a str as it is), headers.

    With `events`, the answer is a server-sent event stream instead: one ``data: <event>``
    line per event (a dict is sent as JSON, a str as it is, e.g. "[DONE]"). `cut` sends only
    the stream's first `cut` bytes and closes the connection; with `declared` the full
    length was announced first (the client sees a broken transfer), without it the stream
    simply ends there.
    """

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    events: list[Any] | None = None
    cut: int | None = None
    declared: bool = False

    def stream_bytes(self) -> bytes:
        """The whole event stream, before any cut."""
        return b"".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode()
                        for e in self.events or [])


def stream(message: dict[str, Any], *, finish: str | None = None, done: bool = True,
           usage: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> list[Any]:
    """The chunk events a streaming server sends for `message`: a role chunk, the content
    in pieces of 6 characters, per tool call an opening chunk and an arguments chunk, the
    finish chunk (finish_reason as in `completion`), a usage chunk, then "[DONE]".

    Args:
        finish: None picks "tool_calls" or "stop"; "" sends no finish chunk at all.
        usage: the usage chunk's usage (default: 100 prompt + 10 completion tokens).
        extra: merged into the last chunk (e.g. {"runner": {"dropped_call": True}}).
    """
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": "fake"}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        return base | {"choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}

    events: list[Any] = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content") or ""
    events += [chunk({"content": text[i:i + 6]}) for i in range(0, len(text), 6)]
    for i, call in enumerate(message.get("tool_calls") or []):
        events.append(chunk({"tool_calls": [{"index": i, "id": call.get("id"), "type": "function",
                                             "function": {"name": call["function"]["name"], "arguments": ""}}]}))
        events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]}))
    reason = ("tool_calls" if message.get("tool_calls") else "stop") if finish is None else finish
    if reason:
        events.append(chunk({}, reason))
    events.append(base | {"choices": [], "usage": usage or {"prompt_tokens": 100, "completion_tokens": 10,
                                                              "total_tokens": 110}})
    if extra:
        events[-1] = events[-1] | extra
    if done:
        events.append("[DONE]")
    return events


Handler = Callable[[dict[str, Any]], Answer]


def completion(message: dict[str, Any], *, finish: str | None = None,
               usage: dict[str, Any] | str | None = "fixed") -> Answer:
    """A 200 chat completion holding `message`.

    Args:
        finish: finish_reason (default: "tool_calls" if the message has calls, else "stop").
        usage: "fixed" = 100 prompt + 10 completion tokens; "absent" = no usage key; else the
            value sent as `usage` (None sends null).
    """
    body: dict[str, Any] = {
        "id": "chatcmpl-fake", "object": "chat.completion", "model": "fake",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": finish or ("tool_calls" if message.get("tool_calls") else "stop")}],
    }
    if usage == "fixed":
        body["usage"] = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
    elif usage != "absent":
        body["usage"] = usage
    return Answer(200, body)


def error(status: int, message: str, kind: str = "server_error", retry_after: str | None = "0",
          **extra: Any) -> Answer:
    """An OpenAI-shaped error answer; `Retry-After: 0` keeps the client's back-off out of tests."""
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return Answer(status, {"error": {"message": message, "type": kind, **extra}}, headers)


def scripted(scenario: str, usage: dict[str, Any] | str | None = "fixed") -> Handler:
    """A handler answering like the scripted provider's `scenario` (same replies)."""
    return lambda body: completion(reply_for(scenario, body["messages"]), usage=usage)


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def transcript_problems(messages: list[dict[str, Any]]) -> list[str]:
    """What an OpenAI-compatible server would reject in `messages`: a tool call left without
    a result before the next non-tool message, a tool result for no open call, arguments that
    are not a JSON object, a control token in user or tool text."""
    problems: list[str] = []
    open_ids: set[str] = set()
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            if m.get("tool_call_id") not in open_ids:
                problems.append(f"message {i}: tool result for no open call {m.get('tool_call_id')!r}")
            open_ids.discard(m.get("tool_call_id"))
            continue
        if open_ids:
            problems.append(f"message {i}: calls {sorted(open_ids)} have no result")
            open_ids = set()
        for call in m.get("tool_calls") or []:
            open_ids.add(call["id"])
            try:
                ok = isinstance(json.loads(call["function"]["arguments"]), dict)
            except (ValueError, TypeError):
                ok = False
            if not ok:
                problems.append(f"message {i}: invalid arguments {call['function']['arguments']!r}")
        if role in ("user", "tool") and any(t in str(m.get("content")) for t in ("<|im_end|>", "<|im_start|>")):
            problems.append(f"message {i}: a control token in {role} text")
    return problems


class FakeProvider:
    """`POST /v1/chat/completions` answered by `handler(body)`; every body is kept in `requests`.

    Use as a context manager; `base_url` is "http://127.0.0.1:<port>/v1". `handler` may be
    replaced while the server runs (an outage, then recovery).
    """

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str] = []
        """The Authorization header of each request, in order."""
        self._lock = threading.Lock()
        fake = self

        class _Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw)
                with fake._lock:
                    fake.requests.append(body)
                    fake.auth.append(self.headers.get("Authorization") or "")
                    answer = fake.handler(body)
                if answer.events is not None:
                    self._stream(answer)
                    return
                data = answer.body if isinstance(answer.body, str) else json.dumps(answer.body)
                payload = data.encode()
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(payload)))
                for key, value in answer.headers.items():
                    if key != "Content-Type":
                        self.send_header(key, value)
                self.end_headers()
                self.wfile.write(payload)

            def _stream(self, answer: Answer) -> None:
                payload = answer.stream_bytes()
                self.send_response(answer.status)
                self.send_header("Content-Type", "text/event-stream")
                if answer.declared:
                    self.send_header("Content-Length", str(len(payload)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(payload if answer.cut is None else payload[:answer.cut])
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
