"""A suite's model columns (the scripted provider, local models by name or file, or a base
URL) and the harness settings each column's runs get from the model manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from runner import steering
from runner.chat_adapter import HANDLER_NAME
from runner.endpoints import Endpoint, checked_base_url
from runner.errors import UsageError
from runner.state import RunConfig
from runner.suite.results import ToolChoiceSetting


def model_columns(provider: str, models: Sequence[str] = (), base_url: str | None = None,
                  latency_ms: float = 0.0, on_note: Callable[[str], None] | None = None) -> list[Endpoint]:
    """The suite's model columns, in order, as endpoints.

    Without `models`, `provider` picks them: "scripted", "local" (the default local model) or
    "both". With `models` (names from `runner models list`, .gguf paths, or "scripted" for the
    scripted provider), those are the columns, after the scripted one when `provider` is "both".
    With `base_url`, every non-scripted column talks to that endpoint under its own name.
    A local column's first-turn tool_choice and chat format are the model manifest's (by name,
    or by file name for a path); "auto" and runner's Hermes adapter for a model it does not know.

    Raises:
        UsageError: an unknown provider, a local model with provider "scripted", or a
            malformed `base_url` (`checked_base_url`).
        ModelNotFound: a named model is not on disk.
    """
    if provider not in ("scripted", "local", "both"):
        raise UsageError("--provider must be scripted, local or both")
    if base_url is not None:
        base_url = checked_base_url(base_url)
    names = list(dict.fromkeys(models))
    local_names: list[str | None] = [m for m in names if m != "scripted"]
    if provider == "scripted" and local_names:
        raise UsageError("--provider scripted runs no local model: leave out --model, or use --provider both")
    scripted = provider != "local" or "scripted" in names
    if not names and provider != "scripted":
        local_names = [None]  # the default local model
    columns = [Endpoint(model="scripted", latency_ms=latency_ms)] if scripted else []
    from runner import models as models_mod

    for name in local_names:
        if base_url:
            entry = models_mod.entry_for(name) if name else None
            columns.append(Endpoint(model=name or "default", base_url=base_url,
                                    first_turn_tool_choice=entry.first_turn_tool_choice if entry else "auto"))
            continue
        shown, path = models_mod.resolve_choice(models_mod.manifest_name(name) if name else None)
        entry = models_mod.entry_for(shown, path)
        choice: ToolChoiceSetting = entry.first_turn_tool_choice if entry else "auto"
        if on_note is not None:
            on_note(f"local model: {shown}\n  file: {path}")
        # Named as llama.cpp serves it (the file stem), as runs and reports always named it.
        columns.append(Endpoint(model=path.stem, local_model=str(path), first_turn_tool_choice=choice,
                                chat_format=entry.chat_format if entry else HANDLER_NAME))
    return columns


def harness_settings(column: Endpoint, run_settings: dict[str, Any] | None = None,
                     system_addendum: str | None = None, policy_edits: Sequence[str] = ()) -> tuple[dict[str, Any], str]:
    """The harness settings a column's runs get, from the model manifest unless overridden:
    (`RunConfig` fields, text added to the system prompt). The scripted column gets none.

    A local model's manifest entry (found by name, or by the file name of its GGUF) gives
    ``answer_after_tool_turns``, ``answer_on_stall``, ``answer_restates_results``,
    ``parallel_tool_calls`` and ``system_addendum``; `run_settings` and `system_addendum`
    take precedence, and `policy_edits` (`runner.steering.edited`) change the policies last."""
    if column.scripted:
        return {}, ""
    from runner import models as models_mod

    entry = models_mod.entry_for(column.model, Path(column.local_model) if column.local_model else None)
    settings = (entry.harness_defaults() if entry is not None else {}) | (run_settings or {})
    if policy_edits:
        own, at_endpoint = steering.split_fields(settings)
        current = RunConfig(endpoint=column.model_copy(update=at_endpoint), **own)
        settings = settings | steering.fields_for(steering.edited(steering.active(current), policy_edits), settings)
    addendum = system_addendum if system_addendum is not None else (entry.system_addendum if entry else "")
    return settings, addendum


def policies_of(column: Endpoint, settings: dict[str, Any], addendum: str) -> list[str]:
    """The steering policies a local column's runs get, by name."""
    own, at_endpoint = steering.split_fields(settings)
    return steering.active(RunConfig(endpoint=column.model_copy(update=at_endpoint), **own))
