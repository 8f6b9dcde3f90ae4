"""The embedded server's HTTP face: an OpenAI-compatible ASGI app over one llama.cpp model.

Routes:

- ``POST /v1/chat/completions``: OpenAI chat completions, streamed (server-sent events, one
  chunk per generated piece, ``data: [DONE]`` at the end, usage in the last chunk when
  ``stream_options.include_usage``) or not. With the ``runner-hermes`` chat format, replies
  come from `runner.engine.Engine` (tool calls under a grammar, ``tool_choice`` honoured);
  the request may add ``grammar_tools``, narrower definitions of some of its tools that the
  calls must match while the prompt shows ``tools`` (its cached prefix kept);
  with any other llama-cpp-python chat format, from ``Llama.create_chat_completion`` (its reply
  in one chunk, not stoppable half-way). A request that does not say ``parallel_tool_calls`` gets
  OpenAI's default, true (`Backend.parallel_default`), and the server's steering
  (`runner.steering.serve`) may choose how the reply is sampled; each reply reports both in its
  ``runner`` object and its ``x-runner-steering`` / ``x-runner-parallel-tool-calls`` headers. Invalid
  requests (a body that fails OpenAI's checks, `runner.openai_request`: a tool without a name, a
  message without a role, a tool message without ``tool_call_id``…; a prompt longer than the
  context) get HTTP 400 with an OpenAI error body naming the field (``param``). When the client goes away (timeout,
  Ctrl-C), generation stops within one token and the next request starts at once.
- ``GET /v1/models``: the one model.
- ``POST /extras/tokenize/count``: ``{"input": str}`` -> ``{"count": tokens}``.
- ``GET /health``: ``{"status": "ok", "pid", "requests", "generating", "cancelled",
  "last_cancelled_tokens"}``
  (answered without waiting for the model).
- ``GET /stats``: ``{"replies": [timings, …]}``, the engine timings of the last
  `RECENT_REPLIES` replies, oldest first (prompt tokens evaluated vs reused, ms).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from runner.chat_adapter import HANDLER_NAME, CallDelta, Event, Finished, JsonObject, RequestError, TextDelta
from runner.engine import ChatRequest, ContextOverflow, Engine
from runner.openai_request import BodyError, ChatBody, parse_body
from runner.steering.serve import Steered, Steering, repeats_only, steer

if TYPE_CHECKING:
    from llama_cpp import Llama
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

CHAT_PATH = "/v1/chat/completions"
RECENT_REPLIES = 200
T = TypeVar("T")


@dataclass
class Stats:
    """Counters for /health (chat requests, generations stopped by a client leaving) and the
    engine timings of the most recent replies for /stats (`Engine.stream`'s ``timings``)."""

    requests: int = 0
    generating: int = 0
    """Replies started and not finished (one generates at a time; others wait)."""
    cancelled: int = 0
    last_cancelled_tokens: int | None = None
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT_REPLIES))


@dataclass
class Sampling:
    """How one request's reply is sampled, as the server decided; what it says is reported in
    the response (`report`: the ``runner`` object, the headers) and the request log.

    Attributes:
        request: what the engine gets (parallel_tool_calls and tool_choice as applied).
        steered: what the server's steering made of the request (`runner.steering.serve.steer`).
        given: the policy that chose how the reply was sampled, "none", or "off" when the
            server does not steer.
    """

    request: ChatRequest
    steered: Steered
    given: str

    def report(self) -> JsonObject:
        return {"parallel_tool_calls": self.request.parallel_tool_calls, "tool_choice": self.request.tool_choice,
                "steering": self.given}

    def headers(self) -> dict[str, str]:
        return {STEERING_HEADER: self.given,
                PARALLEL_HEADER: "true" if self.request.parallel_tool_calls else "false"}


def _as_steered(request: ChatRequest, tool_choice: Any) -> None:
    """Steering chose `tool_choice` for `request`; an answer it asks for ("none") is sampled
    with the tools left out of the prompt (see `runner.steering.serve`)."""
    request.tool_choice = tool_choice
    if tool_choice == "none":
        request.none_keeps_tools = False


