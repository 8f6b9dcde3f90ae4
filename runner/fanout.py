"""Fan-out: drive many saved runs to their stops, in this process or on Ray actors.

The suite creates every run in the store first, then hands an executor a list of `Batch`es:
a `runner.endpoints.Endpoint` (how to reach one model) and the ids of the runs that talk to it. Executors
advance runs *by id*: each drive starts from the state saved in the store, so a drive that is
retried after its process died resumes the run (no recorded turn is asked again, no recorded
tool call runs again; see `runner.loop.run`).

- `LocalExecutor` (the default): this process, one endpoint at a time, runs one after another.
- `RayExecutor`: `actors` Ray actors per endpoint, each owning its own endpoint (a scripted
  provider, or a llama.cpp server with its own threads) and one HTTP client for all its runs.
  Run i of a batch goes to actor i mod N, so the same inputs give the same placement; an
  actor gets all its runs in one streaming call, drives `concurrency` of them at a time (one
  for a local model: its server generates one reply at a time) and reports each run as it
  stops. A dead actor is restarted and its runs not yet reported are sent again
  (`max_restarts`, `max_task_retries`). `RayExecutor.start` starts them ahead, endpoint up,
  model loaded and runner's drive code built, for the drives that follow.

The store seam is the three functions `create`, `load` and `advance` at the top of this module:
the only code here that touches `runner.store` and `runner.harness.drive`. A store location
is a string: a runs directory today (so its runs are driven on the machine holding it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Iterator, Protocol, TypeVar

from runner import store
from runner.cancel import CancelToken, stopped_by
from runner.client import new_http_client
from runner.endpoints import Endpoint, Opened, open_endpoint
from runner.errors import RunnerError, ServiceError, UsageError
from runner.harness import drive
from runner.local import physical_cores
from runner.resources import checkout_root
from runner.state import RunState

if TYPE_CHECKING:
    import httpx

# --- the store seam -------------------------------------------------------------------------


_STORES: dict[store.StoreAt, store.RunStore] = {}


def _store(where: store.StoreAt) -> store.RunStore:
    """One open store per location and process (a PostgresStore holds a connection pool)."""
    if where not in _STORES:
        _STORES[where] = where.open()
    return _STORES[where]


def create(state: RunState, where: store.StoreAt) -> None:
    """Save a new run in the store `where` (a runs directory or a postgresql:// URL), queued:
    `runner runs` shows it `queued` until a driver claims it."""
    _store(where).create(state)


def load(run_id: str, where: store.StoreAt) -> RunState:
    """The saved state of `run_id`.

    Raises:
        RunNotFound, CorruptState: as `RunStore.load`.
    """
    return _store(where).load(run_id)


async def advance(run_id: str, where: store.StoreAt, base_url: str, cancel: CancelToken | None = None,
                  server_settings: dict[str, Any] | None = None, http: httpx.AsyncClient | None = None) -> RunState:
    """Drive (or resume) the saved run `run_id` against `base_url` to its next stop; returns it.
    `server_settings` (the local server's, when this process started it) go on `run_started`.

    A run that is no longer `running` was stopped by an earlier drive (its stop is saved), so
    it is returned as saved: a retried drive never re-enters a stopped run.

    Raises:
        RunNotFound, CorruptState: as `runner.store.load`.
    """
    state = load(run_id, where)
    if state.status != "running":
        return state
    return await drive(state, base_url, _store(where), cancel=cancel, server_settings=server_settings,
                         http=http)


@dataclass(frozen=True)
class Batch:
    """Runs (ids, already saved) that all talk to one endpoint."""

    endpoint: Endpoint
    run_ids: list[str]


OnDone = Callable[[RunState, str], None]
"""Called with each run's state when it stops (in the order runs stop), and where it was
driven: "local pid N" or "node <node id, 8 hex> pid N"."""


class Executor(Protocol):
    def drive(self, batches: list[Batch], where: store.StoreAt, on_done: OnDone) -> list[tuple[RunState, str]]:
        """Advance every run of `batches` to its stop; returns (state, where it was driven)
        of the runs driven, in batch order. Fewer come back when the user stopped the suite
        (Ctrl-C)."""
        ...

    @property
    def server_turns(self) -> dict[str, list[dict[str, float]]]:
        """Endpoint name -> `Opened.server_turns` of the local servers the last `drive` started
        for it (servers one after another)."""
        ...

    @property
    def cancelled(self) -> bool:
        """True when Ctrl-C (SIGINT/SIGTERM) stopped the last `drive` early."""
        ...


# --- in this process ------------------------------------------------------------------------


@dataclass
class LocalExecutor:
    """Drive runs one after another in this process, one endpoint open at a time.

    Ctrl-C (SIGINT/SIGTERM) stops the running run as a resumable `interrupted` run and
    skips the rest.
    """

    cancel: CancelToken = field(default_factory=CancelToken)
    _server_turns: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_cancelled

    @property
    def server_turns(self) -> dict[str, list[dict[str, float]]]:
        return self._server_turns

    def drive(self, batches: list[Batch], where: store.StoreAt, on_done: OnDone) -> list[tuple[RunState, str]]:
        states: list[tuple[RunState, str]] = []
        try:
            for batch in batches:
                if self.cancel.is_cancelled:
                    break
                with open_endpoint(batch.endpoint) as opened:
                    states += asyncio.run(self._drive_batch(batch.run_ids, where, opened, on_done))
                    self._server_turns[batch.endpoint.label] = opened.server_turns()
        except KeyboardInterrupt:  # Ctrl-C while a server was starting: no run was in flight
            self.cancel.cancel(stopped_by(signal.SIGINT))
        return states

    async def _drive_batch(self, run_ids: list[str], where: store.StoreAt, opened: Opened,
                           on_done: OnDone) -> list[tuple[RunState, str]]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.cancel.cancel, stopped_by(sig))
        states = []
        try:
            async with new_http_client(opened.base_url) as http:  # one kept-alive connection for the batch
                for run_id in run_ids:
                    if self.cancel.is_cancelled:
                        break
                    state = await advance(run_id, where, opened.base_url, self.cancel,
                                          opened.server_settings, http)
                    states.append((state, f"local pid {os.getpid()}"))
                    on_done(*states[-1])
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        return states


# --- on Ray ---------------------------------------------------------------------------------


class RunDriver:
    """The Ray actor: owns one endpoint (started in `__init__`, so a restarted actor starts a
    fresh one, and a started actor has its model loaded and runner's drive code built) and
    advances runs by id on its event loop, `concurrency` at a time, all through one HTTP
    client. Used through `RayExecutor`, which wraps it with `ray.remote` (Ray stays an
    optional import)."""

    def __init__(self, endpoint: Endpoint, concurrency: int) -> None:
        import ray

        from runner.harness import warm_up

        self._stack = contextlib.ExitStack()
        self.opened = Opened("")
        self.error: RunnerError | None = None
        self._http: httpx.AsyncClient | None = None
        self._concurrency = concurrency
        self._slots: asyncio.Semaphore | None = None
        self._where = f"node {ray.get_runtime_context().get_node_id()[:8]} pid {os.getpid()}"
        try:
            self.opened = self._stack.enter_context(open_endpoint(endpoint))
        except RunnerError as exc:  # bad configuration: a restart would fail the same way
            self.error = exc
        warm_up()

    async def ready(self) -> int:
        """The actor's pid once its endpoint is up (or failed to start)."""
        return os.getpid()

    async def drive(self, run_ids: list[str], where: store.StoreAt) -> AsyncIterator[list[tuple[str, str]]]:
        """`advance` the runs, in order, at most `concurrency` at a time over every call; yields
        the runs that stopped since the last yield (see `_in_reports`: at most every
        `REPORT_S`), each as its state in JSON (plain data across processes) and where it was
        driven ("node <id> pid N").

        Raises:
            RunnerError: the endpoint did not start (raised by every drive, not retried).
        """
        if self.error is not None:
            raise self.error
        if self._http is None:  # made on the actor's own loop, kept for every later run
            self._http = new_http_client(self.opened.base_url)
            self._slots = asyncio.Semaphore(self._concurrency)
        assert self._slots is not None
        slots, http = self._slots, self._http

        async def one(run_id: str) -> tuple[str, str]:
            async with slots:
                state = await advance(run_id, where, self.opened.base_url,
                                      server_settings=self.opened.server_settings, http=http)
            return state.model_dump_json(), self._where

        async for stopped in _in_reports(one, run_ids, self._concurrency):
            yield stopped

    async def pid(self) -> int:
        """The actor's process id (tests kill it with os.kill)."""
        return os.getpid()

    async def server_turns(self) -> list[dict[str, float]]:
        """`Opened.server_turns` of this actor's endpoint."""
        return self.opened.server_turns() if self.error is None else []

    async def stop(self) -> None:
        """Close the HTTP client and stop the endpoint this actor started."""
        if self._http is not None:
            await self._http.aclose()
        self._stack.close()


_T = TypeVar("_T")


async def _in_reports(drive_one: Callable[[str], Awaitable[_T]], run_ids: list[str],
                      at_once: int) -> AsyncIterator[list[_T]]:
    """`drive_one` each run id, in order, `at_once` at a time; yields what the runs that stopped
    since the last yield returned. A Ray reply costs about as much as driving a run at 0 ms
    latency, so yields come at most every `REPORT_S`: a run that stops when the last yield is
    older is reported at once, any other by the time it is `REPORT_S` old (the last run at
    once). Runs start here as others stop, not queued on a semaphore, so this loop gets
    control after each stop even when the runs never wait (an in-process provider at 0 ms)."""
    loop = asyncio.get_running_loop()
    queue, running = list(reversed(run_ids)), set[asyncio.Future[_T]]()
    unreported: list[_T] = []
    last_s = -REPORT_S
    try:
        while queue or running:
            while queue and len(running) < at_once:
                running.add(asyncio.ensure_future(drive_one(queue.pop())))
            due_s = last_s + REPORT_S - loop.time()
            stopped, running = await asyncio.wait(running, timeout=max(0.0, due_s) if unreported else None,
                                                  return_when=asyncio.FIRST_COMPLETED)
            unreported += [task.result() for task in stopped]
            if unreported and (loop.time() >= last_s + REPORT_S or not (queue or running)):
                last_s = loop.time()
                yield unreported
                unreported = []
    finally:
        for task in running:
            task.cancel()


def worker_runtime_env() -> dict[str, Any]:
    """The Ray runtime_env that makes workers import this process's `runner`: when runner is
    imported from a source checkout (editable install, or PYTHONPATH), that checkout goes
    first on the workers' PYTHONPATH; an installed wheel needs nothing."""
    root = checkout_root()
    if root is None:
        return {}
    path = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {"env_vars": {"PYTHONPATH": path}}


def ray_init(address: str | None = None, **kw: Any) -> None:
    """Connect to the Ray cluster at `address` ("auto", "HOST:PORT"), or start a local one
    when None; does nothing if this process is already connected. Workers get
    `worker_runtime_env()`; their output is not forwarded (stdout stays the CLI's)."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False if address is None else None, log_to_driver=False,
                 runtime_env=worker_runtime_env(), configure_logging=False, **kw)


def _nodes_for(where: store.StoreAt) -> list[str]:
    """Alive node ids that can reach the store: every node for a PostgreSQL store; with a runs
    directory, the nodes on this machine (the address of the node this driver is attached
    to), which share its filesystem."""
    import ray

    nodes: list[dict[str, Any]] = [n for n in ray.nodes() if n["Alive"]]  # type: ignore[no-untyped-call]
    if where.is_postgres:
        return [n["NodeID"] for n in nodes]
    mine = ray.get_runtime_context().get_node_id()
    here = next((n["NodeManagerAddress"] for n in nodes if n["NodeID"] == mine), None)
    return [n["NodeID"] for n in nodes if n["NodeManagerAddress"] == here]


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt while the driver waits on Ray (a no-op off
    the main thread, where Python allows no handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class RayExecutor:
    """Drive runs on Ray actors: `actors` per endpoint, placed round-robin over the nodes
    that can reach the store. Run i of a batch goes to actor i mod `actors`; every run is
    submitted at once (one call per actor) and each actor drives its runs in order.

    Attributes:
        address: cluster to join ("auto", "HOST:PORT"); None starts a local one.
        actors: actors per endpoint (None: the number of nodes x 2, at least 2).
        concurrency: runs one actor drives at a time (None: 1 for a local model, whose server
            generates one reply at a time; `SCRIPTED_CONCURRENCY` for other endpoints, where a
            run mostly waits for replies).
        max_restarts / max_task_retries: how often Ray restarts a dead actor, and how often
            an actor's runs not yet reported are sent to it again (each resumes from the store).
        handles: the actors of the last `drive`, per batch.
        assigned: run id -> the actor driving it in the last `drive` (tests kill one mid-suite).
    """

    address: str | None = None
    actors: int | None = None
    concurrency: int | None = None
    max_restarts: int = 3
    max_task_retries: int = 3
    handles: list[list[Any]] = field(default_factory=list)
    assigned: dict[str, Any] = field(default_factory=dict)
    _cancelled: bool = False
    _server_turns: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    _pool: dict[Endpoint, list[Any]] = field(default_factory=dict)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def server_turns(self) -> dict[str, list[dict[str, float]]]:
        return self._server_turns

    def _start_actors(self, endpoints: list[Endpoint], where: store.StoreAt) -> list[list[Any]]:
        """`actors` new actors per endpoint, placed round-robin over the nodes that reach the
        store (they start in the background: a call waits for the endpoint to be up)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray_init(self.address)
        nodes = _nodes_for(where)
        count = self.actor_count(where)
        if not nodes:
            raise UsageError("no Ray node on this machine can reach the runs directory")
        remote = ray.remote(RunDriver)

        def start(endpoint: Endpoint, k: int) -> Any:
            # No CPU reserved, so the actors of several endpoints live side by side; a local
            # model's llama.cpp server gets its share of the cores as threads instead.
            local = endpoint.kind == "local"
            if local and endpoint.n_threads is None:
                endpoint = endpoint.model_copy(update={"n_threads": max(1, physical_cores() // count)})
            return remote.options(
                num_cpus=0, max_restarts=self.max_restarts,
                scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[k % len(nodes)], soft=False),
            ).remote(endpoint, 1 if local else self.concurrency or SCRIPTED_CONCURRENCY)

        return [[start(endpoint, b * count + i) for i in range(count)] for b, endpoint in enumerate(endpoints)]

    def actor_count(self, where: store.StoreAt) -> int:
        """Actors per endpoint: `actors`, else 2 per node that reaches the store."""
        return self.actors or max(2, 2 * len(_nodes_for(where)))

    def start(self, endpoints: list[Endpoint], where: store.StoreAt) -> None:
        """Start the actors of `endpoints` now and wait until each has its endpoint up (a local
        model loaded); the drives that follow use them at once, and `close()` stops them.

        Raises:
            RunnerError: an endpoint did not start.
        """
        import ray

        fresh = [e for e in dict.fromkeys(endpoints) if e not in self._pool]
        for endpoint, actors in zip(fresh, self._start_actors(fresh, where)):
            self._pool[endpoint] = actors
        try:
            ray.get([a.ready.remote() for e in fresh for a in self._pool[e]])
        except ray.exceptions.RayError as exc:
            raise _ray_failure(exc) from None

    def close(self) -> None:
        """Stop the actors `start` started."""
        pooled, self._pool = list(self._pool.values()), {}
        _stop(pooled, graceful=True)

    def drive(self, batches: list[Batch], where: store.StoreAt, on_done: OnDone) -> list[tuple[RunState, str]]:
        import ray

        fresh = [b.endpoint for b in batches if b.endpoint not in self._pool]
        started = iter(self._start_actors(list(dict.fromkeys(fresh)), where) if fresh else [])
        made = {e: next(started) for e in dict.fromkeys(fresh)}
        self.handles = [self._pool.get(b.endpoint) or made[b.endpoint] for b in batches]
        self.assigned = {run_id: actors[i % len(actors)]
                         for batch, actors in zip(batches, self.handles) for i, run_id in enumerate(batch.run_ids)}
        done: dict[str, tuple[RunState, str]] = {}
        try:
            with _stop_signals_interrupt():
                self._collect(where, on_done, done)
        except KeyboardInterrupt:
            # Runs being driven stay `running` in the store: `runner resume ID` continues them.
            self._cancelled = True
        except ray.exceptions.RayError as exc:  # an actor failed to start, or kept dying
            self._cancelled = True
            raise _ray_failure(exc) from None
        finally:
            if not self._cancelled:  # only an actor that started a local server has turns to give
                for batch, actors in zip(batches, self.handles):
                    local = batch.endpoint.kind == "local"
                    per_actor = ray.get([a.server_turns.remote() for a in actors]) if local else []
                    self._server_turns[batch.endpoint.label] = [t for turns in per_actor for t in turns]
            if self._cancelled:  # every actor at once: queued drives would otherwise run first
                pooled, self._pool = list(self._pool.values()), {}
                _stop(pooled, graceful=False)
            _stop(list(made.values()), graceful=not self._cancelled)
        return [done[r] for b in batches for r in b.run_ids if r in done]

    def _collect(self, where: store.StoreAt, on_done: OnDone, done: dict[str, tuple[RunState, str]]) -> None:
        """Send each actor its runs of `assigned` in one streaming call (`RunDriver.drive`) and
        record each run in `done` (and `on_done`) as it stops. A call whose actor died is sent
        again, with the runs not yet reported, to the restarted actor, at most
        `max_task_retries` times per actor: each resumes its runs from the store (a stopped
        run is returned as saved). Ray's own retry is off for these calls: it would replay the
        stream and expect the same replies in the same order.

        Raises:
            RayError: an actor raised, or died once too often.
        """
        import ray

        per_actor: dict[Any, list[str]] = {}
        for run_id, actor in self.assigned.items():
            per_actor.setdefault(actor, []).append(run_id)
        retries = dict.fromkeys(per_actor, self.max_task_retries)
        streams: dict[Any, tuple[Any, list[str]]] = {  # ObjectRefGenerator -> (actor, its runs)
            actor.drive.options(max_task_retries=0).remote(run_ids, where): (actor, run_ids)
            for actor, run_ids in per_actor.items()}
        while streams:
            ready, _ = ray.wait(list(streams), num_returns=1)
            stream: Any = ready[0]
            try:
                stopped = ray.get(next(stream))
            except StopIteration:
                del streams[stream]
                continue
            except ray.exceptions.RayActorError:
                actor, run_ids = streams.pop(stream)
                if retries[actor] == 0:
                    raise
                retries[actor] -= 1
                left = [run_id for run_id in run_ids if run_id not in done]
                streams[actor.drive.options(max_task_retries=0).remote(left, where)] = actor, left
                continue
            for text, driven_at in stopped:
                state = RunState.model_validate_json(text)
                done[state.run_id] = state, driven_at
                on_done(state, driven_at)


SCRIPTED_CONCURRENCY = 4
"""Runs one actor drives at a time on an endpoint that is not a local model."""

REPORT_S = 0.05
"""Shortest time between two replies of one actor's drive, seconds (see `RunDriver.drive`)."""


def _stop(handles: list[list[Any]], graceful: bool) -> None:
    """Stop actors: after the last run, each stops its endpoint first; on a cancel they are
    killed at once, which leaves the runs they were driving saved and resumable, as any
    crash does."""
    import ray

    if graceful:
        with contextlib.suppress(Exception):
            ray.get([a.stop.remote() for actors in handles for a in actors], timeout=30)
    for actors in handles:
        for a in actors:
            ray.kill(a, no_restart=True)


def _ray_failure(exc: Exception) -> Exception:
    """What to raise for a failed drive: a `RunnerError` raised inside an actor (say, its
    llama.cpp server did not start) as itself; anything else as a `ServiceError` naming it."""
    cause: BaseException = exc
    while isinstance(getattr(cause, "cause", None), BaseException):
        cause = cause.cause  # type: ignore[attr-defined]
    if isinstance(cause, RunnerError):
        return cause
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return ServiceError(f"a Ray actor failed: {lines[-1] if lines else type(exc).__name__}")


def executor(name: str, *, address: str | None = None, actors: int | None = None) -> Executor:
    """The executor called `name` ("local" or "ray").

    Raises:
        UsageError: an unknown name, `address` or `actors` for "local", or "ray" when Ray is not
            installed (`pip install runner[ray]`).
    """
    if name == "local" and (address or actors):
        raise UsageError("--address and --actors need --executor ray")
    if name == "local":
        return LocalExecutor()
    if name != "ray":
        raise UsageError(f"--executor must be local or ray, not {name!r}")
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UsageError("--executor ray needs Ray: pip install 'runner[ray]'") from None
    return RayExecutor(address=address, actors=actors)
