"""In-process providers: ASGI apps answering base URLs `http://<name>.in-process/v1` without a
socket, reached through an httpx transport that `runner.client.new_http_client` mounts.

A provider whose replies are a pure function of the request (the scripted one) loses nothing
by answering inside the caller's process, and the caller saves starting a second one. The
request still goes through runner's real client and httpx: only the socket is left out.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

HOSTS = "http://*.in-process"
"""The URL pattern the transport answers (an httpx mount key)."""

App = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[MutableMapping[str, Any]]],
                Callable[[MutableMapping[str, Any]], Awaitable[None]]], Awaitable[None]]

_apps: dict[str, App] = {}
_lock = threading.Lock()
_ids = itertools.count(1)


def register(app: App, name: str = "provider") -> str:
    """Have `app` answer a new host; returns its base URL, `http://<name>-N.in-process/v1`."""
    with _lock:
        host = f"{name}-{next(_ids)}.in-process"
        _apps[host] = app
    return f"http://{host}/v1"


def unregister(base_url: str) -> None:
    """Stop answering `base_url` (its requests then fail as an unreachable server's)."""
    import httpx

    with _lock:
        _apps.pop(httpx.URL(base_url).host, None)


def is_in_process(base_url: str) -> bool:
    import httpx

    return httpx.URL(base_url).host.endswith(".in-process")


def transport() -> httpx.AsyncBaseTransport:
    """The httpx transport for `HOSTS`: each request goes to the app its host names; an
    unknown or unregistered one is a connection error. The request's read timeout bounds the
    whole reply (the app answers in one piece here), raised as a read timeout, as a slow
    server's would be."""
    import asyncio

    import httpx

    class _Router(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            app = _apps.get(request.url.host)
            if app is None:
                raise httpx.ConnectError(f"no in-process provider answers {request.url.host}", request=request)
            timeout_s = request.extensions.get("timeout", {}).get("read")
            try:
                return await asyncio.wait_for(httpx.ASGITransport(app=app).handle_async_request(request), timeout_s)
            except TimeoutError:
                raise httpx.ReadTimeout(f"no reply within {timeout_s} s", request=request) from None

    return _Router()
