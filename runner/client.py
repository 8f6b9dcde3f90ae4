"""The chat-completions client: the base URL is the only seam between providers.

Talks to any OpenAI-compatible `POST {base_url}/chat/completions` with httpx, and triages
what comes back (`classify`):

- transient (429, 5xx, timeouts, unreachable, unreadable bodies, a reply without a
  `finish_reason` such as a stream cut short, an error object in a 200 body or in a stream
  that says so): retried with exponential back-off that honours `Retry-After`; when
  the retries run out the error is `unavailable` (the loop makes that resumable);
- deterministic (401/403 `auth`, 404 `not_found`, other 4xx `invalid_request`, a context
  overflow in any status, a 500 that only ever repeats, such as "Failed to parse tool call
  arguments"): raised at once, never retried.

It normalises what real servers get wrong in both directions: on the way out, tool-call
arguments that are not a JSON object are sent as "{}" and chat control tokens in user and
tool text are neutralised (`_request_messages`); on the way in, ids and argument strings are
repaired with the originals recorded (`_parse_message`), and missing usage is counted with
the tokenizer and marked estimated. Ids the provider left out are derived from the request
(`call_ids`), so the same conversation always gets the same ids.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

if TYPE_CHECKING:
    import httpx

from runner import inprocess
from runner.errors import ErrorKind, ProviderError
from runner.state import EngineTimings, FunctionCall, Message, TokenLogprob, ToolCall
from runner.streaming import StreamedError, StreamError, StreamProgress, read_sse

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})

RetryCallback = Callable[[int, int, str, float], None]
"""`on_retry(attempt, max_retries, error, wait_s)`: called before each back-off, attempt 1-based."""

_CONTEXT_OVERFLOW = re.compile(
    r"context[_ ]length[_ ]exceeded|exceed_context_size|maximum context length|context window"
    r"|exceeds? (?:the )?(?:available )?context|context size (?:has been |was )?exceeded"
    r"|too many tokens|prompt is too long",
    re.IGNORECASE,
)
# 5xx texts a server repeats for the same request whatever the retry (llama.cpp's server).
_DETERMINISTIC_5XX = re.compile(r"failed to parse tool call|parse tool call arguments", re.IGNORECASE)
_AUTH_TYPES = re.compile(r"auth|api[_ ]?key|permission", re.IGNORECASE)
SECRET_MIN_CHARS = 8
"""A key this long or longer is hidden where a provider's error echoes it; a shorter one
(`bad`, `x`) guards nothing, and hiding it would garble the words that contain it."""

CONTROL_TOKEN = re.compile(r"<\|([A-Za-z0-9_.\-]{1,40})\|>")
"""Text shaped like a chat control token: <|im_start|>, <|im_end|>, <|endoftext|>, <|eot_id|>..."""


def neutralise(text: str) -> tuple[str, int]:
    """`text` with every control-token look-alike defused by backslashes (`<|im_end|>` becomes
    `<\\|im_end\\|>`, which no template or tokenizer reads as the real token), and the count."""
    return CONTROL_TOKEN.subn(r"<\\|\1\\|>", text)


def classify(status: int | None, message: str, error_type: str = "") -> tuple[ErrorKind, bool]:
    """Triage one failed attempt: (kind, retryable).

    Args:
        status: the HTTP status (or the `code` of an error object in a 200 body); None if unknown.
        message: the provider's message. error_type: its `type`/`code` string, if any.
    """
    text = f"{error_type} {message}"
    if "context_length_exceeded" in error_type.split() or status == 413:
        return "context_overflow", False
    if _CONTEXT_OVERFLOW.search(text):  # servers that send no code (say so in words)
        return "context_overflow", False
    if status in (401, 403):
        return "auth", False
    if status == 404:
        return "not_found", False
    if status is not None and 500 <= status < 600 and _DETERMINISTIC_5XX.search(text):
        return "invalid_request", False
    if status is None:  # an error object in a 200 body without a numeric code: read its type
        if _AUTH_TYPES.search(error_type):
            return "auth", False
        if "invalid_request" in error_type:
            return "invalid_request", False
        return "unavailable", True
    if status in RETRYABLE_STATUS or status >= 500:
        return "unavailable", True
    return "invalid_request", False


SlipKind = Literal["empty_tool_calls", "blank_content", "unparsed_tool_call", "dropped_call"]


@dataclass
class ChatReply:
    """One successful completion.

    Attributes:
        message: the assistant message, normalised (string arguments, unique non-empty ids).
        prompt_tokens / completion_tokens: the provider's reported usage, tokens; counted with
            tiktoken o200k_base over `runner.tokens`' rendering when the provider sent none.
        provider_ms: wall time inside HTTP, back-off included, ms.
        retries: one entry per failed attempt: {"error": str, "status": int | None, "waitMs": float}.
        usage_estimated: True when some usage was counted here, not reported by the provider.
        rewrites: what was changed in the provider's message, with the originals:
            {"callId", "field": "id" | "arguments", "original", "sent"} each.
        neutralised: control-token look-alikes defused in the request's user and tool text.
        dropped_call: the server says it dropped a call it could not finish or parse (runner's
            local server reports it as ``runner.dropped_call``).
        engine: the local engine's account of the reply (prompt tokens reused and evaluated,
            prompt and generation ms, drafted tokens), when the server gave one (`engine_timings`).
    """

    message: Message
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    provider_ms: float
    retries: list[dict[str, Any]] = field(default_factory=list)
    usage_estimated: bool = False
    rewrites: list[dict[str, Any]] = field(default_factory=list)
    neutralised: int = 0
    dropped_call: bool = False
    engine: EngineTimings | None = None

    @property
    def slip(self) -> SlipKind | None:
        """A protocol slip: a reply that is neither an answer nor a usable call.

        empty_tool_calls: finish_reason "tool_calls" with no calls; dropped_call: no calls, and
        the server says it dropped one (cut off by max_tokens, or unparseable), so any prose is
        only the lead-in to a call; unparsed_tool_call: no calls but a `<tool_call>` block in
        the text (the server could not parse it); blank_content: no calls and no visible text.
        """
        if self.message.tool_calls:
            return None
        content = self.message.content or ""
        if self.dropped_call:
            return "dropped_call"
        if self.finish_reason == "tool_calls":
            return "empty_tool_calls"
        if "<tool_call>" in content:
            return "unparsed_tool_call"
        if not content.strip():
            return "blank_content"
        return None


def new_http_client(base_url: str = "") -> httpx.AsyncClient:
    """The `httpx.AsyncClient` runner sends with; pass one to `ChatClient(http=...)` (or
    `runner.harness.execute(http=...)`) to share its kept-alive connections between runs.
    `base_url`'s scheme decides TLS: plain http skips building the default SSL context (~20 ms).
    A client for an in-process scripted provider's URL, or for any URL (`base_url` ""),
    reaches in-process providers too (`runner.inprocess`, e.g. `runner.scripted.InProcessProvider`).
    A client for an in-process URL alone has no network transport at all: it never loads
    httpcore, its HTTP/1.1 and HTTP/2 stacks or anyio (~25 ms of a cold `runner run --scenario`)."""
    import httpx

    if base_url and inprocess.is_in_process(base_url):
        return httpx.AsyncClient(transport=inprocess.transport(), trust_env=False)
    mounts: dict[str, httpx.AsyncBaseTransport | None] = {}
    if not base_url:
        mounts[inprocess.HOSTS] = inprocess.transport()
    return httpx.AsyncClient(verify=not base_url.startswith("http://"), mounts=mounts or None)


class ChatClient:
    """An async client for one base URL.

    Args:
        base_url: e.g. "http://127.0.0.1:8080/v1".
        timeout_s: per-attempt timeout, seconds.
        max_retries: extra attempts after the first for retryable failures.
        backoff_s: first back-off delay, doubled per attempt, capped at 8 s.
        http: an `httpx.AsyncClient` to send through, shared with other runs and left open
            (a process driving many runs keeps its connections alive: creating a client and
            connecting costs 0.24-0.48 ms per turn of a 3-turn run, `scripts/bench_overhead.py`);
            None: a client of this run's own, closed with it.
        key_missing: why the run's key is not at hand (the variable it names is not set):
            every `chat` then raises ProviderError "unavailable" with no request sent.
    """

    def __init__(
        self, base_url: str, *, timeout_s: float = 600.0, max_retries: int = 4,
        backoff_s: float = 0.5, api_key: str | None = "sk-local", http: httpx.AsyncClient | None = None,
        on_retry: RetryCallback | None = None, key_missing: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        import httpx  # here, not at the top: `from runner import run` stays ~100 ms lighter

        self._owned = http is None
        self._http = http or new_http_client(self.base_url)
        self._timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._secret = (re.compile(rf"(?<![A-Za-z0-9]){re.escape(api_key)}(?![A-Za-z0-9])")
                        if api_key and len(api_key) >= SECRET_MIN_CHARS and api_key != "sk-local" else None)
        """The key, as a whole word (not inside a longer run of letters and digits)."""
        self.on_retry = on_retry
        self.key_missing = key_missing

    async def aclose(self) -> None:
        if self._owned:
            await self._http.aclose()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def chat(
        self, model: str, messages: list[Message], tools: list[dict[str, Any]] | None = None,
        *, max_tokens: int | None = None, extra: dict[str, Any] | None = None,
        on_delta: Callable[[StreamProgress], None] | None = None, call_ids: str | None = None,
    ) -> ChatReply:
        """Ask for one completion, retrying transient failures.

        With `on_delta`, the reply is requested streamed (usage included) and `on_delta` is
        called after every chunk; a provider that answers with plain JSON works the same.
        A reply without a `finish_reason` (a stream cut short) is a transient failure, never
        a reply.

        Args:
            call_ids: the stem of ids given to calls the provider sent without one (or with an
                empty or repeated one): `{call_ids}_{index}`. None: a stem derived from the
                request, so ids stay a function of the conversation.

        Raises:
            ProviderError: a deterministic failure at once (kind auth, not_found,
                invalid_request, context_overflow), or kind "unavailable" once the retries
                are spent; `retries` says how many were made.
        """
        if self.key_missing:  # nothing is sent without the key the run names: not a verdict on the run
            raise ProviderError(f"no request sent: {self.key_missing}", retryable=False, kind="unavailable")
        body, neutralised = _request_body(model, messages, tools, max_tokens, extra, streamed=on_delta is not None)
        if call_ids is None:
            import hashlib

            call_ids = "call_" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:8]
        stem = call_ids
        retries: list[dict[str, Any]] = []
        started = time.perf_counter()
        for attempt in range(self.max_retries + 1):
            try:
                reply = _reply(await self._post(body, on_delta), body, stem)
            except ProviderError as exc:
                if self._secret is not None:  # a provider may echo the key: it never leaves this object
                    exc.args = (self._secret.sub("[api key]", str(exc)),)
                exc.retries = attempt
                if not exc.retryable or attempt == self.max_retries:
                    exc.retryable = False
                    raise
                wait_s = exc.retry_after_s if exc.retry_after_s is not None else min(self.backoff_s * 2**attempt, 8.0)
                retries.append({"error": str(exc), "status": exc.status, "waitMs": round(wait_s * 1000)})
                if self.on_retry is not None:
                    self.on_retry(attempt + 1, self.max_retries, str(exc), wait_s)
                import asyncio  # here: `from runner import run` need not load it

                await asyncio.sleep(wait_s)
                continue
            reply.provider_ms = (time.perf_counter() - started) * 1000
            reply.retries, reply.neutralised = retries, neutralised
            return reply
        raise AssertionError("unreachable")

    async def _post(self, body: dict[str, Any],
                    on_delta: Callable[[StreamProgress], None] | None = None) -> dict[str, Any]:
        import httpx

        try:
            if on_delta is None:
                response = await self._http.post(self.base_url + "/chat/completions", json=body,
                                                 headers=self._headers, timeout=self._timeout)
            else:  # read a streamed reply as it comes
                async with self._http.stream("POST", self.base_url + "/chat/completions", json=body,
                                             headers=self._headers, timeout=self._timeout) as response:
                    if response.status_code < 400 and "text/event-stream" in response.headers.get("content-type", ""):
                        return await _read_stream(response, on_delta)
                    await response.aread()
        except httpx.TimeoutException:
            raise ProviderError("the provider timed out", retryable=True) from None
        except httpx.TransportError as exc:
            raise ProviderError(f"cannot reach {self.base_url}: {exc}", retryable=True) from None
        if response.status_code >= 400:
            err = _error_from(response.status_code, _error_object(response))
            if response.status_code == 404 and not self.base_url.rstrip("/").endswith("/v1"):
                err.args = (f"{err}; the base URL usually ends in /v1 (did you mean {self.base_url}/v1?)",)
            elif response.status_code in (405, 501):  # no POST here (a plain web server): not a chat API
                err.kind, err.retryable = "bad_endpoint", False
                if "OpenAI-compatible" not in str(err):  # an HTML page says so already
                    err.args = (f"{err}; {self.base_url}/chat/completions does not take POST: is "
                                f"{self.base_url} an OpenAI-compatible endpoint? The base URL usually ends in /v1",)
            retry_after = response.headers.get("retry-after")
            if retry_after is not None:
                try:
                    err.retry_after_s = max(0.0, float(retry_after))
                except ValueError:
                    pass
            raise err
        try:
            data = response.json()
        except ValueError:
            if response.content.lstrip()[:1] not in (b"{", b"["):  # not a cut JSON reply: not an API at all
                raise ProviderError(f"HTTP {response.status_code} with {_not_an_api(response)}",
                                    status=response.status_code, kind="bad_endpoint") from None
            raise ProviderError(
                f"the provider answered with unreadable JSON ({len(response.content)} bytes)",
                status=response.status_code, retryable=True,
            ) from None
        if not isinstance(data, dict):
            raise ProviderError("the provider answered with a non-object body", retryable=True)
        if data.get("error") and not data.get("choices"):
            # An error object in a 200 body (proxies and routers do this): the code inside wins.
            raise _embedded_error(data["error"], "a 200 body")
        return data


async def _read_stream(response: httpx.Response, on_delta: Callable[[StreamProgress], None]) -> dict[str, Any]:
    """The streamed reply assembled (`read_sse`); a stream cut short, broken or unreadable is
    a transient ProviderError, and an error chunk is that error, triaged as in a plain body.
    A timeout is left to the caller (reported as one)."""
    import httpx

    try:
        return await read_sse(response.aiter_lines(), on_delta)
    except StreamError as exc:
        raise ProviderError(f"incomplete stream: {exc}", retryable=True) from None
    except StreamedError as exc:
        raise _embedded_error(exc.error, "a stream") from None
    except httpx.TimeoutException:
        raise
    except httpx.TransportError as exc:
        raise ProviderError(f"the stream broke off: {exc or type(exc).__name__}", retryable=True) from None


def _embedded_error(value: Any, where: str) -> ProviderError:
    """The ProviderError for an error object sent where a reply was expected (`where`: "a 200
    body", "a stream"); its numeric `code` (or `status`) is read as the HTTP status."""
    error = value if isinstance(value, dict) else {"message": str(value)}
    code = error.get("code") if isinstance(error.get("code"), int) else error.get("status")
    return _error_from(code if isinstance(code, int) else None, error, where=where)



def _request_body(model: str, messages: list[Message], tools: list[dict[str, Any]] | None, max_tokens: int | None,
                  extra: dict[str, Any] | None, *, streamed: bool) -> tuple[dict[str, Any], int]:
    """The chat-completions request (greedy: temperature 0, seed 0), and how many
    control-token look-alikes were defused in its messages."""
    sent, neutralised = _request_messages(messages)
    body: dict[str, Any] = {"model": model, "messages": sent, "temperature": 0, "seed": 0}
    if tools:
        body["tools"] = tools
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    body.update(extra or {})
    if streamed:  # stream when someone watches
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body, neutralised

def _error_object(response: httpx.Response) -> dict[str, Any]:
    """The provider's error object in the OpenAI shape if it sent one, else {"message": the
    body in one line}. An HTML page (a web server or proxy, not an API) becomes its title and
    a hint."""
    try:
        data = response.json()
    except ValueError:
        return {"message": _body_text(response)}
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        if not err.get("message") and err.get("detail"):
            err = {**err, "message": err["detail"]}
        return err
    return {"message": str(err)}


def _not_an_api(response: httpx.Response) -> str:
    """A 200 body that is not JSON, described with a hint (an HTML page: its title)."""
    text = _body_text(response)
    if text.startswith("an HTML page"):
        return text
    return (f"a body that is not JSON ({text[:80]!r}): is {response.request.url.host} an OpenAI-compatible "
            "endpoint? The base URL usually ends in /v1")


def _body_text(response: httpx.Response) -> str:
    text = response.text
    if "html" in response.headers.get("content-type", "") or text.lstrip()[:1] == "<":
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.I | re.S)
        label = " ".join(title.group(1).split()) if title else response.reason_phrase
        return (f"an HTML page ({label!r}), not an API reply: is {response.request.url.host}"
                f" an OpenAI-compatible endpoint? The base URL usually ends in /v1")
    return " ".join(text.split())[:300] or response.reason_phrase


