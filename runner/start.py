"""Starting a run from what a person asked for: a `RunRequest` (the options of `runner run`)
checked and resolved against the config files and the environment into a new `RunState`.

`prepare` decides the endpoint (a scenario's scripted provider, a base URL, or a local model
runner serves itself), reads the prompt (an argument, a file, or stdin), finds the API key and
the tools of one's own, and builds the `RunConfig`. Everything that can be wrong with a request
is raised here as a `UsageError`, before any run exists.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from runner import catalog
from runner.config import Key, Settings
from runner.errors import UnknownScenario, UsageError
from runner.state import Endpoint, Limits, RunConfig, RunState, new_run

if TYPE_CHECKING:
    from runner.tools import Tool


@dataclass(frozen=True)
class RunRequest:
    """The options of `runner run`; None means "not given" (the config file or a default
    decides). Units as in `RunConfig`."""

    prompt: str | None = None
    """The task; "-" reads it from stdin."""
    prompt_file: Path | None = None
    scenario: str | None = None
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    api_key_env: str | None = None
    tools: list[str] = field(default_factory=list)
    """Tools of one's own: MODULE:ATTRIBUTE or plugin names."""
    no_builtin_tools: bool = False
    tool_choice: str | None = None
    max_turns: int | None = None
    max_budget_usd: float | None = None
    dedupe: bool = False
    dedupe_all: bool = False
    tool_errors: str = "text"
    permanent_errors: bool = True
    max_identical_failures: int = 2
    auto_approve: bool = False
    on_slip: str = "corrective"
    answer_after: int | None = None
    cap_max_tokens: bool = False
    price_in: float | None = None
    price_out: float | None = None
    timeout_s: float | None = None
    max_retries: int | None = None
    research: bool = False
    research_max_turns: int = 6
    research_max_budget_usd: float = 0.05
    latency_ms: float = 0.0
    fault: str | None = None
    detach: bool = False


@dataclass(frozen=True)
class LocalChoice:
    """A model runner serves itself: its name, what `Endpoint.local_model` records, the
    manifest's first-turn tool choice, and the GGUF."""

    name: str
    recorded: str
    tool_choice: Literal["auto", "required", "none"]
    path: Path


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
                         "max_retries": req.max_retries, "tool_choice": req.tool_choice, "tools": req.tools or None})
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
    key = settings.key(req.api_key)
    refs = {spec: catalog.spec_to_ref(spec) for spec in settings.get("tools")}
    own = [catalog.load(ref) for ref in refs.values()]  # a missing tool stops here: no run is made
    endpoint = Endpoint(
        model=f"scripted/{name}" if scenario else (local.name if local else str(model)), base_url=url,
        local_model=local.recorded if local else None, latency_ms=req.latency_ms, api_key_env=key.env,
        first_turn_tool_choice=settings.get("tool_choice") or (local.tool_choice if local else "auto"),
        timeout_s=settings.get("timeout_s"), max_retries=settings.get("max_retries"))
    config = _config(req, settings, endpoint, name)
    if req.no_builtin_tools and not own:
        raise UsageError("--no-builtin-tools leaves no tool: give --tool MODULE:ATTRIBUTE")
    if own:
        builtin = [] if req.no_builtin_tools else config.tools
        catalog.offer(config, [*builtin, *own], {t.name: ref for t, ref in zip(own, refs.values())})
    return Prepared(new_run(task, config), key, own, local, req.detach, req.fault)


def _check_choices(req: RunRequest) -> None:
    if req.tool_errors not in ("text", "generic", "fatal"):
        raise UsageError("--tool-errors must be text, generic or fatal")
    if req.on_slip not in ("corrective", "repeat", "fail"):
        raise UsageError("--on-slip must be corrective, repeat or fail")
    if req.tool_choice is not None and req.tool_choice not in ("auto", "required", "none"):
        raise UsageError(f"--tool-choice must be auto, required or none, got {req.tool_choice!r}")
    if req.detach and (req.latency_ms or req.fault):
        raise UsageError("--latency-ms and --fault configure a scripted provider started here; "
                         "they do not go with --detach")