class Backend:
    """One model, one generation at a time, stoppable: `prepare` a request, then its `events`.

    Args:
        llama: the loaded model.
        chat_format: ``runner-hermes`` (runner's `Engine`) or a llama-cpp-python chat format
            the `llama` was created with.
        default_max_tokens: reply cap when a request sets none, tokens.
        reuse_prefix: keep KV entries of leading messages shared with the previous request.
        jump_forward: evaluate text the call grammar forces as one batch.
        untagged_calls: read a reply that opens with a JSON object as a call (`Engine`).
        parallel_default: ``parallel_tool_calls`` for a request that does not say (`runner serve`:
            True, OpenAI's default).
        steering: the server policies applied to every request (`runner.steering.serve`).
        engine_options: further `Engine` keyword arguments (``check_first``, ``none_keeps_tools``…).
    """

    def __init__(self, llama: Llama, chat_format: str, default_max_tokens: int, reuse_prefix: bool = True,
                 jump_forward: bool = True, untagged_calls: bool = False, parallel_default: bool = True,
                 steering: Steering | None = None, **engine_options: Any) -> None:
        self.llama = llama
        self.chat_format = chat_format
        self.parallel_default = parallel_default
        self.steering = steering if steering is not None else Steering()
        self.engine = (Engine(llama, default_max_tokens, reuse_prefix, jump_forward, untagged_calls, **engine_options)
                       if chat_format == HANDLER_NAME else None)
        self.default_max_tokens = default_max_tokens
        self.stats = Stats()
        self._lock = threading.Lock()

    def prepare(self, body: ChatBody) -> Sampling:
        """How the reply to `body` is sampled, as the server's defaults and steering say."""
        request = body.to_request(self.parallel_default)
        steered = steer(self.steering, request.messages, request.tools, request.tool_choice)
        if steered.fired is not None:
            _as_steered(request, steered.tool_choice)
        return Sampling(request, steered, steered.fired or ("none" if self.steering.policies else "off"))

    def events(self, sampling: Sampling, cancel: threading.Event) -> Iterator[Event]:
        """The reply as `runner.chat_adapter` events (see `Engine.stream`). With answer_on_stall
        watching (`Steered.answered`), a reply of calls only, all already answered, is sampled
        again as an answer before any of it is sent (`sampling` then says so); its `Finished`
        counts the tokens of both generations, which the server spent on this request."""
        if not sampling.steered.answered:
            yield from self._counted(sampling.request, cancel)
            return
        calls: list[Event] = []
        finished: Finished | None = None
        sent_text = False
        for event in self._counted(sampling.request, cancel):  # to its end: the engine's lock is let go
            if isinstance(event, TextDelta):
                sent_text = True
                yield event
            elif isinstance(event, CallDelta):
                calls.append(event)
            else:
                finished = event
        if not sent_text and not cancel.is_set() and \
                repeats_only(sampling.steered, [c.call for c in calls if isinstance(c, CallDelta)]):
            _as_steered(sampling.request, "none")
            sampling.given = "answer_on_stall"
            for event in self._counted(sampling.request, cancel):
                yield _plus(event, finished) if isinstance(event, Finished) and finished is not None else event
            return
        yield from calls
        if finished is not None:
            yield finished

    def _counted(self, request: ChatRequest, cancel: threading.Event) -> Iterator[Event]:
        """One generation's events; a generation stopped by `cancel` is counted in `stats`, and
        each finished one's timings are kept there with its finish reason and what it held
        (``reply``: "calls", "text" or "empty")."""
        inner = self.engine.stream(request, cancel) if self.engine is not None else self._stock(request, cancel)
        self.stats.generating += 1
        finished = False
        held = "empty"
        try:
            for event in inner:
                if isinstance(event, CallDelta):
                    held = "calls"
                elif isinstance(event, TextDelta) and event.text.strip() and held == "empty":
                    held = "text"
                if isinstance(event, Finished):
                    finished = True
                    self.stats.generating -= 1
                    self.stats.recent.append(event.timings | {"finish_reason": event.finish_reason, "reply": held})
                    if event.finish_reason == "cancelled":
                        self.stats.cancelled += 1
                        self.stats.last_cancelled_tokens = event.completion_tokens
                yield event
        finally:
            if not finished:
                self.stats.generating -= 1

    def _stock(self, request: ChatRequest, cancel: threading.Event) -> Iterator[Event]:
        """Another chat format: llama-cpp-python renders, generates and parses, in one call. Its
        usage is real; the reply comes as one chunk and cannot be stopped half-way."""

        with self._lock:
            if cancel.is_set():
                yield Finished("cancelled", 0, 0, {})
                return
            began = time.perf_counter()
            reply: Any = self.llama.create_chat_completion(
                messages=request.messages,  # type: ignore[arg-type]
                tools=request.tools or None,  # type: ignore[arg-type]
                tool_choice=request.tool_choice, temperature=0.0, stop=request.stop or None,
                max_tokens=request.max_tokens or self.default_max_tokens,
            )
            choice, usage = reply["choices"][0], reply["usage"]
            if choice["message"].get("content"):
                yield TextDelta(choice["message"]["content"])
            for i, call in enumerate(choice["message"].get("tool_calls") or []):
                yield CallDelta(i, {k: call[k] for k in ("id", "type", "function")})
            yield Finished(choice.get("finish_reason") or "stop", usage["prompt_tokens"], usage["completion_tokens"],
                           {"handler_ms": round((time.perf_counter() - began) * 1000, 3)})


