"""Workers: a process that claims runnable runs from a store and drives them, N at a time.

A runnable run is one queued by `runner run --detach`, one given a verdict or a resume with
`--detach`, or one saved `running` whose driver died (its lease expired). The store hands
each to one claimant only (`RunStore.claim_next`), the lease is renewed while the run is
driven, and the run is released at its stop. Endpoints are started once per worker process and
shared by its runs: the scripted provider, or a local model named by a run's config. A run
the worker cannot drive (its tool or model cannot be found or started here) is put back and
set aside, tried again after 30 s, then twice as long each time, up to 10 min: the worker
goes on with the other runs meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from runner.cancel import CancelToken
from runner.client import new_http_client
from runner.endpoints import Endpoint, Opened, open_endpoint
from runner.errors import RunnerError
from runner.harness import drive
from runner.store import Lease, RunStore, default_owner

if TYPE_CHECKING:
    import httpx


@dataclass
class WorkerReport:
    """What one worker process did: run ids driven, by final status, and failures to drive."""

    driven: dict[str, str] = field(default_factory=dict)
    """run id -> status it stopped with (the last time this worker drove it)."""
    errors: list[str] = field(default_factory=list)


RETRY_S = 30.0
"""How long a run this worker could not drive is set aside before it is tried again."""
RETRY_MAX_S = 600.0
"""The longest it is set aside (the wait doubles after each failure)."""


@dataclass
class _SetAside:
    """Runs this worker failed to drive: run id -> (monotonic time it may be tried again, wait)."""

    runs: dict[str, tuple[float, float]] = field(default_factory=dict)

    def waiting(self) -> list[str]:
        now = time.monotonic()
        return [run_id for run_id, (until, _) in self.runs.items() if until > now]

    def add(self, run_id: str, retry_s: float) -> float:
        """Set the run aside; how long, seconds (doubled from the last time, at most RETRY_MAX_S)."""
        last = self.runs.get(run_id, (0.0, 0.0))[1]
        wait_s = min(2 * last, RETRY_MAX_S) if last else retry_s
        self.runs[run_id] = (time.monotonic() + wait_s, wait_s)
        return wait_s


class _Endpoints:
    """The endpoints this worker's runs need, each opened on first need and kept open until
    the worker stops (runs that reach the same model share one server)."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.opened: dict[tuple[str | None, ...], Opened] = {}

    def open(self, endpoint: Endpoint) -> Opened:
        key = endpoint.key()
        if key not in self.opened:
            self.opened[key] = self.stack.enter_context(open_endpoint(endpoint))
        return self.opened[key]


async def work(store: RunStore, *, concurrency: int = 1, idle_exit_s: float | None = None, poll_s: float = 0.5,
               owner: str | None = None, log: Callable[[str], None] | None = None,
               stop: asyncio.Event | None = None, retry_s: float = RETRY_S) -> WorkerReport:
    """Claim and drive runs until `stop` is set, or until no run was claimable for `idle_exit_s`.

    Args:
        concurrency: runs driven at once by this process.
        poll_s: wait between claims when nothing is runnable, seconds.
        owner: lease owner prefix (default `user@host pid N`); slot k appends " slot k".
        log: called with one line per run driven (and per failure).
        retry_s: how long a run that could not be driven is first set aside, seconds.

    Returns:
        A `WorkerReport`. Errors driving one run are reported, not raised.
    """
    owner = owner or default_owner()
    stop = stop or asyncio.Event()
    report = WorkerReport()
    say = log or (lambda line: None)
    cancels: set[CancelToken] = set()
    aside = _SetAside()

    async def slot(k: int, endpoints: _Endpoints) -> None:
        idle_since = time.monotonic()
        while not stop.is_set():
            lease = store.claim_next(f"{owner} slot {k}", skip=aside.waiting())
            if lease is None:
                if idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s:
                    return
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), poll_s)
                continue
            failure = await _drive_one(store, lease, endpoints, report, cancels, http, say)
            if failure:
                say(f"{lease.run_id}: not driven: {failure}; trying it again in {aside.add(lease.run_id, retry_s):.0f} s")
            idle_since = time.monotonic()
            await asyncio.sleep(0)  # a stop asked for meanwhile is seen before the next claim

    async with new_http_client() as http:  # the runs driven here share kept-alive connections
        with contextlib.ExitStack() as stack:
            endpoints = _Endpoints(stack)
            waiter = asyncio.ensure_future(stop.wait())
            slots = [asyncio.ensure_future(slot(k, endpoints)) for k in range(concurrency)]
            try:
                while not all(s.done() for s in slots):
                    await asyncio.wait([waiter, *slots], return_when=asyncio.FIRST_COMPLETED)
                    if stop.is_set():
                        if cancels:
                            say(f"stopping: {len(cancels)} run(s) being driven stop at their next step (a running "
                                "tool that does not check for a stop finishes first)")
                        for token in list(cancels):
                            token.cancel("the worker is stopping")
                        await asyncio.gather(*slots)
                for s in slots:
                    s.result()
            finally:
                waiter.cancel()
    return report


async def _drive_one(store: RunStore, lease: Lease, endpoints: _Endpoints, report: WorkerReport,
                     cancels: set[CancelToken], http: httpx.AsyncClient, say: Callable[[str], None]) -> str:
    """Drive the leased run to a stop and release it; '' or why it could not be driven (the
    run is then put back for a worker, as it was)."""
    cancel = CancelToken()
    cancels.add(cancel)
    failure = ""
    try:
        state = store.load(lease.run_id)
        opened = endpoints.open(state.config.endpoint)
        began = time.perf_counter()
        state = await drive(state, opened.base_url, store, cancel=cancel, lease=lease, http=http,
                              server_settings=opened.server_settings)
        report.driven[state.run_id] = state.status
        why = f": {state.reason}" if state.status != "completed" and state.reason else ""
        say(f"{lease.run_id}: {state.status} after {state.turns} turn{'s' if state.turns != 1 else ''}{why}  "
            f"(epoch {lease.epoch}, {(time.perf_counter() - began) * 1000:,.0f} ms)")
    except (RunnerError, OSError) as exc:  # one run's trouble never stops the worker
        failure = str(exc)
    except Exception as exc:  # nor does a bug one run meets (the run stays resumable as after any crash)
        failure = f"internal error ({type(exc).__name__}: {exc}); this is a bug in runner"
    finally:
        cancels.discard(cancel)
        with contextlib.suppress(RunnerError):
            store.release(lease, runnable=bool(failure))
    if failure:
        report.errors.append(f"{lease.run_id}: {failure}")
    return failure


def run_worker(store: RunStore, *, concurrency: int = 1, idle_exit_s: float | None = None,
               poll_s: float = 0.5, log: Callable[[str], None] | None = None) -> WorkerReport:
    """`work` in a fresh event loop, with SIGINT/SIGTERM as a clean stop (runs being driven
    stop `interrupted` and stay resumable); `log` gets one line per run."""

    async def main() -> WorkerReport:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await work(store, concurrency=concurrency, idle_exit_s=idle_exit_s, poll_s=poll_s, stop=stop, log=log)

    return asyncio.run(main())
