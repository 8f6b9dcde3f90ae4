"""Driving one run in the foreground of a terminal: its endpoint opened for it, Ctrl-C (SIGINT)
and SIGTERM as the run's Stop signal, progress reported through callbacks (`Feedback`).

The first Ctrl-C while the loop runs reaches the HTTP call and any running tool through the
run's `CancelToken`; the loop saves the run `interrupted` and returns. A Ctrl-C while the
endpoint starts saves the run `interrupted` too, says so, and ends the process at once with
the run's exit code. Further Ctrl-Cs are ignored, so that nothing cuts a save short.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NoReturn

from runner.cancel import CancelToken, stopped_by
from runner.endpoints import open_endpoint
from runner.errors import EXIT_CODES, ServiceError
from runner.harness import drive
from runner.state import CancelledInterruption, ProviderUnavailableInterruption, RunState

if TYPE_CHECKING:
    from runner.client import RetryCallback
    from runner.scripted import InProcessProvider, ScriptedProcess
    from runner.store import Lease, RunStore
    from runner.streaming import TurnProgress

OnToolProgress = Callable[[str, str, float], None]
"""Called with (tool name, label, ms since the run started in this process)."""


@dataclass(frozen=True, eq=False, repr=False)
class Feedback:
    """What a run driven in the foreground reports as it goes; every callback is optional
    (`runner.render.live_feedback` draws them on stderr). Callbacks are neither compared nor
    printed: no generated `__eq__`, `__hash__` or `__repr__` to compile at start-up."""

    on_note: Callable[[str], None] | None = None
    """A line about how the run starts (the local model runner serves for it, an MCP tool that
    cannot be offered)."""
    on_progress: OnToolProgress | None = None
    on_turn: Callable[[TurnProgress], None] | None = None
    """The progress of each model call (the live turn line)."""
    on_retry: RetryCallback | None = None
    """Each retry of a failed request, before its back-off."""
    on_stopping: Callable[[int], None] | None = None
    """A Ctrl-C or SIGTERM while the loop runs (called with how many so far): the run stops at
    its next step."""
    on_stopped_early: Callable[[RunState], None] | None = None
    """A Ctrl-C came before the loop ran: the run is saved `interrupted`, the process exits next."""
    on_end: Callable[[], None] | None = None
    """The drive ended, however it ended (an open turn line is closed)."""


class StopSignals:
    """SIGINT and SIGTERM, owned by a foreground run from before it is created (install it first).

    Until `arm`, a press is only recorded (a run being created or claimed is never cut in
    half); armed, a press raises KeyboardInterrupt (the endpoint is starting); once the loop
    runs, a press is the run's Stop signal (`cancel`). The run records which signal it was
    ("stopped by SIGTERM", "stopped by Ctrl-C (SIGINT)"). Call from the main thread.
    """

    def __init__(self) -> None:
        self.cancel = CancelToken()
        self.on_stopping: Callable[[int], None] | None = None
        """Told of each press once the loop runs, in the loop (`Feedback.on_stopping`)."""
        self.presses = 0
        self.pressed = False
        self.reason: str | None = None
        """Which signal came first, in words (`runner.cancel.stopped_by`)."""
        self.armed = False
        self.loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def install(cls) -> StopSignals:
        signals = cls()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signals._on_signal)
        return signals

    def _on_signal(self, signum: int, frame: object) -> None:
        self.reason = self.reason or stopped_by(signum)
        if self.loop is not None:
            self.presses += 1
            self.loop.call_soon_threadsafe(self._stopping, stopped_by(signum), self.presses)
            return
        self.pressed = True
        if self.armed:
            _ignore_stop_signals()
            raise KeyboardInterrupt

    def _stopping(self, reason: str, presses: int) -> None:
        self.cancel.cancel(reason)
        if self.on_stopping is not None:
            self.on_stopping(presses)

    def arm(self) -> None:
        """From here a press stops at once; one that came before stops here."""
        self.armed = True
        if self.pressed:
            _ignore_stop_signals()
            raise KeyboardInterrupt


def drive_in_foreground(state: RunState, runs: RunStore, lease: Lease, signals: StopSignals,
                        feedback: Feedback = Feedback(), *, faults: str | None = None,
                        provider: ScriptedProcess | InProcessProvider | None = None, **options: Any) -> RunState:
    """Drive `state` under `lease` to its stop, starting its endpoint (or using `provider`, a
    scripted provider already starting for it, stopped here); releases the lease at the stop.
    An endpoint that does not start stops the run `interrupted`, as one it could not reach.
    After it returns, SIGINT and SIGTERM are ignored (the run is saved: nothing may cut the
    report short).

    `options` go to `runner.harness.drive` (`tools`, `api_key`).

    A press before the loop ran (while the run was created or its endpoint started) saves the
    run `interrupted`, calls `feedback.on_stopped_early`, and ends the process at once with the
    run's exit code (`runner.errors.EXIT_CODES`): this function does not return then.
    """
    # The event loop is made before a press may raise: a loop cut short in its constructor
    # prints a traceback when it is collected.
    runner = asyncio.Runner()
    runner.get_loop()
    signals.on_stopping = feedback.on_stopping
    try:
        signals.arm()
        with contextlib.redirect_stdout(sys.stderr):  # what a tool prints: stdout carries the result (--json)
            return _drive(state, runs, lease, faults, provider, feedback, signals, runner, options)
    except KeyboardInterrupt:
        _save_stopped_early(state, runs, lease, signals.reason or stopped_by(signal.SIGINT))
    finally:
        _ignore_stop_signals()
        runner.close()
        runs.release(lease)
        if feedback.on_end is not None:
            feedback.on_end()
    if feedback.on_stopped_early is not None:
        feedback.on_stopped_early(state)
    _exit_now(EXIT_CODES[state.status])


def _save_stopped_early(state: RunState, runs: RunStore, lease: Lease, reason: str) -> None:
    """Save a run that a signal (`reason`: which one) stopped before the loop ran as
    `interrupted` (unless it saved a stop already), ignoring further signals so nothing cuts
    that short."""
    _ignore_stop_signals()
    if state.status == "running":
        state.status, state.reason = "interrupted", f"cancelled: {reason} before the run started"
        state.interruption = CancelledInterruption(reason=reason)
        runs.save(state, (), lease)


def _exit_now(code: int) -> NoReturn:
    """Leave the process with `code` once stdout and stderr are flushed: the run is saved,
    released and said. A normal exit after a KeyboardInterrupt was seen to die of SIGINT (exit
    -2) about 1 time in 15 during interpreter shutdown on this machine."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _drive(state: RunState, runs: RunStore, lease: Lease, faults: str | None,
           provider: ScriptedProcess | InProcessProvider | None, feedback: Feedback, signals: StopSignals,
           runner: asyncio.Runner, options: dict[str, Any]) -> RunState:
    began = time.perf_counter()
    on_progress = feedback.on_progress

    def progress(tool: str, label: str) -> None:
        if on_progress is not None:
            on_progress(tool, label, (time.perf_counter() - began) * 1000)

    async def go(base_url: str, server_settings: dict[str, Any] | None) -> RunState:
        nonlocal began
        began = time.perf_counter()  # the run's clock, not the endpoint's start-up
        return await drive(state, base_url, runs, cancel=signals.cancel, on_progress=progress, lease=lease,
                           on_turn=feedback.on_turn, on_retry=feedback.on_retry, server_settings=server_settings,
                           on_note=feedback.on_note, **options)

    def run(base_url: str, server_settings: dict[str, Any] | None) -> RunState:
        signals.loop = runner.get_loop()  # from here a press is the run's Stop signal, seen by the loop
        return runner.run(go(base_url, server_settings))

    with contextlib.ExitStack() as stack:
        try:
            if provider is not None:
                base_url, settings = stack.enter_context(provider), None
            else:
                opened = stack.enter_context(open_endpoint(state.config.endpoint, faults=faults))
                base_url, settings = opened.base_url, opened.server_settings
        except ServiceError as exc:
            _save_unreachable(state, runs, lease, str(exc))
            return state
        return run(base_url, settings)


def _save_unreachable(state: RunState, runs: RunStore, lease: Lease, message: str) -> None:
    """Save a run whose endpoint did not start (a model llama.cpp cannot load, a provider
    that never listened) as one that could not reach it: `interrupted`, nothing asked or
    paid, and a plain resume tries again."""
    from runner.trace import RunStopped

    state.status, state.reason = "interrupted", f"provider unavailable: {message}"
    state.interruption = ProviderUnavailableInterruption(http_status=None, message=message, retries=0)
    runs.save(state, [RunStopped(runId=state.run_id, status=state.status, reason=state.reason, turns=state.turns,
                                 costUsd=state.cost_usd)], lease)
