"""Starting and continuing runs from what a person asked for: a `RunRequest` (the options of
`runner run`) checked and resolved against the config files and the environment into a new
`RunState`, then queued or driven here (`launch`); a `ResumeRequest` applied to a stopped run,
then queued or driven here (`resume`).

`prepare` decides the endpoint (a scenario's scripted provider, a base URL, or a local model
runner serves itself), reads the prompt (an argument, a file, or stdin), finds the API key and
the tools of one's own, and builds the `RunConfig`. Everything that can be wrong with a request
is raised here as a `UsageError`, before any run exists.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from runner import catalog, store
from runner.catalog import FOLDER_TOOLS
from runner.config import Key, Settings
from runner.endpoints import checked_base_url
from runner.errors import EXIT_CODES, ModelNotFound, RunnerError, UnknownScenario, UsageError
from runner.harness import Reopening, reopen, with_opening
from runner.interactive import Feedback, StopSignals, drive_in_foreground
from runner.request import ResumeRequest, RunRequest
from runner.state import Endpoint, Limits, McpServer, RunConfig, RunState, new_run

if TYPE_CHECKING:
    from runner.tools import Tool


Watch = Callable[[str], AbstractContextManager[object]]
"""Called with a run's id for a context held while the run is driven here (e.g. a live
OpenTelemetry export of it)."""


@dataclass(frozen=True)
class LocalChoice:
    """A model runner serves itself: its name, what `Endpoint.local_model` records, the
    manifest's first-turn tool choice, the GGUF, and the manifest's harness defaults for it
    (`ModelEntry.harness_defaults`)."""

    name: str
    recorded: str
    tool_choice: Literal["auto", "required", "none"]
    path: Path
    harness: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Prepared:
    """A request made ready: the new run, the key in force, the tools of one's own, the local
    model it serves (None for a scripted or URL endpoint), and how to start it."""

    state: RunState
    key: Key
    tools: list[Tool]
    local: LocalChoice | None
    detach: bool = False
    """Queue the run for a worker instead of driving it here."""
    faults: str | None = None
    """The scripted provider's faults (``KIND@TURN,...``), for a provider started here."""
    keep: bool = False
    """Keep the run even if it never gets a reply from its endpoint."""
    note: str | None = None
    """Something to tell the person starting the run before it starts."""


@dataclass(frozen=True)
class Started:
    """What `launch` or `resume` came to: the run at its stop (or as queued), whether it was
    queued for a worker, and whether it was kept (a new run that never got a reply is not)."""

    state: RunState
    queued: bool = False
    kept: bool = True

    @property
    def exit_code(self) -> int:
        """0 for a queued run, 1 for a run not kept, else the run's own (`EXIT_CODES`)."""
        return 0 if self.queued else EXIT_CODES[self.state.status] if self.kept else 1


DEMO_FOLDER_NOTE = ("the scripted provider answers for the packaged demo folder: this run works on a copy of it, "
                    "not on the current folder (--workspace DIR for another)")
OTHER_FOLDER_NOTE = ("the scripted provider answers for the packaged demo folder: on {folder} (a copy of it) its "
                     "replies may name files that are not there")