def build_app(backend: Backend, model_name: str) -> Callable[..., Any]:
    """The ASGI app over `backend` (see the module docstring for the routes), logging each
    request (`_logged`)."""
    import os

    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def health(request: Request) -> Response:
        # The pid lets LocalServer tell its own process from a stranger that got the port first.
        stats = backend.stats
        return JSONResponse({"status": "ok", "pid": os.getpid(), "requests": stats.requests,
                             "generating": stats.generating, "cancelled": stats.cancelled,
                             "last_cancelled_tokens": stats.last_cancelled_tokens})

    async def stats(request: Request) -> Response:
        store = backend.engine.prefix_store if backend.engine is not None else None
        return JSONResponse({"replies": list(backend.stats.recent),
                             "prefix_cache": store.usage() if store is not None else None})

    async def list_models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": 0, "owned_by": "runner"}]})

    async def count_tokens(request: Request) -> Response:
        body = await _json_body(request)
        if not isinstance(body, dict):
            return body
        text = str(body.get("input", ""))
        return JSONResponse({"count": len(backend.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))})

    async def chat(request: Request) -> Response:
        return await _chat(request, backend, model_name)

    app = Starlette(routes=[
        Route(CHAT_PATH, chat, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/extras/tokenize/count", count_tokens, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
    ], exception_handlers={404: _not_routed, 405: _not_routed})
    return _logged(app, backend)


async def _not_routed(request: Request, exc: Exception) -> Response:
    """An unknown path or method, as an OpenAI-style error (clients read ``error.message``)."""
    status = getattr(exc, "status_code", 404)
    what = "no such path" if status == 404 else f"{request.method} is not served here"
    response = _error(status, f"{what}: {request.url.path} (the chat API is POST {CHAT_PATH})")
    response.headers.update(getattr(exc, "headers", None) or {})  # a 405's Allow
    return response


REQUEST_LOG_PREFIX = "request: "
"""How each request's log line on stderr begins (`runner serve` shows these lines)."""
STEERING_HEADER = "x-runner-steering"
"""Response header of a chat reply: the server policy that chose its tool_choice
(`runner.steering.serve`), "none", or "off" when the server does not steer."""
PARALLEL_HEADER = "x-runner-parallel-tool-calls"
"""Response header of a chat reply: the parallel_tool_calls it was sampled with, "true" or "false"."""


def _logged(app: Starlette, backend: Backend) -> Callable[..., Any]:
    """`app`, logging one line per request to stderr when its response ends: method, path,
    status, and for a chat reply its prompt/completion tokens, what it held (``reply=calls``,
    ``text`` or ``empty``), the steering and parallel_tool_calls it was given; then ms.
    /health polls are not logged."""
    import sys

    async def logged(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            await app(scope, receive, send)
            return
        began, status, given = time.perf_counter(), [0], [""]
        before = backend.stats.recent[-1] if backend.stats.recent else None

        async def watched(message: MutableMapping[str, Any]) -> None:
            await send(message)
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in message.get("headers", [])}
                if STEERING_HEADER in headers:
                    given[0] = f" steer={headers[STEERING_HEADER]} parallel={headers[PARALLEL_HEADER]}"
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                last = backend.stats.recent[-1] if backend.stats.recent else None
                tokens = (f"  in={last.get('prompt_tokens', 0)} out={last.get('eval_tokens', 0)} "
                          f"reply={last.get('reply')}{given[0]}"
                          if last is not None and last is not before else "")
                print(f"{REQUEST_LOG_PREFIX}{scope['method']} {scope['path']} {status[0]}{tokens}  "
                      f"{(time.perf_counter() - began) * 1000:,.0f} ms", file=sys.stderr, flush=True)

        await app(scope, receive, watched)

    return logged


async def _json_body(request: Request) -> dict[str, Any] | Response:
    try:
        raw = await request.json()
    except ValueError:
        return _error(400, "request body is not valid JSON")
    if not isinstance(raw, dict):
        return _error(400, "request body must be a JSON object")
    return raw


async def _chat(request: Request, backend: Backend, model_name: str) -> Response:
    raw = await _json_body(request)
    if not isinstance(raw, dict):
        return raw
    try:
        body = parse_body(raw)
    except BodyError as exc:
        return _error(400, str(exc), param=exc.param, code=exc.code)
    backend.stats.requests += 1
    cancel = threading.Event()
    sampling = backend.prepare(body)
    events = backend.events(sampling, cancel)
    completion_id, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    try:
        if body.stream:
            # The first event (prompt evaluated, first token out) comes before any header, so a
            # bad request still gets a plain 400.
            first: Event = await _watched(request, cancel, events, lambda: next(events))
        else:
            result: dict[str, Any] = await _watched(
                request, cancel, events, lambda: complete(events, model_name, created, completion_id, sampling.report))
    except ContextOverflow as exc:
        return _error(400, str(exc), code="context_length_exceeded",
                      n_prompt_tokens=exc.n_prompt_tokens, n_ctx=exc.n_ctx)
    except RequestError as exc:
        return _error(400, str(exc))
    from starlette.responses import JSONResponse, StreamingResponse

    if cancel.is_set():
        return _error(499, "the client closed the request")
    # By the first event (streamed) or the whole reply, steering has decided what it gave.
    headers = sampling.headers()
    if not body.stream:
        return JSONResponse(result, headers=headers)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    replies = chunks(_prepend(first, events), model_name, created, completion_id, include_usage, sampling.report)
    return StreamingResponse(_sse(replies, events, cancel), media_type="text/event-stream", headers=headers)


def _prepend(first: Event, rest: Iterator[Event]) -> Iterator[Event]:
    yield first
    yield from rest


async def _watched(request: Request, cancel: threading.Event, events: Iterator[Event],
                   work: Callable[[], T]) -> T:
    """Run `work` in a worker thread while watching the connection; a disconnect sets `cancel`
    (generation stops within one token) and the rest of `events` is drained."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        cancel.set()

    def capture() -> tuple[T | None, Exception | None]:
        try:
            return work(), None
        except Exception as exc:
            return None, exc

    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        try:
            value, error = await anyio.to_thread.run_sync(capture)
        finally:
            group.cancel_scope.cancel()
    if cancel.is_set():
        await anyio.to_thread.run_sync(_drain, events)
    if error is not None:
        raise error
    return value  # type: ignore[return-value]


async def _sse(replies: Iterator[dict[str, Any]], events: Iterator[Event],
               cancel: threading.Event) -> AsyncIterator[str]:
    """Server-sent events, one per chunk, then ``[DONE]``. Starlette cancels this generator when
    the client disconnects; the worker thread finishes its token, then `cancel` stops it."""
    done = object()
    try:
        while (item := await anyio.to_thread.run_sync(next, replies, done)) is not done:
            yield f"data: {json.dumps(item, ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        cancel.set()  # a no-op once the reply is complete
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_drain, events)


def _drain(events: Iterator[Event]) -> None:
    """Consume what is left (the engine stops within a token once cancelled; Backend counts it)."""
    for _ in events:
        pass


def _error(status: int, message: str, param: str | None = None, code: str | None = None,
           **numbers: int) -> Response:
    """An OpenAI-style error body: {"error": {"message", "type", "param", "code", ...numbers}};
    `code` is OpenAI's machine-readable one (``context_length_exceeded``) where there is one."""
    from starlette.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "internal_server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code, **numbers}},
                        status_code=status)