def _error_from(status: int | None, error: dict[str, Any], where: str | None = None) -> ProviderError:
    """A ProviderError for one failed attempt, triaged by `classify`, with the provider's numbers.

    Args:
        status: the HTTP status, or the error object's numeric code when it came in a 200 body.
        error: the provider's error object ({"message", "type", "code", ...}).
        where: for an error object inside a reply, where it came ("a 200 body", "a stream").
    """
    message = str(error.get("message") or error)
    error_type = " ".join(str(error[k]) for k in ("type", "code") if isinstance(error.get(k), str))
    kind, retryable = classify(status, message, error_type)
    details = {k: v for k, v in error.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("code", "status")}
    if where:
        label = f"error in {where}" + (f" (code {status})" if status is not None else "")
    else:
        label = f"HTTP {status}"
    return ProviderError(f"{label}: {message}", status=status, retryable=retryable, kind=kind,
                         details=details or None)


def _request_messages(messages: list[Message]) -> tuple[list[dict[str, Any]], int]:
    """Messages as sent, and the number of control-token look-alikes neutralised.

    - assistant `content: null` becomes "" (llama-cpp-python 0.3.x answers HTTP 500 otherwise);
    - tool-call arguments that are not a JSON object are sent as "{}" (llama.cpp's server
      answers every later request 500 otherwise); the state keeps the model's own string and
      the tool result tells the model what was wrong;
    - `<|...|>` look-alikes in user and tool text are defused (`neutralise`).
    """
    out = []
    count = 0
    for m in messages:
        d = m.to_api()
        if m.role == "assistant" and d.get("content") is None:
            d["content"] = ""
        for call in d.get("tool_calls") or []:
            if not _is_json_object(call["function"].get("arguments", "")):
                call["function"]["arguments"] = "{}"
        if m.role in ("user", "tool") and isinstance(d.get("content"), str):
            d["content"], n = neutralise(d["content"])
            count += n
        out.append(d)
    return out, count


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _reply(data: dict[str, Any], body: dict[str, Any], call_ids: str) -> ChatReply:
    """A ChatReply from a 200 body; usage the provider did not report is counted here.

    Raises:
        ProviderError (retryable): the body has no usable choice, or no finish_reason.
    """
    message, finish, rewrites = _parse_choice(data, call_ids)
    usage: dict[str, Any] = data["usage"] if isinstance(data.get("usage"), dict) else {}
    prompt_tokens = _int(usage.get("prompt_tokens"))
    completion_tokens = _int(usage.get("completion_tokens"))
    estimated = False
    if prompt_tokens <= 0 or (completion_tokens <= 0 and (message.content or message.tool_calls)):
        from runner import tokens  # loaded only when a provider leaves usage out

        estimated = True
        if prompt_tokens <= 0:
            prompt_tokens = tokens.count(tokens.render_request(body["messages"], body.get("tools")))
        if completion_tokens <= 0:
            completion_tokens = tokens.count(tokens.render_reply(message.to_api()))
    extra = data.get("runner")
    dropped = isinstance(extra, dict) and extra.get("dropped_call") is True
    return ChatReply(message=message, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     finish_reason=finish, provider_ms=0.0, usage_estimated=estimated, rewrites=rewrites,
                     dropped_call=dropped, engine=engine_timings(data))


