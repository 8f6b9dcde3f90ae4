"""The embedded llama.cpp server: its settings, the process that serves, and the handle that runs it.

`LocalSettings` is the one description of a local server: it builds the subprocess command
line (`LocalSettings.command`), the ``python -m runner.local`` flags (`LocalSettings.from_argv`),
the child's environment (`LocalSettings.child_env`) and the README's table (`settings_table`).
`serve` loads the model and runs `runner.local_app` with uvicorn in this process (blocking);
`LocalServer` runs it as a subprocess on a free loopback port for the CLI, the suite and the
tests, and the subprocess dies with its parent, even a SIGKILLed one (``PR_SET_PDEATHSIG``).

Settings are passed explicitly: llama-cpp-python's own env-var settings (``N_CTX``,
``CONFIG_FILE``…) are never read. Decoding is greedy, so a reply is a function of the request.

Usage: ``python -m runner.local --model PATH|NAME [--port N] [--n-threads N] …`` (`--help`).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runner.chat_adapter import HANDLER_NAME
from runner.engine import DEFAULT_DRAFT_TOKENS, DEFAULT_MAX_TOKENS
from runner.errors import LocalServerError, ManifestError, ModelError, UsageError
from runner.procs import die_with

if TYPE_CHECKING:
    from runner.kvprefix import PrefixStore
    from runner.models import ModelEntry
    from runner.request import ServeRequest

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_N_CTX = 4096
DEFAULT_SEED = 0
DEFAULT_THREADS = 2
DEFAULT_N_BATCH = 512
CHAT_PATH = "/v1/chat/completions"


def physical_cores() -> int:
    """Number of physical CPU cores (hyper-threads excluded), at least 1.

    Read from Linux's sysfs topology (distinct (package, core) pairs); elsewhere, or when
    that is unreadable, `os.cpu_count()`.
    """
    cores: set[tuple[str, str]] = set()
    for topology in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            continue
        cores.add((package, core))
    return len(cores) or os.cpu_count() or 1


def known_chat_formats() -> list[str]:
    """``runner-hermes`` plus every chat format llama-cpp-python registers (imports llama_cpp)."""
    from llama_cpp import llama_chat_format

    registry: Any = llama_chat_format.LlamaChatCompletionHandlerRegistry()  # type: ignore[no-untyped-call]
    return [HANDLER_NAME, *sorted(registry._chat_handlers)]


class LocalSettings(BaseModel):
    """Everything that decides how the local server runs. Units are in the descriptions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Path = Field(description="GGUF file to serve (the CLI also takes a manifest name).")
    model_name: str | None = Field(default=None, description="Model id reported by /v1/models; default: the file stem.")
    host: str = Field(default=DEFAULT_HOST, description="Interface to bind; keep it loopback.")
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535, description="TCP port; 0 picks a free one at start.")
    n_ctx: int = Field(default=DEFAULT_N_CTX, ge=64, description="Context window, tokens (prompt + reply).")
    n_threads: int = Field(
        default_factory=lambda: min(DEFAULT_THREADS, physical_cores()), ge=1,
        description="CPU threads for prompt evaluation and generation; default min(2, physical cores).")
    n_batch: int = Field(default=DEFAULT_N_BATCH, ge=1,
                         description="Most prompt tokens evaluated per llama.cpp decode call, tokens.")
    seed: int = Field(default=DEFAULT_SEED, description="RNG seed given to llama.cpp (decoding is greedy: replies do not depend on it).")
    chat_format: str = Field(default=HANDLER_NAME, description=(
        "Chat format: runner-hermes (tool calls under a grammar) or a llama-cpp-python chat format "
        "name; the manifest gives each model's."))
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1,
                            description="Reply cap when a request sets no max_tokens, tokens.")
    reuse_prefix: bool = Field(default=True, description=(
        "Keep the KV entries of leading messages shared with the previous request (the system prompt "
        "and tool schemas across tasks, the conversation so far across turns)."))
    jump_forward: bool = Field(default=True, description=(
        "Evaluate text the tool-call grammar forces (the tag, a tool name once its start is unique, "
        "the argument key) as one batch instead of sampling it token by token."))
    grammar_check_first: bool = Field(default=True, description=(
        "Under a grammar, try the best token alone against it first and apply the grammar to the whole "
        "vocabulary only when it refuses that token (the same tokens, sooner)."))
    stop_at_call_end: bool = Field(default=True, description=(
        "End a reply once it holds every tool call it may make: the closing tag and end of turn the "
        "grammar leaves are neither sampled nor evaluated (the same calls, fewer decodes)."))
    another_call_by_mass: bool = Field(default=True, description=(
        "After a finished tool call, when the reply may make more, weigh end of turn against another "
        "call by probability mass rather than by the single likeliest token."))
    call_threshold: float | None = Field(default=None, ge=0.0, le=1.0, description=(
        "Under tool_choice auto, open a tool call only when the model gives that at least this "
        "probability as the reply's first visible token (unset: greedy decides)."))
    none_keeps_tools: bool = Field(default=True, description=(
        "tool_choice none keeps the tools in the prompt (the conversation's KV entries are reused) and "
        "rules calls out by grammar; off: the tools are hidden and the conversation is evaluated again."))
    prefix_cache_mb: int = Field(default=256, ge=0, description=(
        "Save the KV entries of each model's first prompt segment (system prompt + tool schemas) "
        "to disk and load them on a cold server's first turn; bound of that folder "
        "(`prefix_cache_dir`), MiB; 0: off."))
    prefix_cache_dir: Path | None = Field(default=None, description=(
        "Folder of the saved prefix KV states; default: kv-prefix in runner's cache "
        "($RUNNER_CACHE_DIR, else ~/.cache/runner)."))
    untagged_calls: Literal["auto", "on", "off"] = Field(default="auto", description=(
        "Read a reply that starts with a JSON object (bare, ```json, {{…}}) as a tool call, generated "
        "under the call grammar (runner-hermes only); auto: as the model's manifest entry says."))
    draft: Literal["auto", "none", "lookup"] = Field(default="auto", description=(
        "Speculative decoding (runner-hermes only): lookup drafts tokens from the context (prompt lookup) "
        "and verifies them in one batch; none decodes one token at a time; auto: the manifest's for the model."))
    draft_tokens: int = Field(default=DEFAULT_DRAFT_TOKENS, ge=1, description="Most tokens drafted at a time.")
    steer: Literal["off", "default", "on"] = Field(default="off", description=(
        "Server steering for clients that do not steer (runner.steering.serve): off; default: the "
        "policies of the model's manifest entry (serve_policies); on: every server policy. runner's own "
        "loop steers itself and runs its servers with off."))
    omp_wait_policy: Literal["PASSIVE", "ACTIVE"] = Field(default="PASSIVE", description=(
        "OMP_WAIT_POLICY of the server process: PASSIVE threads sleep between decodes instead of spinning."))
    verbose: bool = Field(default=False, description="Let llama.cpp log to stderr.")

    @field_validator("chat_format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value != HANDLER_NAME and value not in known_chat_formats():
            raise ValueError(f"unknown chat_format {value!r}; known: {', '.join(known_chat_formats())}")
        return value

    @property
    def base_url(self) -> str:
        """OpenAI base URL, e.g. ``http://127.0.0.1:8080/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def name(self) -> str:
        return self.model_name or self.model.stem

    def command(self) -> list[str]:
        """The ``python -m runner.local`` command line that serves these settings."""
        args = [sys.executable, "-m", "runner.local"]
        for key in type(self).model_fields:
            value = getattr(self, key)
            if isinstance(value, bool):
                args += [_flag(key) if value else "--no-" + _flag(key)[2:]]
            elif value is not None:
                args += [_flag(key), str(value)]
        return args

    def child_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The server process's environment: `base` (default ours) with the runner package
        importable and OMP_WAIT_POLICY set (OpenMP reads it once, when llama.cpp loads)."""
        env = dict(os.environ if base is None else base)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env["OMP_WAIT_POLICY"] = self.omp_wait_policy
        return env

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        """The ``python -m runner.local`` argument parser, one flag per field."""
        parser = argparse.ArgumentParser(prog="python -m runner.local", description=__doc__.splitlines()[0])
        for key, info in cls.model_fields.items():
            if info.annotation is bool:
                parser.add_argument(_flag(key), dest=key, action=argparse.BooleanOptionalAction,
                                    default=None, help=info.description)
            else:
                parser.add_argument(_flag(key), dest=key, required=info.is_required(), default=None,
                                    help=info.description)
        return parser

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None,
                  resolve: Callable[[str], Path] | None = None) -> LocalSettings:
        """Parse ``python -m runner.local`` flags; `resolve` maps a --model that is not a file
        (a manifest name) to a path.

        Raises:
            SystemExit: bad flags (argparse's usage message).
            ValueError: a value pydantic rejects, e.g. an unknown chat_format.
        """
        given = {k: v for k, v in vars(cls.parser().parse_args(argv)).items() if v is not None}
        if resolve is not None and not Path(given["model"]).is_file():
            given["model"] = resolve(given["model"])
        return cls.model_validate(given)