def _endpoint_choice(req: RunRequest, settings: Settings) -> tuple[str | None, str | None, LocalChoice | None]:
    """(base URL, model name, local model) of the run; a scenario reaches a scripted provider,
    the one named by --base-url or $RUNNER_BASE_URL if any."""
    if req.scenario is None:
        if req.base_url is not None:
            settings.flags["base_url"] = req.base_url
        url = settings.get("base_url")
        model = settings.get("model")
    else:
        url = req.base_url or os.environ.get("RUNNER_BASE_URL") or None
        model = req.model
    local = local_choice(model) if req.scenario is None and url is None and model else None
    if req.scenario is None and url is None and local is None:
        if model:
            raise UsageError(f"{model!r} is not a local model (runner models list); to send it to an endpoint, "
                             "give --base-url URL")
        raise UsageError("give --scenario NAME (scripted), --model NAME (a local model runner serves), or "
                         "--base-url URL --model NAME; both --scenario and --base-url run the scenario on a "
                         "scripted provider already serving at URL")
    if req.scenario is not None and req.model:
        raise UsageError("--model goes with --base-url alone; a scenario names its own model")
    if req.scenario is None and not model:
        raise UsageError("--base-url needs --model")
    if (url is not None or local is not None) and (req.fault or req.latency_ms):
        raise UsageError("--fault and --latency-ms configure the scripted provider runner starts; with --base-url, "
                         "start that provider with `runner scripted serve --fault ...`")
    if url is not None and not url.startswith(("http://", "https://")):
        raise UsageError(f"--base-url must start with http:// or https://, got {url!r}")
    return url, model, local


def _config(req: RunRequest, settings: Settings, endpoint: Endpoint, scenario: str) -> RunConfig:
    fields: dict[str, Any] = {
        "dedupe": req.dedupe, "dedupe_all": req.dedupe_all, "tool_errors": req.tool_errors,
        "permanent_errors": req.permanent_errors, "auto_approve": req.auto_approve,
        "price_in_usd_per_mtok": settings.get("price_in_usd_per_mtok"),
        "price_out_usd_per_mtok": settings.get("price_out_usd_per_mtok"),
        "research_max_turns": req.research_max_turns, "research_max_budget_usd": req.research_max_budget_usd,
        "on_slip": req.on_slip, "answer_after_tool_turns": req.answer_after,
    }
    limits = Limits(max_turns=settings.get("max_turns") or None, max_budget_usd=settings.get("max_budget_usd"),
                    cap_max_tokens=req.cap_max_tokens, max_identical_failures=req.max_identical_failures)
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


def local_choice(model: str) -> LocalChoice | None:
    """The local model `model` names: a manifest name, a unique start of one ("smollm2"), or a
    .gguf path; None for anything else (a model name for a base URL).

    Raises:
        UsageError: a .gguf path that is not a file. ModelNotFound: a manifest model that is not
            on disk (the message says how to get it).
    """
    from runner import models

    manifest = models.load_manifest()
    if model.endswith(".gguf"):
        path = Path(model).expanduser()
        if not path.is_file():
            raise UsageError(f"--model {model}: no such file")
        entry = models.entry_for(path.stem, path, manifest)
        return LocalChoice(path.stem, str(path.resolve()), entry.first_turn_tool_choice if entry else "auto", path)
    name = manifest_name(model)
    if name not in [m.name for m in manifest.models]:
        return None
    return LocalChoice(name, name, manifest.entry(name).first_turn_tool_choice, models.resolve(name, manifest))


def manifest_name(model: str) -> str:
    """A manifest name for a unique start of one ("smollm2" -> "smollm2-135m-instruct"), else `model`."""
    from runner import models

    names = [m.name for m in models.load_manifest().models]
    matches = [n for n in names if n == model] or [n for n in names if n.startswith(model.lower())]
    return matches[0] if len(matches) == 1 else model


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
