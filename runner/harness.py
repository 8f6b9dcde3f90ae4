"""Putting a run together: the store and the run's lease, the tool catalog, the workspace,
the client, child runs and operator verdicts. `execute` is what the CLI, workers, the suite and the
experiments call; `loop.run` stays free of all this wiring.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from runner import loop
from runner.cancel import CancelToken
from runner.errors import UsageError
from runner.state import RunState, pending

if TYPE_CHECKING:
    import httpx

    from runner.client import ChatClient, RetryCallback
    from runner.mcp import Servers
    from runner.result import RunResult
    from runner.store import Lease, RunHandle, RunStore
    from runner.streaming import TurnProgress
    from runner.tools import Tool, Workspace
    from runner.trace import _Event

# The catalog, the client, the config, the endpoints, the result, the store, the tools, the trace,
# shutil and tempfile are imported where they are used: `from runner import execute` loads little
# more than the loop.

__all__ = ["drive", "execute", "workspace_folder", "workspace_template"]


def workspace_template() -> Path:
    """The checked-in three-file workspace the tools work over (copied per run)."""
    from runner.resources import tasks_dir

    return tasks_dir() / "workspace"


def warm_up() -> None:
    """Import and build now what `drive` imports and builds lazily on a process's first run
    (httpx, the tools and their schemas, the client, runner's pydantic models; ~90 ms): a
    long-lived driver (a Ray actor) then drives its first run about as fast as any other."""
    import httpx  # noqa: F401
    from pydantic import BaseModel

    from runner import catalog, client, config, endpoints, research, resources, result, store, tools, trace  # noqa: F401

    models: list[type[BaseModel]] = [BaseModel]
    while models:
        model = models.pop()
        models += model.__subclasses__()
        if model.__module__.startswith("runner."):
            model.model_rebuild(raise_errors=False)
    for tool in (*catalog.SIMPLE.values(), *catalog.FOLDER.values()):
        tool().schema()


async def drive(
    state: RunState, base_url: str | None, runs: Path | RunStore | None, *, cancel: CancelToken | None = None,
    on_progress: Callable[[str, str], None] | None = None, server_settings: dict[str, Any] | None = None,
    on_turn: Callable[[TurnProgress], None] | None = None, lease: Lease | None = None,
    http: httpx.AsyncClient | None = None, tools: Sequence[Tool | str] | None = None, api_key: str | None = None,
    on_retry: RetryCallback | None = None, on_note: Callable[[str], None] | None = None,
) -> RunState:
    """Run (or resume) `state` against `base_url`, committing every transition to `runs`;
    returns it stopped (`execute` returns its `RunResult`).

    Args:
        base_url: the opened endpoint (see `runner.endpoints.open_endpoint`); None opens the
            run's own `config.endpoint` here and stops what it started at the stop.
        runs: a store, a runs directory (a FileStore), or None to keep the run in memory
            (tools then work in a temporary copy of the workspace, removed afterwards).
        lease: the run's lease if the caller claimed it already (released by the caller);
            else the run is claimed here (created if the store does not have it) and
            released at the stop.
        http: an `httpx.AsyncClient` shared by the runs this process drives (see
            `runner.client.new_http_client`), left open; None: one for this run alone.
        tools: your own tool objects and built-in names. For a new run (never saved) they
            are the catalog it offers (recorded by name, with where each object can be
            imported again); for a saved run they supply the objects its recorded names need.
            None: the config's tools.
        api_key: the key sent as `Authorization: Bearer`; None: read from the environment
            variable the run recorded (`config.endpoint.api_key_env`; not set here: the run
            stops `interrupted` before asking), else $RUNNER_API_KEY, $OPENAI_API_KEY, else
            "sk-local" (`runner.config.key_for`). Never saved or traced.
        on_retry: called before each back-off of a failed request (see `ChatClient`);
            server_settings: what the endpoint runs with, for `run_started`; on_note: told of each
            MCP tool that cannot be offered.

    Raises:
        UnknownTool: a tool the run names cannot be found (UsageError: two share a name);
            raised before the run is created or claimed: a failed start leaves nothing stored.
            ToolsChanged (a UsageError): a resumed run called an MCP tool now gone or changed.
        RunBusy: another process drives the run. StaleState: `state` is behind the stored one.
        LeaseLost: another driver took the run over (its lease expired).
    """
    from runner.endpoints import open_endpoint
    from runner.store import FileStore
    from runner.trace import Tracer

    catalog_tools = _offered(with_opening(state), tools)
    with contextlib.ExitStack() as cleanup:
        store = FileStore(runs) if isinstance(runs, Path) else runs
        cancel = cancel or CancelToken()
        handle, workspace = _placed(state, store, lease, cancel, cleanup)
        if base_url is None:  # open the run's own endpoint for this run alone
            opened = cleanup.enter_context(open_endpoint(state.config.endpoint))
            base_url, server_settings = opened.base_url, server_settings or opened.server_settings
        async with _client(state, base_url, http, api_key, on_retry) as client, contextlib.AsyncExitStack() as stack:
            if (servers := await _mcp_opened(state, tools, handle, stack, on_note, cancel, workspace)) and servers.failed:
                return state  # an MCP server did not start: the run is saved interrupted, resumable
            rt = loop.Runtime(
                client=client, tools=servers.catalog if servers else catalog_tools, workspace=workspace, run=handle,
                cancel=cancel, on_progress=on_progress, tracer=handle.tracer() if handle else Tracer(None),
                run_child=_child_driver(store, client, workspace, on_progress), server_settings=server_settings,
                on_turn=on_turn)
            return await loop.run(state, _bound(rt, servers))


def _bound(rt: loop.Runtime, servers: Servers | None) -> loop.Runtime:
    """`rt`, with the MCP servers' events (if any) traced with the run's next transition each."""
    if servers is not None:
        servers.bind(rt.defer)
    return rt


async def _mcp_opened(state: RunState, tools: Sequence[Tool | str] | None, handle: RunHandle | None,
                      stack: contextlib.AsyncExitStack, on_note: Callable[[str], None] | None,
                      cancel: CancelToken, workspace: Workspace) -> Servers | None:
    """The run's MCP servers (`config.mcp`; None if it names none) started (closed when `stack`
    closes), their tools listed and the run's whole catalog built (`Servers.catalog`); a server
    that does not start, or the Stop signal while they start, stops the run `interrupted`
    (saved, resumable; `Servers.failed`), and the caller drives nothing.

    Raises:
        ToolsChanged: a tool the run called is gone or defined differently now.
    """
    if not state.config.mcp:
        return None
    from runner import catalog
    from runner.cancel import Cancelled, race
    from runner.mcp import McpStartError, McpTool, Servers
    from runner.state import CancelledInterruption, ToolServerInterruption
    from runner.trace import RunStopped

    servers = await stack.enter_async_context(Servers(state, lambda: workspace.for_tool(McpTool())))
    try:
        await race(servers.open(), cancel)
    except (McpStartError, Cancelled) as exc:
        state.status, state.reason = "interrupted", str(exc)
        state.interruption = (ToolServerInterruption(server=exc.server, message=exc.why)
                              if isinstance(exc, McpStartError) else CancelledInterruption(reason=exc.reason))
        if isinstance(exc, Cancelled):
            state.reason = f"cancelled: {exc.reason} while the MCP servers started"
        stopped = RunStopped(runId=state.run_id, status=state.status, reason=state.reason, turns=state.turns,
                             costUsd=state.cost_usd)
        if handle is not None:
            handle.commit(state, [*servers.waiting, stopped])
        servers.failed = True
        return servers
    servers.catalog = catalog.build(state.config, [t for t in tools or [] if not isinstance(t, str)], servers.tools)
    for warning in servers.warnings:
        if on_note is not None:
            on_note(f"warning: {warning}")
    return servers


def _offered(state: RunState, tools: Sequence[Tool | str] | None) -> list[Tool]:
    """The run's tool objects; for a new run, `tools` are first recorded as the catalog it offers."""
    from runner import catalog

    given = [t for t in tools or [] if not isinstance(t, str)]
    if tools is not None and state.seq == 0:
        catalog.offer(state.config, tools)
    return catalog.build(state.config, given)


