"""Opening endpoints: `open_endpoint`, the one function that starts what an `Endpoint` spec
(`runner.state.Endpoint`, re-exported here) needs to be reached.

An endpoint is one of three kinds, decided by which field is set:

- ``url``: `base_url` names an OpenAI-compatible endpoint that is already running;
- ``local``: `local_model` names a GGUF (a manifest name or a path) that runner serves itself
  with its llama.cpp server (`runner.local.LocalServer`), started on open and stopped on close;
- ``scripted``: neither is set: the scripted provider, answering in this process
  (`runner.scripted.InProcessProvider`: no second process, no socket).

The spec is plain data: it is saved with every run (`RunConfig.endpoint`), so `resume`, a
worker on another machine, or a Ray actor reaches the same model again. The CLI, the worker
and both fan-out executors open endpoints here and nowhere else.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from runner.errors import UsageError
from runner.state import Endpoint

__all__ = ["Endpoint", "Opened", "checked_base_url", "local_endpoint", "open_endpoint"]


def checked_base_url(url: str) -> str:
    """`url` when it can name an endpoint runner reaches: http or https, a host, a port that
    exists. Checked before a run records it, so a typo never becomes part of a run.

    Raises:
        UsageError: anything else, in one line naming --base-url.
    """
    from urllib.parse import urlsplit

    problem = None
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 (raises ValueError for a port that is no number or out of range)
    except ValueError as exc:
        problem = str(exc)
    else:
        if parts.scheme not in ("http", "https"):
            problem = "it must start with http:// or https://"
        elif not parts.hostname:
            problem = "it names no host"
    if problem is not None:
        raise UsageError(f"--base-url {url!r} is not a URL runner can reach: {problem}")
    return url.strip()


@dataclass(frozen=True)
class Opened:
    """An endpoint that is up: its base URL, and the settings of the local server started for
    it (None when none was started; recorded on each run's `run_started`)."""

    base_url: str
    server_settings: dict[str, Any] | None = None

    def server_turns(self) -> list[dict[str, float]]:
        """The engine timings of every reply of the local server started here (GET /stats of
        `runner.local_app`): prompt_tokens, cached_prompt_tokens (KV reused),
        prompt_eval_tokens, eval_tokens, prompt_eval_ms, eval_ms, handler_ms. Empty when no
        server was started."""
        if self.server_settings is None:
            return []
        import httpx

        keys = ("prompt_tokens", "cached_prompt_tokens", "prompt_eval_tokens", "eval_tokens",
                "prompt_eval_ms", "eval_ms", "handler_ms")
        replies = httpx.get(self.base_url.removesuffix("/v1") + "/stats", timeout=10).json()["replies"]
        return [{k: r[k] for k in keys if k in r} for r in replies]


@contextlib.contextmanager
def open_endpoint(endpoint: Endpoint, *, faults: str | None = None) -> Iterator[Opened]:
    """Start what `endpoint` needs and yield it up; stop what was started on exit.

    Args:
        faults: the scripted provider only: faults to inject (``KIND@TURN,...``, see
            `runner.scripted.parse_faults`).

    Raises:
        ServiceError: the scripted provider or the llama.cpp server did not start.
        UsageError: a local server setting llama.cpp's settings reject.
        ModelNotFound: the local model is not on disk.
    """
    if endpoint.kind == "url":
        assert endpoint.base_url is not None
        yield Opened(endpoint.base_url)
    elif endpoint.kind == "scripted":
        from runner.scripted import scripted_provider

        with scripted_provider(latency_ms=endpoint.latency_ms, faults=faults, in_process=True) as url:
            yield Opened(url)
    else:
        from runner import local, models

        assert endpoint.local_model is not None
        if endpoint.local_model.endswith(".gguf"):  # a file of its own: a missing one is the server's error
            path = Path(endpoint.local_model)
            name = path.stem
        else:
            name, path = models.resolve_choice(endpoint.local_model)
        entry = models.entry_for(name, path)
        fields: dict[str, Any] = {"model": path, "port": 0, "model_name": endpoint.model}
        chat_format = endpoint.chat_format or (entry.chat_format if entry else None)
        fields |= {"chat_format": chat_format} if chat_format else {}
        fields |= {"n_threads": endpoint.n_threads} if endpoint.n_threads else {}
        with local.LocalServer(local.settings(**fields)) as server:
            yield Opened(server.base_url, server.settings.model_dump(mode="json"))


def local_endpoint(model: str | None = None, **fields: Any) -> Endpoint:
    """The endpoint of a local model as the manifest describes it: served under its file stem,
    with the manifest's chat format and first-turn tool choice (runner's defaults for a GGUF
    the manifest does not know).

    Args:
        model: a manifest name, a ``.gguf`` path, or None for the default local model.
        fields: other `Endpoint` fields (`timeout_s`, `n_threads`, ...).

    Raises:
        ModelNotFound: the model is unknown or not on disk.
    """
    from runner import models

    name, path = models.resolve_choice(model)
    entry = models.entry_for(name, path)
    spec: dict[str, Any] = {"model": path.stem, "local_model": str(path)}
    if entry is not None:
        spec |= {"chat_format": entry.chat_format, "first_turn_tool_choice": entry.first_turn_tool_choice}
    return Endpoint(**(spec | fields))
