"""Driving one run in the foreground of a terminal: its endpoint opened for it, Ctrl-C (SIGINT)
and SIGTERM as the run's Stop signal, progress reported through callbacks.

The first Ctrl-C while the loop runs reaches the HTTP call and any running tool through the
run's `CancelToken`; the loop saves the run `interrupted` and returns. A Ctrl-C while the
endpoint starts saves the run `interrupted` too and raises `StoppedEarly`. Further Ctrl-Cs are
ignored, so that nothing cuts a save short.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import TYPE_CHECKING, Any, Callable

from runner.cancel import CancelToken
from runner.endpoints import open_endpoint
from runner.harness import drive
from runner.state import CancelledInterruption, RunState

if TYPE_CHECKING:
    from runner.scripted import InProcessProvider, ScriptedProcess
    from runner.store import Lease, RunStore
    from runner.streaming import TurnProgress

OnToolProgress = Callable[[str, str, float], None]
"""Called with (tool name, label, ms since the run started in this process)."""


class StoppedEarly(Exception):
    """Ctrl-C came outside the loop's own handler; `state` is saved, `interrupted`, resumable."""

    def __init__(self, state: RunState) -> None:
        super().__init__(f"run {state.run_id} interrupted")
        self.state = state


class StopSignals:
    """SIGINT and SIGTERM, owned by a foreground run from before it is created (install it first).

    Until `arm`, a press is only recorded (a run being created or claimed is never cut in
    half); armed, a press raises KeyboardInterrupt (the endpoint is starting); once the loop
    runs, a press is the run's Stop signal (`cancel`). Call from the main thread.
    """

    def __init__(self) -> None:
        self.cancel = CancelToken()
        self.pressed = False
        self.armed = False
        self.loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def install(cls) -> StopSignals:
        signals = cls()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signals._on_signal)
        return signals

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.cancel.cancel, "user pressed Stop")
            return
        self.pressed = True
        if self.armed:
            _ignore_stop_signals()
            raise KeyboardInterrupt

    def arm(self) -> None:
        """From here a press stops at once; one that came before stops here."""
        self.armed = True
        if self.pressed:
            _ignore_stop_signals()
            raise KeyboardInterrupt


def drive_in_foreground(state: RunState, runs: RunStore, lease: Lease, signals: StopSignals, *,
                        faults: str | None = None, provider: ScriptedProcess | InProcessProvider | None = None,
                        on_progress: OnToolProgress | None = None,
                        on_turn: Callable[[TurnProgress], None] | None = None, **options: Any) -> RunState:
    """Drive `state` under `lease` to its stop, starting its endpoint (or using `provider`, a
    scripted provider already starting for it, stopped here); releases the lease at the stop.
    After it returns or raises, SIGINT and SIGTERM are ignored (the run is saved: nothing may
    cut the report short).

    `options` go to `runner.harness.drive` (`tools`, `api_key`, `on_retry`).

    Raises:
        StoppedEarly: a press came before the loop ran (while the run was created or its
            endpoint started); the run is saved `interrupted`.
    """
    try:
        signals.arm()
        return _drive(state, runs, lease, faults, provider, on_progress, on_turn, signals, options)
    except KeyboardInterrupt:
        raise stopped_early(state, runs, lease) from None
    finally:
        _ignore_stop_signals()
        runs.release(lease)


def stopped_early(state: RunState, runs: RunStore, lease: Lease) -> StoppedEarly:
    """Save a run that Ctrl-C stopped before the loop ran as `interrupted` (unless it saved a
    stop already), ignoring further Ctrl-Cs so nothing cuts that short."""
    _ignore_stop_signals()
    if state.status == "running":
        state.status, state.reason = "interrupted", "cancelled: user pressed Stop before the run started"
        state.interruption = CancelledInterruption(reason="user pressed Stop")
        runs.save(state, (), lease)
    return StoppedEarly(state)


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _drive(state: RunState, runs: RunStore, lease: Lease, faults: str | None, provider: ScriptedProcess | InProcessProvider | None,
           on_progress: OnToolProgress | None, on_turn: Callable[[TurnProgress], None] | None,
           signals: StopSignals, options: dict[str, Any]) -> RunState:
    began = time.perf_counter()

    def progress(tool: str, label: str) -> None:
        if on_progress is not None:
            on_progress(tool, label, (time.perf_counter() - began) * 1000)

    async def go(base_url: str, server_settings: dict[str, Any] | None) -> RunState:
        nonlocal began
        began = time.perf_counter()  # the run's clock, not the endpoint's start-up
        signals.loop = asyncio.get_running_loop()
        return await drive(state, base_url, runs, cancel=signals.cancel, on_progress=progress, lease=lease,
                           on_turn=on_turn, server_settings=server_settings, **options)

    if provider is not None:
        with provider as base_url:
            return asyncio.run(go(base_url, None))
    with open_endpoint(state.config.endpoint, faults=faults) as opened:
        return asyncio.run(go(opened.base_url, opened.server_settings))