def prepare(req: RunRequest) -> Prepared:
    """Check `req` and build its run (not saved).

    Raises:
        UsageError: a bad or contradictory option, no prompt, no endpoint, a tool that cannot
            be found. UnknownScenario: no such scenario. ModelNotFound: a local model not on disk.
    """
    from runner.scripted import PROMPTS, SCENARIOS, parse_faults, scenario_name

    _check_choices(req)
    settings = Settings({"model": req.model, "api_key_env": req.api_key_env, "price_in_usd_per_mtok": req.price_in,
                         "price_out_usd_per_mtok": req.price_out, "max_turns": req.max_turns,
                         "max_budget_usd": req.max_budget_usd, "timeout_s": req.timeout_s,
                         "max_retries": req.max_retries, "tool_choice": req.tool_choice, "tools": req.tools or None,
                         "workspace": str(req.workspace) if req.workspace is not None else None})
    scenario = req.scenario
    if scenario is not None and scenario_name(scenario) not in SCENARIOS:
        shown = [s for s in SCENARIOS if s != "research_child"]  # the research tool's child, not a scenario to run
        raise UnknownScenario(f"unknown scenario {scenario!r}; known: {', '.join(shown)}")
    url, model, local = _endpoint_choice(req, settings)
    parse_faults(req.fault)
    name = scenario_name(scenario) if scenario else ""
    task = prompt_text(req.prompt, req.prompt_file) or PROMPTS.get(name) or _suite_prompt(name)
    if not task:
        raise UsageError("give a PROMPT (or - to read it from stdin, or --prompt-file PATH)")
    # runner's own scripted provider takes no key: a scenario run on it needs none
    key = settings.key(req.api_key) if url is not None or not scenario else Key(None, "none", None)
    own, refs = catalog.load_specs(settings.get("tools"))  # a missing tool stops here: no run is made
    servers = _mcp_servers(req, settings)
    served = local or (_served_elsewhere(str(model)) if url is not None and not scenario else None)
    endpoint = Endpoint(
        model=f"scripted/{name}" if scenario else (local.name if local else str(model)), base_url=url,
        local_model=local.recorded if local else None, latency_ms=req.latency_ms, api_key_env=key.env,
        api_key_given=key.source == "--api-key",
        first_turn_tool_choice=settings.get("tool_choice") or (served.tool_choice if served else "auto"),
        timeout_s=settings.get("timeout_s"), max_retries=settings.get("max_retries"))
    config = _config(req, settings, endpoint, name, served.harness if served else {})
    if req.policies:
        config = steered(config, req.policies, served.harness if served else {})
    _place(config, req, settings)
    if req.max_budget_usd and not config.priced:
        raise UsageError("--max-budget counts dollars, and this run costs $0 (a model on this machine is unpriced "
                         "unless --price-in/--price-out say otherwise): price it, or cap it with --max-tokens-total "
                         "or --max-wall-s")
    if req.no_builtin_tools and not own and not servers:
        raise UsageError("--no-builtin-tools leaves no tool: give --tool MODULE:ATTRIBUTE or --mcp NAME=COMMAND")
    if own or req.no_builtin_tools:
        builtin = [] if req.no_builtin_tools else config.tools
        catalog.offer(config, [*builtin, *own], refs)
    config.mcp = servers
    if req.detach:
        _check_detachable(servers)
    note = None
    if config.endpoint.scripted and not scenario:
        note = DEMO_FOLDER_NOTE if req.workspace is None else OTHER_FOLDER_NOTE.format(folder=config.workspace)
    return Prepared(with_opening(new_run(task, config)), key, own, local, req.detach, req.fault, req.keep, note)


def steered(config: RunConfig, edits: list[str], defaults: dict[str, Any]) -> RunConfig:
    """`config` with its steering policies changed by `--policy` values (`runner.steering.edited`).

    Raises:
        UsageError: a name that is no policy.
    """
    from runner import steering

    fields = steering.fields_for(steering.edited(steering.active(config), edits), defaults)
    own, at_endpoint = steering.split_fields(fields)
    return config.model_copy(update={**own, "endpoint": config.endpoint.model_copy(update=at_endpoint)})


def _place(config: RunConfig, req: RunRequest, settings: Settings) -> None:
    """Where the run's tools work, and on what: a demonstration (a scenario, or a prompt to
    the scripted provider, whose replies are written for the packaged workspace) works on a
    copy of the packaged workspace (or of --workspace DIR) with the demo tools; a question of
    one's own works on the folder itself (--workspace DIR, the config's workspace, else the
    current folder) with the folder tools, every write stopping for a verdict. --sandbox
    overrides either.

    Raises:
        UsageError: the folder does not exist or is not a folder.
    """
    demo = req.scenario is not None or config.endpoint.scripted
    given = req.workspace is not None or (not demo and settings.get("workspace"))
    if given:
        folder = Path(str(req.workspace if req.workspace is not None else settings.get("workspace"))).expanduser()
        if not folder.is_dir():
            raise UsageError(f"--workspace {folder}: {'not a folder' if folder.exists() else 'no such folder'}")
        config.workspace = str(folder.resolve())
    elif not demo:
        config.workspace = str(Path.cwd().resolve())
    if not demo:
        config.builtin_tools = "folder"
        config.tools = [*FOLDER_TOOLS, *(["research"] if req.research else [])]
    config.sandbox = req.sandbox or ("copy" if demo else "none")  # type: ignore[assignment]


def _mcp_servers(req: RunRequest, settings: Settings) -> list[McpServer]:
    """The MCP servers a new run offers (`runner.mcp.servers_for`: config file, --mcp-config, --mcp)."""
    table = settings.value("mcp")
    if not (req.mcp or req.mcp_config or req.mcp_tools or table.value):
        return []
    from runner import mcp

    return mcp.servers_for(req.mcp, req.mcp_config, req.mcp_tools, table.value, table.source)