def _client(state: RunState, base_url: str, http: httpx.AsyncClient | None, api_key: str | None,
            on_retry: RetryCallback | None) -> ChatClient:
    """The run's chat client: its endpoint's timeout and retries, the key `drive` describes."""
    from runner.client import ChatClient
    from runner.config import key_for

    endpoint = state.config.endpoint
    key = key_for(endpoint.api_key_env, api_key, given=endpoint.api_key_given)
    return ChatClient(base_url, timeout_s=endpoint.timeout_s, max_retries=endpoint.max_retries, http=http,
                      api_key=key, on_retry=on_retry, key_missing=None if key else _key_missing(state))


def _key_missing(state: RunState) -> str:
    """Why the run's key is not at hand here, in words (see `runner.config.key_for`)."""
    endpoint = state.config.endpoint
    if endpoint.api_key_env:
        return f"the API key variable {endpoint.api_key_env} is not set here"
    return "the run was given its API key with --api-key, and none is given now"


def _placed(state: RunState, store: RunStore | None, lease: Lease | None, cancel: CancelToken,
            cleanup: contextlib.ExitStack) -> tuple[RunHandle | None, Workspace]:
    """Where the run lives and works: its handle in the store (claimed, or created, under
    `lease`) and its workspace there; in memory, no handle and a temporary copy of the
    workspace, removed by `cleanup`. With sandbox "none" the tools work on the folder itself
    and keep their ledger in the run's own folder (in memory: a temporary one).

    Raises:
        UsageError: the recorded folder is gone and the run has no copy of it (a resume
            says so before it claims the run).
    """
    from runner.tools import Workspace

    if store is None:
        template = workspace_folder(state)
        scratch = _scratch(cleanup)
        if state.config.sandbox == "none":
            return None, Workspace(template, ledger=scratch() / LEDGER_FILE)

        def scratch_copy() -> Path:
            import shutil

            return Path(shutil.copytree(template, scratch() / "workspace", symlinks=True))

        return None, Workspace(template, scratch_copy)
    handle, _ = _claimed(store, state, lease, cancel, cleanup)
    _drop_unrecorded_approvals(state, store)
    held, run_id = handle.lease, state.run_id
    if state.config.sandbox == "none":
        own = store.own_folder(run_id) or _scratch(cleanup)()
        return handle, Workspace(workspace_folder(state), ledger=own / LEDGER_FILE)
    existing = store.existing_workspace(run_id, held)
    template = workspace_folder(state) if existing is None else _recorded_folder(state)
    return handle, Workspace(template, lambda: store.workspace(run_id, template, held), existing)