# --- OpenAI response shapes --------------------------------------------------------------


def complete(events: Iterator[Event], model: str, created: int, completion_id: str,
             applied: Callable[[], JsonObject] | None = None) -> JsonObject:
    """Collect `Engine.stream` events into an OpenAI ``chat.completion`` dict.

    The extra ``runner`` object carries the engine's timings and, from `applied` once the reply
    is complete, what the server applied (`Sampling.report`).
    """
    content: list[str] = []
    calls: list[JsonObject] = []
    finished: Finished | None = None
    for event in events:
        if isinstance(event, TextDelta):
            content.append(event.text)
        elif isinstance(event, CallDelta):
            calls.append(event.call)
        else:
            finished = event
    assert finished is not None, "the engine always ends with Finished"
    message: JsonObject = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": completion_id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": _logprobs(finished),
                     "finish_reason": finished.finish_reason}],
        "usage": usage(finished),
        "runner": finished.timings | (applied() if applied else {}),
    }


def _logprobs(finished: Finished) -> JsonObject | None:
    """A choice's OpenAI ``logprobs`` object: None unless the request asked for them."""
    return None if finished.logprobs is None else {"content": finished.logprobs, "refusal": None}


def _plus(finished: Finished, first: Finished) -> Finished:
    """`finished` counting the tokens of the `first` generation of the same request too."""
    cached = finished.timings.get("cached_prompt_tokens", 0) + first.timings.get("cached_prompt_tokens", 0)
    timings = finished.timings | ({"cached_prompt_tokens": cached} if "cached_prompt_tokens" in finished.timings else {})
    return replace(finished, prompt_tokens=finished.prompt_tokens + first.prompt_tokens,
                   completion_tokens=finished.completion_tokens + first.completion_tokens,
                   timings=timings | {"resampled_from_tokens": first.prompt_tokens + first.completion_tokens})


