"""One cancellation signal for a run: the HTTP call, async tools and threaded tools all see it.

A `CancelToken` is never serialised. `cancel(reason)` may be called from any thread (or a
signal handler); async code awaits `wait()`, sync code polls `is_cancelled` or sleeps with
`sleep(seconds)`, which returns early on cancellation.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Awaitable, TypeVar

T = TypeVar("T")


class CancelToken:
    """A thread-safe, one-shot cancellation signal carrying a reason in words."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._lock = threading.Lock()
        self.reason: str | None = None
        self.cancelled_at: float | None = None
        """time.perf_counter() when cancel() was first called."""

    @property
    def is_cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str = "cancelled") -> None:
        """Signal cancellation (idempotent; the first reason wins)."""
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self.cancelled_at = time.perf_counter()
            self._event.set()
            waiters = list(self._waiters)
        for loop, event in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    async def wait(self) -> str:
        """Return the reason once cancelled (never returns if nobody cancels)."""
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            if self._event.is_set():
                return self.reason or "cancelled"
            self._waiters.append(entry)
        try:
            await event.wait()
        finally:
            with self._lock:
                self._waiters.remove(entry)
        return self.reason or "cancelled"

    def sleep(self, seconds: float) -> bool:
        """Block up to `seconds`; True if cancellation arrived meanwhile (sync tools)."""
        return self._event.wait(seconds)


class Cancelled(Exception):
    """Raised inside the loop's helpers when the token fires mid-call; never leaves `run()`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def race(awaitable: Awaitable[T], token: CancelToken) -> T:
    """Await `awaitable` unless `token` fires first; then cancel it and raise `Cancelled`."""
    task = asyncio.ensure_future(awaitable)
    if token.is_cancelled:
        task.cancel()
        raise Cancelled(token.reason or "cancelled")
    stopper = asyncio.ensure_future(token.wait())
    try:
        done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task in done:
        return task.result()
    task.cancel()
    try:
        await task
    except BaseException:
        pass
    raise Cancelled(token.reason or "cancelled")