def with_opening(state: RunState) -> RunState:
    """`state`; a new run, never saved, with what its steering policies add before its first turn."""
    if state.seq == 0 and state.turns == 0 and state.config.steering:
        from runner import steering

        steering.opening(state, workspace_folder(state))
    return state


LEDGER_FILE = "ledger.jsonl"
"""The write tools' ledger in the run's own folder (sandbox "none"; see `runner.tools.Ledger`)."""


def _scratch(cleanup: contextlib.ExitStack) -> Callable[[], Path]:
    """A temporary folder of the run's own, made on first use and removed by `cleanup`."""
    made: list[Path] = []

    def folder() -> Path:
        if not made:
            import tempfile

            made.append(Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="runner-"))))
        return made[0]

    return folder


def _recorded_folder(state: RunState) -> Path:
    return Path(state.config.workspace) if state.config.workspace else workspace_template()


def workspace_folder(state: RunState) -> Path:
    """The folder `state`'s tools work over (`RunConfig.workspace`, else the packaged one).

    Raises:
        UsageError: the run's recorded folder is gone (or is not a folder), and the run has
            no copy of its own to work in instead.
    """
    folder = _recorded_folder(state)
    if state.config.workspace and not folder.is_dir():
        raise UsageError(f"run {state.run_id} works on {folder}, which is {'not a folder' if folder.exists() else 'gone'}"
                         "; give --workspace DIR with where it is now")
    return folder


def _child_driver(store: RunStore | None, client: ChatClient, workspace: Workspace,
                  on_progress: Callable[[str, str], None] | None) -> Callable[[RunState, CancelToken], Any]:
    """What drives a child run (the research tool's): it shares the client and workspace,
    and is a run of its own in the store, resumed (not restarted) if it already exists."""

    async def run_child(child: RunState, child_cancel: CancelToken) -> RunState:
        from runner import catalog
        from runner.trace import Tracer

        with contextlib.ExitStack() as child_cleanup:
            child_handle = None
            if store is not None:
                child_handle, created = _claimed(store, child, None, child_cancel, child_cleanup)
                if not created:
                    child = store.load(child.run_id)
            return await loop.run(child, loop.Runtime(
                client=client, tools=catalog.build(child.config), workspace=workspace,
                run=child_handle, cancel=child_cancel, on_progress=on_progress,
                tracer=child_handle.tracer() if child_handle else Tracer(None), run_child=run_child))

    return run_child