def _check_detachable(servers: list[McpServer]) -> None:
    """A queued run's servers must start where a worker drives it: a header given as a value
    (a secret) is never saved, so no worker could send it."""
    for server in servers:
        literal = [key.partition(":")[2] for key in server.secrets() if key.startswith("header:")]
        if literal:
            raise UsageError(f"MCP server {server.name!r}: header {literal[0]} is given as a value, which is never "
                             "saved, so no worker could send it: write it as \"${VARIABLE}\" and set that variable "
                             "where the worker runs")


def _served_elsewhere(model: str) -> LocalChoice | None:
    """A model of the manifest served at a base URL (`runner serve` elsewhere, by its name or
    its GGUF's file stem): its runs get the manifest's harness settings, as on this machine."""
    from runner import models

    entry = models.entry_for(model, Path(model if model.endswith(".gguf") else f"{model}.gguf"))
    if entry is None:
        return None
    return LocalChoice(entry.name, entry.name, entry.first_turn_tool_choice, Path(entry.filename),
                       entry.harness_defaults())


def _check_choices(req: RunRequest) -> None:
    if req.sandbox is not None and req.sandbox not in ("copy", "none"):
        raise UsageError(f"--sandbox must be copy or none, got {req.sandbox!r}")
    if req.tool_errors not in ("text", "generic", "fatal"):
        raise UsageError("--tool-errors must be text, generic or fatal")
    if req.on_slip not in ("corrective", "repeat", "fail"):
        raise UsageError("--on-slip must be corrective, repeat or fail")
    if req.tool_choice is not None and req.tool_choice not in ("auto", "required", "none"):
        raise UsageError(f"--tool-choice must be auto, required or none, got {req.tool_choice!r}")
    if req.detach and req.api_key:
        raise UsageError("--api-key is never saved, so no worker could send it: with --detach, name the variable "
                         "that holds the key (--api-key-env NAME, set where the worker runs)")
    if req.detach and (req.latency_ms or req.fault):
        raise UsageError("--latency-ms and --fault configure a scripted provider started here; "
                         "they do not go with --detach")


def _endpoint_choice(req: RunRequest, settings: Settings) -> tuple[str | None, str | None, LocalChoice | None]:
    """(base URL, model name, local model) of the run; a scenario reaches a scripted provider:
    runner's own, or one serving at --base-url (only the option: a base URL from the
    environment or a config file is the user's provider, which a scenario never reaches)."""
    if req.scenario is None:
        if req.base_url is not None:
            settings.flags["base_url"] = req.base_url
        url = settings.get("base_url")
        model = settings.get("model")
    else:
        url = req.base_url
        model = req.model
    local = local_choice(model) if req.scenario is None and url is None and model else None
    if req.scenario is None and url is None and local is None:
        if model:
            raise UsageError(f"{model!r} is not a local model (runner models list); to send it to an endpoint, "
                             "give --base-url URL")
        if req.prompt is not None and not req.prompt.strip():
            raise UsageError("the PROMPT is empty")
        if req.prompt is None:
            raise UsageError("give a PROMPT (runner run \"Which file is the largest?\") or --scenario NAME (a "
                             "scripted run)")
        local = _pulled_default()
        if local is None:
            raise UsageError(_NO_ENDPOINT)
        model = local.name
    if req.scenario is not None and req.model:
        raise UsageError("--model goes with --base-url alone; a scenario names its own model")
    if req.scenario is None and not model:
        raise UsageError("--base-url needs --model")
    if (url is not None or local is not None) and (req.fault or req.latency_ms):
        raise UsageError("--fault and --latency-ms configure the scripted provider runner starts; with --base-url, "
                         "start that provider with `runner scripted serve --fault ...`")
    return None if url is None else checked_base_url(url), model, local


