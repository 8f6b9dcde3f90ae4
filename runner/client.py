"""The chat-completions client: the base URL is the only seam between providers.

Talks to any OpenAI-compatible `POST {base_url}/chat/completions` with httpx. Retries
429, 5xx, timeouts and unreadable bodies with exponential back-off that honours
`Retry-After`; 400/401/403/404 are not retried. Normalises what real servers get wrong in
both directions (see `_request_messages` and `_parse_message`).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from runner.errors import RunnerError
from runner.state import FunctionCall, Message, ToolCall

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class ProviderError(RunnerError):
    """The provider could not give a usable reply.

    Attributes:
        status: HTTP status, or None for transport and decoding errors.
        retryable: whether another attempt could succeed (after all retries: False).
    """

    def __init__(self, message: str, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


@dataclass
class ChatReply:
    """One successful completion.

    Attributes:
        message: the assistant message, normalised (string arguments, unique non-empty ids).
        prompt_tokens / completion_tokens: the provider's reported usage, tokens.
        provider_ms: wall time inside HTTP, back-off included, ms.
        retries: one entry per failed attempt: {"error": str, "waitMs": float}.
    """

    message: Message
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    provider_ms: float
    retries: list[dict[str, Any]] = field(default_factory=list)


class ChatClient:
    """An async client for one base URL.

    Args:
        base_url: e.g. "http://127.0.0.1:8080/v1".
        timeout_s: per-attempt timeout, seconds.
        max_retries: extra attempts after the first for retryable failures.
        backoff_s: first back-off delay, doubled per attempt, capped at 8 s.
    """

    def __init__(
        self, base_url: str, *, timeout_s: float = 600.0, max_retries: int = 4,
        backoff_s: float = 0.5, api_key: str = "sk-local",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            headers={"Authorization": f"Bearer {api_key}"},
            # Plain http needs no TLS: building the default SSL context costs ~20 ms per client.
            verify=not self.base_url.startswith("http://"),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def chat(
        self, model: str, messages: list[Message], tools: list[dict[str, Any]] | None = None,
        *, max_tokens: int | None = None, extra: dict[str, Any] | None = None,
    ) -> ChatReply:
        """Ask for one completion, retrying transient failures.

        Raises:
            ProviderError: a non-retryable status (with the provider's message) or retries exhausted.
        """
        body: dict[str, Any] = {"model": model, "messages": _request_messages(messages),
                                "temperature": 0, "seed": 0}
        if tools:
            body["tools"] = tools
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        body.update(extra or {})
        retries: list[dict[str, Any]] = []
        started = time.perf_counter()
        for attempt in range(self.max_retries + 1):
            try:
                data = await self._post(body)
                message, finish = _parse_choice(data)
                usage = data.get("usage") or {}
                return ChatReply(
                    message=message,
                    prompt_tokens=int(usage.get("prompt_tokens") or 0),
                    completion_tokens=int(usage.get("completion_tokens") or 0),
                    finish_reason=finish,
                    provider_ms=(time.perf_counter() - started) * 1000,
                    retries=retries,
                )
            except ProviderError as exc:
                if not exc.retryable or attempt == self.max_retries:
                    exc.retryable = False
                    raise
                wait_s = getattr(exc, "retry_after_s", None)
                if wait_s is None:
                    wait_s = min(self.backoff_s * 2**attempt, 8.0)
                retries.append({"error": str(exc), "status": exc.status, "waitMs": round(wait_s * 1000)})
                await asyncio.sleep(wait_s)
        raise AssertionError("unreachable")

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await self._http.post(self.base_url + "/chat/completions", json=body)
        except httpx.TimeoutException:
            raise ProviderError("the provider timed out", retryable=True) from None
        except httpx.TransportError as exc:
            raise ProviderError(f"cannot reach {self.base_url}: {exc}", retryable=True) from None
        if response.status_code >= 400:
            err = ProviderError(
                f"HTTP {response.status_code}: {_error_text(response)}",
                status=response.status_code,
                retryable=response.status_code in RETRYABLE_STATUS,
            )
            retry_after = response.headers.get("retry-after")
            if retry_after is not None:
                try:
                    err.retry_after_s = max(0.0, float(retry_after))  # type: ignore[attr-defined]
                except ValueError:
                    pass
            raise err
        try:
            data = response.json()
        except ValueError:
            raise ProviderError(
                f"the provider answered with unreadable JSON ({len(response.content)} bytes)",
                status=response.status_code, retryable=True,
            ) from None
        if not isinstance(data, dict):
            raise ProviderError("the provider answered with a non-object body", retryable=True)
        return data


def _error_text(response: httpx.Response) -> str:
    """The provider's own error message if it sent one in the OpenAI shape, else the body in
    one line. An HTML page (a web server or proxy, not an API) becomes its title and a hint."""
    try:
        data = response.json()
        err = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)
        return str(err)
    except ValueError:
        pass
    text = response.text
    if "html" in response.headers.get("content-type", "") or text.lstrip()[:1] == "<":
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.I | re.S)
        label = " ".join(title.group(1).split()) if title else response.reason_phrase
        return (f"an HTML page ({label!r}), not an API reply: is {response.request.url.host}"
                f" an OpenAI-compatible endpoint? The base URL usually ends in /v1")
    return " ".join(text.split())[:300] or response.reason_phrase


def _request_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages as sent: assistant `content: null` becomes "" (llama-cpp-python 0.3.x
    answers HTTP 500 otherwise)."""
    out = []
    for m in messages:
        d = m.to_api()
        if m.role == "assistant" and d.get("content") is None:
            d["content"] = ""
        out.append(d)
    return out


def _parse_choice(data: dict[str, Any]) -> tuple[Message, str | None]:
    """The first choice's message, normalised.

    Raises:
        ProviderError (retryable): the body has no usable choice.
    """
    try:
        choice = data["choices"][0]
        raw = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise ProviderError("the provider's reply has no choices[0].message", retryable=True) from None
    if not isinstance(raw, dict):
        raise ProviderError("the provider's choices[0].message is not an object", retryable=True)
    return _parse_message(raw), choice.get("finish_reason")


def _parse_message(raw: dict[str, Any]) -> Message:
    """Normalise a local server's assistant message.

    - `arguments` sent as an object become a JSON string; surrounding whitespace is stripped;
      empty arguments become "{}".
    - missing, empty or duplicate call ids get fresh unique ones.
    """
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for raw_call in raw.get("tool_calls") or []:
        fn = raw_call.get("function") or {}
        args = fn.get("arguments")
        if args is None or args == "":
            args = "{}"
        elif not isinstance(args, str):
            args = json.dumps(args)
        call_id = str(raw_call.get("id") or "").strip()
        if not call_id or call_id in seen:
            call_id = f"call_{uuid.uuid4().hex[:12]}"
        seen.add(call_id)
        calls.append(ToolCall(id=call_id, function=FunctionCall(name=str(fn.get("name") or ""), arguments=args.strip())))
    content = raw.get("content")
    return Message(role="assistant", content=content if isinstance(content, str) else None,
                   tool_calls=calls or None)
