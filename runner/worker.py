"""Workers: a process that claims runnable runs from a store and drives them, N at a time.

A runnable run is one queued by `runner run --detach`, one given a verdict or a resume with
`--detach`, or one saved `running` whose driver died (its lease expired). The store hands
each to one claimant only (`RunStore.claim_next`), the lease is renewed while the run is
driven, and the run is released at its stop. Endpoints are started once per worker process and
shared by its runs: the scripted provider, or a local model named by a run's config.
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
               stop: asyncio.Event | None = None) -> WorkerReport:
    """Claim and drive runs until `stop` is set, or until no run was claimable for `idle_exit_s`.

    Args:
        concurrency: runs driven at once by this process.
        poll_s: wait between claims when nothing is runnable, seconds.
        owner: lease owner prefix (default `user@host pid N`); slot k appends " slot k".
        log: called with one line per run driven (and per failure).

    Returns:
        A `WorkerReport`. Errors driving one run are reported, not raised.
    """
    owner = owner or default_owner()
    stop = stop or asyncio.Event()
    report = WorkerReport()
    say = log or (lambda line: None)
    cancels: set[CancelToken] = set()

    async def slot(k: int, endpoints: _Endpoints) -> None:
        idle_since = time.monotonic()
        while not stop.is_set():
            lease = store.claim_next(f"{owner} slot {k}")
            if lease is None:
                if idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s:
                    return
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), poll_s)
                continue
            await _drive_one(store, lease, endpoints, report, say, cancels, http)
            idle_since = time.monotonic()

    async with new_http_client() as http:  # the runs driven here share kept-alive connections
        with contextlib.ExitStack() as stack:
            endpoints = _Endpoints(stack)
            waiter = asyncio.ensure_future(stop.wait())
            slots = [asyncio.ensure_future(slot(k, endpoints)) for k in range(concurrency)]
            try:
                while not all(s.done() for s in slots):
                    await asyncio.wait([waiter, *slots], return_when=asyncio.FIRST_COMPLETED)
                    if stop.is_set():
                        for token in list(cancels):
                            token.cancel("the worker is stopping")
                        await asyncio.gather(*slots)
                for s in slots:
                    s.result()
            finally:
                waiter.cancel()
    return report


async def _drive_one(store: RunStore, lease: Lease, endpoints: _Endpoints, report: WorkerReport,
                     say: Callable[[str], None], cancels: set[CancelToken], http: httpx.AsyncClient) -> None:
    cancel = CancelToken()
    cancels.add(cancel)
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
        report.errors.append(f"{lease.run_id}: {exc}")
        say(f"{lease.run_id}: not driven: {exc}")
    except Exception as exc:  # nor does a bug one run meets (the run stays resumable as after any crash)
        report.errors.append(f"{lease.run_id}: internal error ({type(exc).__name__}: {exc})")
        say(f"{lease.run_id}: not driven: internal error ({type(exc).__name__}: {exc}); this is a bug in runner")
    finally:
        cancels.discard(cancel)
        with contextlib.suppress(RunnerError):
            store.release(lease)


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
