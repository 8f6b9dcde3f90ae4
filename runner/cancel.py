"""One cancellation signal for a run: the HTTP call, async tools and threaded tools all see it.

A `CancelToken` is never serialised. `cancel(reason)` may be called from any thread (or a
signal handler); async code awaits `wait()`, sync code polls `is_cancelled` or sleeps with
`sleep(seconds)`, which returns early on cancellation.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Coroutine, TypeVar

if TYPE_CHECKING:
    import asyncio  # imported where used: `from runner import run` stays ~14 ms lighter

T = TypeVar("T")


class CancelToken:
    """A thread-safe, one-shot cancellation signal carrying a reason in words."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._callbacks: list[tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = []
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
            callbacks = list(self._callbacks)
        for loop, callback in callbacks:
            if not loop.is_closed():
                loop.call_soon_threadsafe(callback)

    def _subscribe(self, callback: Callable[[], None]) -> tuple[asyncio.AbstractEventLoop, Callable[[], None]] | None:
        """Have `callback` called on the running loop once cancelled; None if already cancelled."""
        import asyncio

        entry = (asyncio.get_running_loop(), callback)
        with self._lock:
            if self._event.is_set():
                return None
            self._callbacks.append(entry)
        return entry

    def _unsubscribe(self, entry: tuple[asyncio.AbstractEventLoop, Callable[[], None]]) -> None:
        with self._lock:
            self._callbacks.remove(entry)

    async def wait(self) -> str:
        """Return the reason once cancelled (never returns if nobody cancels)."""
        import asyncio

        event = asyncio.Event()
        entry = self._subscribe(event.set)
        if entry is None:
            return self.reason or "cancelled"
        try:
            await event.wait()
        finally:
            self._unsubscribe(entry)
        return self.reason or "cancelled"

    def sleep(self, seconds: float) -> bool:
        """Block up to `seconds`; True if cancellation arrived meanwhile (sync tools)."""
        return self._event.wait(seconds)


def stopped_by(signum: int) -> str:
    """The reason a run stopped by signal `signum` records, in words: "stopped by SIGTERM",
    "stopped by Ctrl-C (SIGINT)"."""
    import signal

    if signum == signal.SIGINT:
        return "stopped by Ctrl-C (SIGINT)"
    return f"stopped by {signal.Signals(signum).name}"


class Cancelled(Exception):
    """Raised inside the loop's helpers when the token fires mid-call; never leaves `run()`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def race(awaitable: Coroutine[Any, Any, T], token: CancelToken) -> T:
    """Await `awaitable` unless `token` fires first; then cancel it and raise `Cancelled`.

    It runs in the caller's task (no task or waiter of its own, so a model call pays nothing
    for being stoppable): the token's callback cancels the caller's task, and the
    cancellation it causes is turned into `Cancelled`. A cancellation from anywhere else
    propagates unchanged.
    """
    import asyncio

    if token.is_cancelled:
        awaitable.close()
        raise Cancelled(token.reason or "cancelled")
    task = asyncio.current_task()
    assert task is not None, "race() runs inside a task"
    state = {"waiting": True, "fired": False}

    def interrupt() -> None:
        if state["waiting"]:  # called on the loop: never after the await below has finished
            state["fired"] = True
            task.cancel()

    entry = token._subscribe(interrupt)
    if entry is None:
        awaitable.close()
        raise Cancelled(token.reason or "cancelled")
    try:
        result = await awaitable
    except asyncio.CancelledError:
        if state["fired"]:
            task.uncancel()
            raise Cancelled(token.reason or "cancelled") from None
        raise
    finally:
        state["waiting"] = False
        token._unsubscribe(entry)
    if state["fired"]:  # the call finished despite the cancel: it is not pending on the task
        task.uncancel()
    return result