def engine_timings(data: dict[str, Any]) -> EngineTimings | None:
    """The engine's account of a reply from its body (or its stream's last chunks): runner's
    server sends it as ``runner`` (``cached_prompt_tokens``, ``prompt_eval_tokens``,
    ``prompt_eval_ms``, ``eval_ms``, ``draft_accepted``, ``draft_proposed``), llama.cpp's own
    server as ``timings`` (``cache_n``, ``prompt_n``, ``prompt_ms``, ``predicted_ms``,
    ``draft_n_accepted``, ``draft_n``). None when neither is there, or a number is missing."""
    ours, theirs = data.get("runner"), data.get("timings")
    if isinstance(ours, dict) and "prompt_eval_tokens" in ours:
        keys = ("cached_prompt_tokens", "prompt_eval_tokens", "prompt_eval_ms", "eval_ms", "draft_accepted",
                "draft_proposed")
        source = ours
    elif isinstance(theirs, dict) and "prompt_n" in theirs:
        keys = ("cache_n", "prompt_n", "prompt_ms", "predicted_ms", "draft_n_accepted", "draft_n")
        source = theirs
    else:
        return None
    values = [source.get(k) for k in keys]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values[:4]):
        return None
    drafted = [int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in values[4:]]
    return EngineTimings(prompt_reused=int(values[0] or 0), prompt_evaluated=int(values[1] or 0),
                         prompt_ms=float(values[2] or 0), gen_ms=float(values[3] or 0),
                         draft_accepted=drafted[0], draft_proposed=drafted[1])