def _config(req: RunRequest, settings: Settings, endpoint: Endpoint, scenario: str,
            model_defaults: dict[str, Any]) -> RunConfig:
    fields: dict[str, Any] = {
        **model_defaults,
        "dedupe": req.dedupe, "dedupe_all": req.dedupe_all, "tool_errors": req.tool_errors,
        "permanent_errors": req.permanent_errors, "auto_approve_tools": list(req.auto_approve),
        "price_in_usd_per_mtok": settings.get("price_in_usd_per_mtok"),
        "price_out_usd_per_mtok": settings.get("price_out_usd_per_mtok"),
        "research_max_turns": req.research_max_turns, "research_max_budget_usd": req.research_max_budget_usd,
        "on_slip": req.on_slip,
    }
    if req.answer_after is not None or "answer_after_tool_turns" not in fields:
        fields["answer_after_tool_turns"] = req.answer_after
    limits = Limits(max_turns=settings.get("max_turns") or None, max_budget_usd=settings.get("max_budget_usd") or None,
                    max_tokens_total=req.max_tokens_total or None, max_wall_s=req.max_wall_s or None,
                    cap_max_tokens=req.cap_max_tokens, max_identical_failures=req.max_identical_failures)
    priced = {k: settings.get(k) for k in ("price_in_usd_per_mtok", "price_out_usd_per_mtok")
              if settings.value(k).source != "default"}  # unpriced: $0 on this machine (`RunConfig`)
    fields = {k: v for k, v in fields.items() if not k.startswith("price_")} | priced
    config = RunConfig(endpoint=endpoint, limits=limits, **fields)
    if req.research or scenario == "research":
        config.tools = [*config.tools, "research"]
    if scenario == "research":
        config.research_model = "scripted/research_child"
    return config