def settings(**fields: Any) -> LocalSettings:
    """`LocalSettings` from keyword fields, for the CLI and the suite.

    Raises:
        UsageError: a field pydantic rejects (e.g. an unknown chat_format), in one line.
    """
    try:
        return LocalSettings(**fields)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise UsageError(f"local server setting {where}: {problem['msg'].removeprefix('Value error, ')}") from None


def serve_settings(req: ServeRequest) -> tuple[str, Path, LocalSettings]:
    """What `runner serve` serves: (the name it shows, the GGUF, its settings) for `req.model`
    (a manifest name, a unique start of one, a .gguf path, or None: the default local model),
    with the manifest's chat format and the settings `req` gives.

    Raises:
        ModelNotFound: no such model on disk. UsageError: as `settings`, a .gguf path that is
            no file, or a port another process listens on.
    """
    from runner import models

    if req.model and req.model.endswith(".gguf") and not Path(req.model).expanduser().is_file():
        raise UsageError(f"--model {req.model}: no such file")
    name, path = models.resolve_choice(models.manifest_name(req.model) if req.model else None)
    entry = models.entry_for(name, path)
    given = {"chat_format": entry.chat_format if entry else None, "n_threads": req.threads, "n_batch": req.n_batch,
             "draft": req.draft, "steer": req.steer}
    chosen = settings(model=path, port=req.port, n_ctx=req.n_ctx, **{k: v for k, v in given.items() if v is not None})
    if chosen.port:  # taken: say so now, not after the model has loaded in a server that cannot listen
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((chosen.host, chosen.port))
            except OSError as exc:
                raise UsageError(f"cannot listen on {chosen.host}:{chosen.port}: {exc.strerror or exc}") from None
    return name, path, chosen


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def settings_table() -> str:
    """The settings as a Markdown table: setting, flag, default, meaning (for the README)."""
    lines = ["| setting | flag | default | meaning |", "|---|---|---|---|"]
    for key, info in LocalSettings.model_fields.items():
        if info.is_required():
            default = "(required)"
        elif info.default_factory is not None:
            default = "see meaning"
        else:
            default = f"`{info.default}`" if info.default is not None else "none"
        flag = f"`{_flag(key)}` / `--no-{_flag(key)[2:]}`" if info.annotation is bool else f"`{_flag(key)}`"
        lines.append(f"| `{key}` | {flag} | {default} | {info.description} |")
    return "\n".join(lines) + "\n"