async def execute(state: RunState, base_url: str | None = None, runs: Path | RunStore | None = None,
                  **options: Any) -> RunResult:
    """Run (or resume) `state` to its stop and return what it came to (see `drive` for the
    arguments; with no `base_url`, the run's own endpoint is opened and stopped here)."""
    from runner.result import RunResult

    return RunResult.of(await drive(state, base_url, runs, **options))


def _claimed(store: RunStore, state: RunState, lease: Lease | None, cancel: CancelToken,
             cleanup: contextlib.ExitStack) -> tuple[RunHandle, bool]:
    """The run's handle under `lease`, or under a new claim (creating the run if the store
    has none) released when `cleanup` closes; and whether it was created here. Losing the
    lease cancels the run."""
    from runner.store import RunNotFound, StaleState, default_owner

    created = False
    if lease is None:
        if state.seq == 0:  # never stored: create it (one round trip), else claim the stored one
            try:
                lease, created = store.create(state, owner=default_owner()), True
            except StaleState:
                lease = store.claim(state.run_id)
        else:
            try:
                lease = store.claim(state.run_id)
            except RunNotFound:
                lease, created = store.create(state, owner=default_owner()), True
        assert lease is not None
        cleanup.callback(store.release, lease)
    lease.on_lost = lambda: cancel.cancel("another worker took the run over (lease lost)")
    return store.handle(lease), created


def _drop_unrecorded_approvals(state: RunState, store: RunStore) -> None:
    """An approval counts only if the trace holds the operator's `verdict` event for that
    call and those arguments; any other (an edited state file) is dropped, so the call stops
    for approval again."""
    if not state.approved:
        return
    recorded = {(e.callId, e.signature) for e in store.read_trace(state.run_id)
                if e.type == "verdict" and e.verdict == "approve"}
    for call_id, signature in list(state.approved.items()):
        if (call_id, signature) not in recorded:
            del state.approved[call_id]


def give_verdict(store: RunStore, lease: Lease, state: RunState, call_id: str, verdict: str,
                 reason: str = "", *, empty: bool = False) -> None:
    """Approve or reject one pending call and commit it with its operator event (`verdict`:
    which call, which arguments, when, by whom) in one save.

    Args:
        verdict: "approve" or "reject".
        empty: demonstration only; a rejection with an empty tool result.

    Raises:
        ValueError: `call_id` is not a pending call of the run.
    """
    from runner.state import call_signature, pending
    from runner.trace import ToolResult, ToolSkipped, Verdict

    call = next((c for c in pending(state) if c.id == call_id), None)
    if verdict == "approve":
        loop.approve(state, call_id)
    else:
        loop.reject(state, call_id, reason, empty=empty)
    assert call is not None
    events: list[_Event] = [Verdict(
        runId=state.run_id, verdict="approve" if verdict == "approve" else "reject", callId=call.id,
        toolName=call.function.name, args=call.function.arguments,
        signature=call_signature(call.function.name, call.function.arguments), by=lease.owner,
        reason=reason or None)]
    if verdict != "approve":
        record = state.tool_runs[-1]
        events.append(ToolSkipped(runId=state.run_id, toolName=record.tool_name, callId=call.id,
                                  args=call.function.arguments, reason="rejected", detail=record.error))
        events.append(ToolResult(runId=state.run_id, toolName=record.tool_name, callId=call.id, ms=0,
                                 ok=False, source="rejected", error=record.error))
    store.save(state, events, lease)


@dataclass(frozen=True)
class Reopening:
    """What a resume asks for before the run continues: a verdict on its pending call, new
    limits, the scripted provider's latency, another base URL, or `force` (continue from an
    older copy)."""

    approve: str | None = None
    """A pending call id to approve."""
    reject: str | None = None
    """A pending call id to reject, with `reason` (the model reads it)."""
    reason: str = ""
    empty_rejection: bool = False
    """Demonstration only: reject with an empty tool result."""
    max_turns: int | None = None
    """A new turn cap (0: no cap); None keeps the recorded one."""
    max_budget_usd: float | None = None
    """A new budget, USD (0: no budget); None keeps the recorded one."""
    latency_ms: float | None = None
    base_url: str | None = None
    """Another endpoint for a run started against one (its provider came back elsewhere), or
    for a scripted run, a scripted provider serving there."""
    force: bool = False
    queued: bool = False
    """The run goes to a worker next; else it is driven here, and the key it sends (`api_key`,
    else the variable it names, see `runner.config.key_for`) must be at hand."""
    api_key: str | None = None
    tool_refs: dict[str, str] = field(default_factory=dict)
    """Where tools of the run's own are found now (`--tool` on resume), by name: recorded."""
    max_tokens_total: int | None = None
    """A new token budget (0: none); None keeps the recorded one."""
    max_wall_s: float | None = None
    """A new time budget, seconds (0: none); None keeps the recorded one."""
    workspace: str | None = None
    """Where the run's folder is now (an absolute path): recorded."""
    sandbox: str | None = None
    """Another sandbox ("copy" or "none") for a run that has no copy of its own yet."""

    @property
    def changes_config(self) -> bool:
        return (self.max_turns is not None or self.max_budget_usd is not None or self.latency_ms is not None
                or self.base_url is not None or bool(self.tool_refs) or self.max_tokens_total is not None
                or self.max_wall_s is not None or self.workspace is not None or self.sandbox is not None)