def usage(finished: Finished) -> JsonObject:
    """OpenAI ``usage`` for a finished reply, with OpenAI's ``prompt_tokens_details.cached_tokens``
    (prompt tokens whose KV entries were reused) when the engine reported them."""
    out: JsonObject = {"prompt_tokens": finished.prompt_tokens, "completion_tokens": finished.completion_tokens,
                       "total_tokens": finished.prompt_tokens + finished.completion_tokens}
    if "cached_prompt_tokens" in finished.timings:
        out["prompt_tokens_details"] = {"cached_tokens": finished.timings["cached_prompt_tokens"]}
    return out


def chunks(events: Iterator[Event], model: str, created: int, completion_id: str,
           include_usage: bool, applied: Callable[[], JsonObject] | None = None) -> Iterator[JsonObject]:
    """`Engine.stream` events as OpenAI ``chat.completion.chunk`` dicts, as they come.

    First a role chunk; one chunk per content delta (with its tokens' log probabilities, when
    asked for; the finish chunk carries any left); per tool call, a chunk opening it (id,
    type, name, empty arguments) and one carrying its arguments; a finish chunk; then, when
    `include_usage`, a chunk with ``choices: []`` and the usage. The last chunk carries the
    engine's timings and what the server applied as ``runner``.
    """
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}

    def chunk(delta: JsonObject, finish: str | None = None, scored: list[JsonObject] | None = None) -> JsonObject:
        logprobs = None if scored is None else {"content": scored, "refusal": None}
        return base | {"choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    sent = 0
    for event in events:
        if isinstance(event, TextDelta):
            sent += len(event.logprobs or ())
            yield chunk({"content": event.text}, scored=event.logprobs)
        elif isinstance(event, CallDelta):
            function = event.call["function"]
            yield chunk({"tool_calls": [{"index": event.index, "id": event.call["id"], "type": "function",
                                         "function": {"name": function["name"], "arguments": ""}}]})
            yield chunk({"tool_calls": [{"index": event.index, "function": {"arguments": function["arguments"]}}]})
        else:
            last = chunk({}, event.finish_reason, None if event.logprobs is None else event.logprobs[sent:])
            if include_usage:
                yield last
                last = base | {"choices": [], "usage": usage(event)}
            yield last | {"runner": event.timings | (applied() if applied else {})}