def _int(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _parse_choice(data: dict[str, Any], call_ids: str) -> tuple[Message, str, list[dict[str, Any]]]:
    """The first choice's message, normalised, with its finish_reason and the rewrites made.

    Raises:
        ProviderError (retryable): the body has no usable choice, or the choice has no
            finish_reason (the reply is incomplete, whatever it holds).
    """
    try:
        choice = data["choices"][0]
        raw = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise ProviderError("the provider's reply has no choices[0].message", retryable=True) from None
    if not isinstance(raw, dict):
        raise ProviderError("the provider's choices[0].message is not an object", retryable=True)
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    if not finish or not isinstance(finish, str):
        raise ProviderError("the provider's reply has no finish_reason: it is incomplete", retryable=True)
    message, rewrites = _parse_message(raw, call_ids)
    message.logprobs = _token_logprobs(choice.get("logprobs"))
    return message, finish, rewrites


def _token_logprobs(raw: Any) -> list[TokenLogprob] | None:
    """A choice's ``logprobs.content`` as `TokenLogprob`s; None when it is missing or any
    entry is malformed (a provider's log probabilities are a hint, never a failure)."""
    content = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(content, list) or not content:
        return None
    from pydantic import ValidationError

    try:
        return [TokenLogprob.model_validate(entry) for entry in content]
    except ValidationError:
        return None


def _parse_message(raw: dict[str, Any], call_ids: str) -> tuple[Message, list[dict[str, Any]]]:
    """Normalise a local server's assistant message; returns it and what was rewritten.

    - `arguments` sent as an object become a JSON string; surrounding whitespace is stripped;
      empty arguments become "{}". A string that is not a JSON object is kept as it is (the
      loop answers the call with an error; `_request_messages` sends "{}" in its place).
    - missing, empty or duplicate call ids become `{call_ids}_{index}` (index: the call's
      position in the message), so they are the same whenever the same reply is read.
    Each change is one rewrite: {"callId", "field", "original", "sent"}.
    """
    calls: list[ToolCall] = []
    rewrites: list[dict[str, Any]] = []
    seen: set[str] = set()
    for raw_call in raw.get("tool_calls") or []:
        if not isinstance(raw_call, dict):
            continue
        fn = raw_call.get("function") or {}
        original = fn.get("arguments")
        args = "{}" if original is None or original == "" else original
        args = (args if isinstance(args, str) else json.dumps(args)).strip()
        raw_id = raw_call.get("id")
        call_id = str(raw_id or "").strip()
        if not call_id or call_id in seen:
            call_id = f"{call_ids}_{len(calls)}"
            while call_id in seen:
                call_id += "x"
            rewrites.append({"callId": call_id, "field": "id", "original": raw_id, "sent": call_id})
        seen.add(call_id)
        if args != original:
            rewrites.append({"callId": call_id, "field": "arguments", "original": original, "sent": args})
        if not _is_json_object(args):
            rewrites.append({"callId": call_id, "field": "arguments", "original": args, "sent": "{}"})
        calls.append(ToolCall(id=call_id, function=FunctionCall(name=str(fn.get("name") or ""), arguments=args)))
    content = raw.get("content")
    return (Message(role="assistant", content=content if isinstance(content, str) else None,
                    tool_calls=calls or None), rewrites)