def reopen(store: RunStore, run_id: str, asked: Reopening,
           tools: Sequence[Tool] = ()) -> tuple[RunState, Lease]:
    """Claim a stopped run and apply `asked` to it (committed), ready to be driven again under
    the returned lease (the caller drives or releases it). `tools`: the tool objects the run
    will be driven with, checked against the ones it recorded before anything changes.

    Raises:
        UsageError: both a verdict and its opposite, a reason without a rejection, a final run,
            a resume that would stop again at once on the limit that stopped it, or a run that
            waits for a verdict none was given for; a tool the run offers that cannot be found,
            or, driven here next, the key it sends.
        RunBusy: another process drives the run.
    """
    if asked.approve and asked.reject:
        raise UsageError("give --approve or --reject, not both")
    if asked.reason and not asked.reject:
        raise UsageError("--reason goes with --reject CALL_ID")
    _check_reopening(store.load(run_id, force=asked.force), asked, tools, store)  # refused: the run is left untouched
    lease = store.claim(run_id)  # one driver at a time: a second one stops here
    try:
        state = store.load(run_id, force=asked.force)
        _check_reopening(state, asked, tools, store)  # again: it may have moved on meanwhile
        if asked.force:
            store.save(state, (), lease, force=True)
        if asked.approve or asked.reject:  # saved with the new limits, if any
            give_verdict(store, lease, state, str(asked.approve or asked.reject),
                         "approve" if asked.approve else "reject", asked.reason, empty=asked.empty_rejection)
        elif asked.changes_config and not asked.force:
            store.save(state, (), lease)
    except BaseException:
        store.release(lease)
        raise
    return state, lease


def _check_reopening(state: RunState, asked: Reopening, tools: Sequence[Tool], store: RunStore) -> None:
    """Apply `asked`'s limits, endpoint and folder to `state`; UsageError if the run cannot be
    reopened so (see `reopen`)."""
    from runner import catalog
    from runner.config import key_for

    run_id = state.run_id
    if state.status in ("completed", "failed"):
        said = "failed" if state.status == "failed" else "is completed"
        raise UsageError(f"run {run_id} {said}; there is nothing to resume")
    _apply_limits(state, asked)
    _apply_folder(state, asked, store)
    if asked.force and state.config.mcp:
        from runner.mcp import forget_listings

        forget_listings(state)  # the tools as the servers list them now: no change refuses the resume
    catalog.check_supplied(state.config, tools)
    state.config.tool_refs.update(asked.tool_refs)  # a tool of the run's own that moved: found there from now on
    catalog.build(state.config, tools)  # a tool that cannot be found: one line, nothing changed
    endpoint = state.config.endpoint
    if asked.queued and (asked.api_key or endpoint.api_key_given):
        raise UsageError(f"run {run_id}: a key given with --api-key is never saved, so no worker could send it; "
                         "resume it here (without --detach) with --api-key")
    if not asked.queued and key_for(endpoint.api_key_env, asked.api_key, given=endpoint.api_key_given) is None:
        raise UsageError(f"run {run_id}: {_key_missing(state)}: " + (
            f"set ${endpoint.api_key_env}, or give --api-key" if endpoint.api_key_env else "give --api-key KEY"))
    if asked.approve or asked.reject:
        loop.verdict_call(state, str(asked.approve or asked.reject))
    it = state.interruption
    if (it is not None and it.type == "approval" and not (asked.approve or asked.reject) and not asked.force
            and it.call_id not in state.approved and any(c.id == it.call_id for c in pending(state))):
        raise UsageError(f"run {run_id} waits for a verdict on {it.tool_name} (call {it.call_id}); "
                         f"give --approve {it.call_id} or --reject {it.call_id} --reason TEXT")