def prompt_text(prompt: str | None, prompt_file: Path | None) -> str | None:
    """The prompt: the argument, stdin for "-", or the file's text.

    Raises:
        UsageError: both an argument and --prompt-file, an unreadable file, or an empty stdin.
    """
    if prompt_file is not None:
        if prompt is not None:
            raise UsageError("give a PROMPT or --prompt-file, not both")
        try:
            text = prompt_file.read_text()
        except OSError as exc:
            raise UsageError(f"--prompt-file {prompt_file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise UsageError(f"--prompt-file {prompt_file}: not UTF-8 text ({exc.reason})") from None
        if not text.strip():
            raise UsageError(f"--prompt-file {prompt_file} is empty")
        return text
    if prompt == "-":
        text = sys.stdin.read()
        if not text.strip():
            raise UsageError("the prompt read from stdin is empty")
        return text
    if prompt is not None and not prompt.strip():
        raise UsageError("the PROMPT is empty")
    return prompt


def _suite_prompt(task_id: str) -> str | None:
    """The prompt of a suite task (the scripted scenarios named after suite tasks use it)."""
    from runner.suite import load_suite

    return next((t.prompt for t in load_suite().tasks if t.id == task_id), None)


_NO_ENDPOINT = ("give --model NAME (a local model: runner models list), --base-url URL --model NAME (an "
                "endpoint), or --scenario NAME (a scripted run)")


def default_model() -> str:
    """The model a PROMPT alone runs on (the manifest's default), as `config show` gives it."""
    from runner import models

    default = models.load_manifest().default
    return default if _pulled_default() is not None else f"{default} (not pulled)"


def _pulled_default() -> LocalChoice | None:
    """The manifest's default model when it is on disk (a PROMPT with no model runs on it), else
    None."""
    from runner import models

    try:
        return local_choice(models.load_manifest().default)
    except ModelNotFound:
        return None


def local_choice(model: str) -> LocalChoice | None:
    """The local model `model` names: a manifest name, a unique start of one ("smollm2"), or a
    .gguf path; None for anything else (a model name for a base URL).

    Raises:
        UsageError: a .gguf path that is not a file. ModelNotFound: a manifest model that is not
            on disk (the message says how to get it), or the start of several names.
    """
    from runner import models

    manifest = models.load_manifest()
    if model.endswith(".gguf"):
        path = Path(model).expanduser()
        if not path.is_file():
            raise UsageError(f"--model {model}: no such file")
        entry = models.entry_for(path.stem, path, manifest)
        return LocalChoice(path.stem, str(path.resolve()), entry.first_turn_tool_choice if entry else "auto", path,
                           entry.harness_defaults() if entry else {})
    name = models.manifest_name(model, manifest)
    if name not in [m.name for m in manifest.models]:
        return None
    entry = manifest.entry(name)
    return LocalChoice(name, name, entry.first_turn_tool_choice, models.resolve(name, manifest),
                       entry.harness_defaults())


def never_reached(state: RunState) -> bool:
    """A new run that got no reply from its endpoint: unreachable through every retry, or an
    answer that was not a chat-completions reply at all (nothing paid, nothing to resume)."""
    if state.turns or state.tool_runs or state.cost_usd:
        return False
    it = state.interruption
    if it is not None and it.type == "provider_unavailable":
        return True
    return state.status == "failed" and state.error is not None and state.error.type in (
        "auth", "not_found", "invalid_request", "bad_endpoint")


def _llama_note(state: RunState) -> str:
    """What a run on a local model says as it starts llama.cpp: the model, its first turn's
    tool choice (or, for a run that has made turns, the turn it continues at), and the GGUF
    file (by name, where a new run and a resume both find it)."""
    endpoint = state.config.endpoint
    recorded = endpoint.local_model or endpoint.model
    choice = None
    with contextlib.suppress(RunnerError):  # not on disk now: the start says so next
        choice = local_choice(recorded)
    file = choice.path.name if choice is not None else Path(recorded).name
    from runner import steering

    turn = (f"first turn tool_choice={steering.first_turn_choice(state)}" if not state.turns
            else f"continuing at turn {state.turns + 1}")
    return f"model: {endpoint.model}, {turn}\n  starting llama.cpp on {file} for this run"


def _unwatched(run_id: str) -> AbstractContextManager[object]:
    return contextlib.nullcontext()


def launch(prepared: Prepared, runs: store.RunStore, feedback: Feedback = Feedback(), *,
          on_runs_dir: Callable[[Path], None] | None = None, watch: Watch = _unwatched) -> Started:
    """Queue a prepared run for a worker (`detach`), or create it and drive it here to its stop
    (see `runner.interactive.drive_in_foreground`: Ctrl-C is the run's Stop signal from before
    it exists). A new run that never got a reply from its endpoint is deleted unless `keep`,
    and so is a runs directory made for it alone; `on_runs_dir` is called with one made here.
    """
    from runner.scripted import scripted_provider

    state, endpoint = prepared.state, prepared.state.config.endpoint
    made_dir = store.make_runs_dir(runs)
    if made_dir is not None and on_runs_dir is not None:
        on_runs_dir(made_dir)
    if prepared.detach:
        runs.create(state)
        return Started(state, queued=True)
    if prepared.note and feedback.on_note is not None:
        feedback.on_note(prepared.note)
    if prepared.local is not None and feedback.on_note is not None:
        feedback.on_note(_llama_note(state))
    provider = (scripted_provider(latency_ms=endpoint.latency_ms, faults=prepared.faults, in_process=True)
                if endpoint.kind == "scripted" else None)
    signals = StopSignals.install()  # before the run exists: a Ctrl-C from here on keeps it resumable
    lease = runs.create(state, owner=store.default_owner())
    assert lease is not None
    with watch(state.run_id):
        state = drive_in_foreground(state, runs, lease, signals, feedback, faults=prepared.faults, provider=provider,
                                    api_key=prepared.key.value, tools=prepared.tools)
    if prepared.keep or not never_reached(state):
        return Started(state)
    runs.delete(runs.claim(state.run_id))
    if made_dir is not None:
        store.unmake_runs_dir(runs, made_dir)
    return Started(state, kept=False)


def _resumed_folder(folder: Path | None) -> str | None:
    """--workspace on resume: where the run's folder is now, as an absolute path.

    Raises:
        UsageError: no such folder.
    """
    if folder is None:
        return None
    folder = folder.expanduser()
    if not folder.is_dir():
        raise UsageError(f"--workspace {folder}: {'not a folder' if folder.exists() else 'no such folder'}")
    return str(folder.resolve())


def resume(run_id: str, req: ResumeRequest, runs: store.RunStore, feedback: Feedback = Feedback(), *,
           watch: Watch = _unwatched) -> Started:
    """Apply `req` to a stopped run (a verdict, new limits; see `runner.harness.reopen`), then
    queue it for a worker (`detach`) or drive it here to its next stop.

    Raises:
        UsageError: as `reopen`, or a tool of the run's own that cannot be found.
        RunBusy: another process drives the run.
    """
    own, refs = catalog.load_specs(req.tools)
    signals = StopSignals.install() if not req.detach else None
    asked = Reopening(approve=req.approve, reject=req.reject, reason=req.reason,
                      empty_rejection=req.unsafe_empty_rejection, max_turns=req.max_turns,
                      max_budget_usd=req.max_budget_usd, latency_ms=req.latency_ms, base_url=req.base_url,
                      force=req.force, queued=req.detach, api_key=req.api_key,
                      tool_refs=refs, max_tokens_total=req.max_tokens_total, max_wall_s=req.max_wall_s,
                      workspace=_resumed_folder(req.workspace), sandbox=req.sandbox)
    state, lease = reopen(runs, run_id, asked, tools=own)
    if signals is None:
        runs.release(lease, runnable=True)
        return Started(state, queued=True)
    if state.config.endpoint.kind == "local" and feedback.on_note is not None:
        feedback.on_note(_llama_note(state))
    with watch(run_id):
        state = drive_in_foreground(state, runs, lease, signals, feedback, api_key=req.api_key, tools=own)
    return Started(state)