def load_llama(settings: LocalSettings) -> Any:
    """Load the GGUF with llama-cpp-python as `settings` say.

    Raises:
        LocalServerError: the model file does not exist.
        ValueError: llama.cpp failed to load the model.
    """
    from llama_cpp import Llama

    if not settings.model.is_file():
        raise LocalServerError(f"model file not found: {settings.model}")
    return Llama(
        model_path=str(settings.model), n_ctx=settings.n_ctx, n_threads=settings.n_threads,
        n_threads_batch=settings.n_threads, n_batch=settings.n_batch, seed=settings.seed,
        chat_format=None if settings.chat_format == HANDLER_NAME else settings.chat_format,
        logits_all=False, verbose=settings.verbose,
    )


def serve(settings: LocalSettings) -> None:
    """Serve `settings.model` at ``settings.base_url`` until SIGINT/SIGTERM (blocking).

    Raises:
        LocalServerError: missing model file.
        ValueError: llama.cpp could not load the model.
        SystemExit: uvicorn exits with code 1 when the port is taken.
    """
    import uvicorn

    from runner.local_app import Backend, build_app
    from runner.steering import serve

    entry = manifest_entry(settings)
    backend = Backend(load_llama(settings), settings.chat_format, settings.max_tokens, settings.reuse_prefix,
                      settings.jump_forward, untagged_calls(settings), check_first=settings.grammar_check_first,
                      none_keeps_tools=settings.none_keeps_tools, draft=draft(settings),
                      stop_at_call_end=settings.stop_at_call_end,
                      another_call_by_mass=settings.another_call_by_mass,
                      call_threshold=settings.call_threshold,
                      draft_tokens=settings.draft_tokens,
                      # OpenAI's default: the manifest's parallel_tool_calls is for runner's own loop.
                      parallel_default=True,
                      steering=serve.for_mode(settings.steer, entry.serve_policies if entry else [],
                                                       entry.answer_after_tool_turns if entry else None))
    if backend.engine is not None:
        if settings.prefix_cache_mb and settings.reuse_prefix:
            backend.engine.prefix_store = prefix_store(settings)
        backend.engine.warm_up()
    app = build_app(backend, settings.name)
    print(f"serving {settings.model} at {settings.base_url}", file=sys.stderr, flush=True)
    # A generation in flight stops when its client goes; don't wait long for one that won't.
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", timeout_graceful_shutdown=2)