def _apply_folder(state: RunState, asked: Reopening, store: RunStore) -> None:
    """Record where the run's folder is now and how it works on it, as asked; a run whose
    folder is gone (and that has no copy of its own to work in) is refused in one line."""
    if asked.workspace is not None:
        state.config.workspace = asked.workspace
    changing = asked.sandbox is not None and asked.sandbox != state.config.sandbox
    gone = bool(state.config.workspace) and not Path(str(state.config.workspace)).is_dir()
    copy = (store.existing_workspace(state.run_id) if state.config.sandbox == "copy" and (changing or gone)
            else None)  # looked for only when it matters (a database store fetches its files)
    if changing:
        if copy is not None:
            raise UsageError(f"run {state.run_id} already works on its own copy ({copy}); --sandbox "
                             f"{asked.sandbox} would leave what it wrote there behind")
        state.config.sandbox = asked.sandbox  # type: ignore[assignment]
    if copy is None:
        workspace_folder(state)


def _apply_limits(state: RunState, asked: Reopening) -> None:
    """Raise the run's limits and change its endpoint as asked; a resume that would stop again
    at once on the limit that stopped it is a usage error."""
    limits = state.config.limits
    if asked.max_turns is not None:
        limits.max_turns = asked.max_turns or None
    if asked.max_budget_usd is not None:
        limits.max_budget_usd = asked.max_budget_usd or None
    if asked.max_tokens_total is not None:
        limits.max_tokens_total = asked.max_tokens_total or None
    if asked.max_wall_s is not None:
        limits.max_wall_s = asked.max_wall_s or None
    if asked.latency_ms is not None and state.config.endpoint.kind == "scripted":
        state.config.endpoint = state.config.endpoint.model_copy(update={"latency_ms": asked.latency_ms})
    if asked.base_url is not None:
        endpoint = state.config.endpoint
        if endpoint.kind == "local":  # another server may serve another model under the name
            raise UsageError(f"run {state.run_id} was not started against a base URL (runner serves its local "
                             "model itself): --base-url has nothing to replace")
        from runner.endpoints import checked_base_url

        state.config.endpoint = state.config.endpoint.model_copy(update={"base_url": checked_base_url(asked.base_url)})
    if state.status not in ("max_turns_exceeded", "budget_exceeded"):
        return  # a limit is checked before the next model request: a run stopped on one asks next
    if limits.max_turns is not None and state.turns >= limits.max_turns:
        raise UsageError(f"run {state.run_id} has made {state.turns} turns, so a turn cap of {limits.max_turns} stops "
                         f"it again at once; give --max-turns larger than {state.turns} (0: no cap)")
    spent_tokens = state.prompt_tokens + state.completion_tokens
    if limits.max_tokens_total is not None and spent_tokens >= limits.max_tokens_total:
        raise UsageError(f"run {state.run_id} has spent {spent_tokens:,} tokens; give --max-tokens-total larger than "
                         "that (0: no cap)")
    if limits.max_wall_s is not None and state.wall_ms >= limits.max_wall_s * 1000:
        raise UsageError(f"run {state.run_id} has run {state.wall_ms / 1000:.1f} s; give --max-wall-s larger than "
                         "that (0: no cap)")
    if limits.max_budget_usd is not None and state.cost_usd >= limits.max_budget_usd:
        raise UsageError(f"run {state.run_id} has spent ${state.cost_usd:.6f}; give --max-budget larger than that "
                         "(0: no budget)")
    it = state.interruption
    if (it is not None and it.type == "max_budget" and it.needs_usd and limits.cap_max_tokens
            and limits.max_budget_usd is not None and limits.max_budget_usd < it.needs_usd):
        raise UsageError(f"run {state.run_id} has spent ${state.cost_usd:.6f} and its next turn needs a budget of "
                         f"${it.needs_usd:.6f} (its prompt and a reply as long as the run's longest); give "
                         "--max-budget at least that")
    if (it is not None and it.type == "max_budget" and it.needs_tokens and limits.cap_max_tokens
            and limits.max_tokens_total is not None and limits.max_tokens_total < it.needs_tokens):
        raise UsageError(f"run {state.run_id} has spent {spent_tokens:,} tokens and its next turn needs a budget of "
                         f"{it.needs_tokens:,} (its prompt and a reply as long as the run's longest); give "
                         "--max-tokens-total at least that")