def prefix_store(settings: LocalSettings) -> PrefixStore:
    """The on-disk prefix KV store for `settings`' model (see `runner.kvprefix`); hashing the
    model file the first time (then remembered)."""
    from runner import kvprefix

    directory = settings.prefix_cache_dir or kvprefix.default_directory()
    return kvprefix.PrefixStore(directory, kvprefix.file_sha256(settings.model, directory), settings.n_ctx,
                                settings.prefix_cache_mb << 20)


def manifest_entry(settings: LocalSettings) -> ModelEntry | None:
    """The manifest entry whose file name is the served GGUF's; None for a model the manifest
    does not know, or an unreadable manifest."""
    from runner import models

    try:
        return models.entry_for("", settings.model)
    except ManifestError:
        return None


def draft(settings: LocalSettings) -> Literal["none", "lookup"]:
    """The speculative decoding the server does: the setting, or with "auto" the ``draft`` of
    the model's manifest entry ("none" for a model it does not know)."""
    if settings.draft != "auto":
        return settings.draft
    entry = manifest_entry(settings)
    return entry.draft if entry is not None else "none"


def untagged_calls(settings: LocalSettings) -> bool:
    """Whether the server reads untagged calls: the setting when "on"/"off", else the
    ``untagged_calls`` of the model's manifest entry (False for a model it does not know)."""
    if settings.untagged_calls != "auto":
        return settings.untagged_calls == "on"
    entry = manifest_entry(settings)
    return entry is not None and entry.untagged_calls


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port free on `host` right now (another process could take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalServer:
    """The embedded server as a managed subprocess; a context manager.

    ``with LocalServer(settings) as server: ChatClient(server.base_url)...``. Start picks a free
    port (when the settings say 0), launches `LocalSettings.command` with
    `LocalSettings.child_env`, and polls ``GET /health`` until it answers with the child's pid,
    the process dies, or `startup_timeout_s` passes. Stop is terminate, wait, kill. The child is
    SIGKILLed by the kernel if the starting thread dies first, so no server outlives a killed
    runner. Its stdout and stderr go to `log_path` (default: a temporary file, deleted when the
    server stops or fails to start: the error quotes the log's last lines; a `log_path` given
    is kept, and the error names it).

    Args:
        settings: a `LocalSettings`, or a GGUF path with `overrides` as its other fields (port
            defaults to 0 here).
    """

    def __init__(self, settings: LocalSettings | Path | str, *, startup_timeout_s: float = 120.0,
                 stop_timeout_s: float = 10.0, log_path: Path | None = None, **overrides: Any) -> None:
        if not isinstance(settings, LocalSettings):
            settings = LocalSettings(model=Path(settings), **{"port": 0, **overrides})
        elif overrides:
            settings = LocalSettings.model_validate(settings.model_dump() | overrides)
        self.settings = settings
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.log_path = log_path
        self._owns_log = log_path is None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def model_path(self) -> Path:
        return self.settings.model

    @property
    def model_name(self) -> str:
        return self.settings.name

    @property
    def base_url(self) -> str:
        return self.settings.base_url

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def command(self) -> list[str]:
        return self.settings.command()

    def start(self) -> LocalServer:
        """Launch and wait until healthy.

        Raises:
            LocalServerError: missing model, early exit or timeout; includes the log tail.
        """
        if self._process is not None:
            return self
        if not self.settings.model.is_file():
            raise LocalServerError(f"model file not found: {self.settings.model}")
        if self.settings.port == 0:
            self.settings = self.settings.model_copy(update={"port": free_port(self.settings.host)})
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="runner-local-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.settings.child_env(), preexec_fn=die_with(os.getpid()),
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()  # the error holds the log's tail (a temporary log goes; a given one stays)
            raise
        return self

    def _wait_healthy(self) -> None:
        import httpx

        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        url = self.base_url.removesuffix("/v1") + "/health"
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                raise LocalServerError(
                    f"local server exited with code {code} before it was ready "
                    f"(model {self.settings.model}); {self._log_tail()}"
                )
            try:
                reply = httpx.get(url, timeout=1.0)
                if reply.status_code == 200 and reply.json().get("pid") == self._process.pid:
                    return
            except (httpx.HTTPError, ValueError, AttributeError):
                pass  # not up yet, or not our server
            time.sleep(0.1)
        raise LocalServerError(
            f"local server not ready after {self.startup_timeout_s:.0f} s on port {self.settings.port}; "
            f"{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 20) -> str:
        """The log's last `lines` lines, introduced by the log's path when it outlives the
        server (a `log_path` given), else by "its log ended" (a temporary log, deleted)."""
        said = "its log ended" if self._owns_log else f"log {self.log_path}"
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return f"{said}: (unreadable)"
        return f"{said}:\n" + ("\n".join(text.splitlines()[-lines:]) or "(empty)")

    def stop(self) -> None:
        """Terminate, wait up to `stop_timeout_s`, then kill; delete a log we created. Idempotent."""
        self._terminate()
        if self._owns_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line for ``python -m runner.local`` (what `LocalServer` runs)."""
    from runner import models

    try:
        settings = LocalSettings.from_argv(argv, resolve=models.resolve)
        os.environ.setdefault("OMP_WAIT_POLICY", settings.omp_wait_policy)  # before llama.cpp loads
        serve(settings)
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"error: --{'-'.join(str(p) for p in first['loc']).replace('_', '-')}: {first['msg']}", file=sys.stderr)
        return 2
    except (LocalServerError, ModelError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


def serve_until_stopped(settings: LocalSettings, on_ready: Callable[[str], None], say: Callable[[str], None]) -> None:
    """Serve until SIGINT or SIGTERM: `on_ready` is called with the base URL, `say` with each
    request's line of the server's log (see `follow_requests`) and once stopping."""
    with LocalServer(settings) as server:
        on_ready(server.base_url)
        # Block only now: a child started with these signals blocked would ignore SIGTERM.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        follow_requests(server.log_path, lambda line: say(f"  {line}"))
        say("stopping the server")


def follow_requests(log_path: Path | None, say: Callable[[str], None]) -> None:
    """Until SIGINT or SIGTERM (blocked by the caller): pass each request's line of the
    server's log to `say` as it is written (method, path, status, tokens, ms)."""
    from runner.local_app import REQUEST_LOG_PREFIX

    with open(log_path or os.devnull, errors="replace") as log:
        log.seek(0, os.SEEK_END)
        while signal.sigtimedwait({signal.SIGINT, signal.SIGTERM}, 0.2) is None:
            for line in log.readlines():
                if line.startswith(REQUEST_LOG_PREFIX):
                    say(line.removeprefix(REQUEST_LOG_PREFIX).rstrip())
