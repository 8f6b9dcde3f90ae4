"""The embedded llama.cpp server: llama-cpp-python's OpenAI-compatible app, set up for runner.

`serve` runs it in this process (blocking); `LocalServer` runs it as a subprocess on a free
loopback port for the suite and tests. Either way the app is llama-cpp-python's own
(`llama_cpp.server.app.create_app`) with three changes:

- chat uses `runner.chat_adapter` (registered in the serving process, before the model loads),
  so tool results reach the model and tool calls come back as OpenAI ``tool_calls``;
- ``POST /v1/chat/completions`` accepts assistant ``content: null`` (stock 0.3.x answers 500)
  and returns the handler's extra ``runner`` timings (stock response validation drops them);
- ``GET /health`` answers ``{"status": "ok", "pid": N}`` without waiting for the model lock.

Decoding is greedy (the handler forces temperature 0) and the seed is fixed, so a reply is a
function of the request. Settings are passed explicitly and env-var settings of llama-cpp-python
(``API_KEY``, ``N_CTX``, ``CONFIG_FILE``…) are ignored, so the environment cannot change them.

Usage: ``python -m runner.local --model PATH|NAME [--port N] [--n-ctx N] [--threads N]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from runner.chat_adapter import HANDLER_NAME
from runner.errors import ServiceError

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_N_CTX = 4096
DEFAULT_SEED = 0
CHAT_PATH = "/v1/chat/completions"


class LocalServerError(ServiceError):
    """The local server could not start or stopped unexpectedly; the message has its log tail."""


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


def build_app(
    model_path: Path | str,
    *,
    model_name: str | None = None,
    n_ctx: int = DEFAULT_N_CTX,
    n_threads: int | None = None,
    chat_format: str = HANDLER_NAME,
    seed: int = DEFAULT_SEED,
    verbose: bool = False,
) -> Starlette:
    """Load the model and build the OpenAI-compatible ASGI app (see module docstring).

    Args:
        model_path: GGUF file.
        model_name: id reported by ``GET /v1/models``; default the file stem. Requests may
            name any model: llama-cpp-python serves its only model for unknown names.
        n_ctx: context window, tokens.
        n_threads: CPU threads for generation and prompt processing; default physical cores.
        chat_format: llama-cpp-python chat handler name; default runner's Hermes adapter.
        seed: RNG seed (decoding is greedy, so it only matters for other handlers).
        verbose: let llama.cpp log to stderr.

    Raises:
        LocalServerError: the model file does not exist.
        ValueError: llama.cpp failed to load the model.
    """
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    from runner import chat_adapter

    path = Path(model_path)
    if not path.is_file():
        raise LocalServerError(f"model file not found: {path}")
    chat_adapter.register()
    threads = n_threads or physical_cores()
    model_settings = _explicit(ModelSettings)(
        model=str(path),
        model_alias=model_name or path.stem,
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        chat_format=chat_format,
        seed=seed,
        # The stock server default (True) keeps logits for every prompt position: only
        # logprobs need it, and it makes the first request ~4x slower with garbled perf counters.
        logits_all=False,
        verbose=verbose,
    )
    server_settings = _explicit(ServerSettings)(host=DEFAULT_HOST, port=DEFAULT_PORT)
    os.environ.pop("CONFIG_FILE", None)  # create_app would load settings from it instead
    return _wrap(create_app(server_settings=server_settings, model_settings=[model_settings]))


def _explicit(settings_class: Any) -> Any:
    """A subclass of a llama-cpp-python settings class that reads only its arguments, no env."""
    from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

    class Explicit(settings_class):  # type: ignore[misc]
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings,)

    return Explicit


def _wrap(llama_app: FastAPI) -> Starlette:
    """Put our two routes in front of the stock app; everything else falls through to it.

    Plain Starlette routes: the endpoints take the raw request, so FastAPI's body validation
    (which rejects ``content: null`` before any of our code runs) is not in the way. Wrapping
    rather than editing the stock router keeps us off FastAPI's routing internals.
    """
    from starlette.applications import Starlette
    from starlette.routing import Mount, Route

    return Starlette(
        routes=[
            Route(CHAT_PATH, _chat_completions, methods=["POST"]),
            Route("/health", _health, methods=["GET"]),
            Mount("", app=llama_app),
        ]
    )


async def _health(request: Request) -> Response:
    from starlette.responses import JSONResponse

    # The pid lets LocalServer tell its own process from a stranger that got the port first.
    return JSONResponse({"status": "ok", "pid": os.getpid()})


async def _chat_completions(request: Request) -> Response:
    """Stock chat endpoint, minus its two problems: null content and dropped extra fields."""
    from fastapi import HTTPException
    from llama_cpp.server.app import create_chat_completion
    from llama_cpp.server.types import CreateChatCompletionRequest
    from pydantic import ValidationError

    try:
        raw = await request.json()
    except ValueError:
        return _error(400, "request body is not valid JSON")
    if not isinstance(raw, dict):
        return _error(400, "request body must be a JSON object")
    _null_content_to_empty(raw)
    try:
        body = CreateChatCompletionRequest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return _error(422, f"invalid chat request at {where}: {first['msg']}")
    try:
        result: Any = await create_chat_completion(request, body)
    except HTTPException:
        raise
    except Exception as exc:  # same mapping as the stock route (context overflow -> 400)
        status, error = _format_error(exc, body)
        return _error(status, error["message"], error)
    if isinstance(result, dict):
        from starlette.responses import JSONResponse

        return JSONResponse(result)
    return result  # type: ignore[no-any-return]  # a streaming response


def _null_content_to_empty(raw: dict[str, Any]) -> None:
    """Assistant ``content: null`` fails llama-cpp-python's request schema; it means ""."""
    for message in raw.get("messages") or []:
        if isinstance(message, dict) and message.get("content", "") is None:
            if message.get("role") == "assistant":
                message["content"] = ""


def _format_error(exc: Exception, body: Any) -> tuple[int, dict[str, Any]]:
    from llama_cpp.server.errors import RouteErrorHandler

    for pattern, formatter in RouteErrorHandler.pattern_and_formatters.items():
        if match := pattern.search(str(exc)):
            status, error = formatter(body, match)
            return status, dict(error)
    traceback.print_exc(file=sys.stderr)  # unexpected: keep the trace in the server log
    return 500, {"message": str(exc), "type": "internal_server_error", "param": None, "code": None}


def _error(status: int, message: str, error: dict[str, Any] | None = None) -> Response:
    """An OpenAI-style error body: {"error": {"message", "type", "param", "code"}}."""
    from starlette.responses import JSONResponse

    error = error or {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    return JSONResponse({"error": error}, status_code=status)


def serve(
    model_path: Path | str,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    n_ctx: int = DEFAULT_N_CTX,
    n_threads: int | None = None,
    chat_format: str = HANDLER_NAME,
    seed: int = DEFAULT_SEED,
    *,
    model_name: str | None = None,
    verbose: bool = False,
) -> None:
    """Serve a GGUF over HTTP until interrupted (blocking), at ``http://HOST:PORT/v1``.

    Args: as `build_app`, plus the listen `host` (keep it loopback) and `port`.

    Raises:
        LocalServerError: missing model file.
        ValueError: llama.cpp could not load the model.
        SystemExit: uvicorn exits with code 1 when the port is taken.
    """
    import uvicorn

    app = build_app(
        model_path,
        model_name=model_name,
        n_ctx=n_ctx,
        n_threads=n_threads,
        chat_format=chat_format,
        seed=seed,
        verbose=verbose,
    )
    print(f"serving {model_path} at http://{host}:{port}/v1", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port free on `host` right now (another process could take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalServer:
    """The embedded server as a managed subprocess; a context manager.

    ``with LocalServer(path) as server: ChatClient(server.base_url)...``. Start picks a free
    port (unless given), launches ``python -m runner.local``, and polls ``GET /health``
    until it answers, the process dies, or `startup_timeout_s` passes. Stop is terminate,
    wait, kill. The subprocess's stdout and stderr go to `log_path` (default: a temporary
    file, deleted by a clean stop, kept when start fails so its error message can point at it).

    Attributes:
        model_path: the GGUF being served.
        model_name: model id the server reports (default the file stem).
        host / port: where it listens (port chosen at start when 0).
        log_path: the server's log file.
    """

    def __init__(
        self,
        model_path: Path | str,
        port: int = 0,
        *,
        host: str = DEFAULT_HOST,
        model_name: str | None = None,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        seed: int = DEFAULT_SEED,
        chat_format: str = HANDLER_NAME,
        startup_timeout_s: float = 120.0,
        stop_timeout_s: float = 10.0,
        log_path: Path | None = None,
        verbose: bool = False,
    ) -> None:
        self.model_path = Path(model_path)
        self.model_name = model_name or self.model_path.stem
        self.host = host
        self.port = port
        self.n_ctx = n_ctx
        self.n_threads = n_threads or physical_cores()
        self.seed = seed
        self.chat_format = chat_format
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.verbose = verbose
        self.log_path = log_path
        self._owns_log = log_path is None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """OpenAI base URL, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def command(self) -> list[str]:
        """The subprocess command line, built from this object's settings."""
        args = [sys.executable, "-m", "runner.local", "--model", str(self.model_path)]
        settings: dict[str, Any] = {
            "--host": self.host,
            "--port": self.port,
            "--model-name": self.model_name,
            "--n-ctx": self.n_ctx,
            "--threads": self.n_threads,
            "--seed": self.seed,
            "--chat-format": self.chat_format,
        }
        for flag, value in settings.items():
            args += [flag, str(value)]
        return args + (["--verbose"] if self.verbose else [])

    def start(self) -> LocalServer:
        """Launch and wait until healthy.

        Raises:
            LocalServerError: missing model, early exit or timeout; includes the log tail.
        """
        if self._process is not None:
            return self
        if not self.model_path.is_file():
            raise LocalServerError(f"model file not found: {self.model_path}")
        if self.port == 0:
            self.port = free_port(self.host)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="runner-local-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=_child_env(),
            )
        try:
            self._wait_healthy()
        except BaseException:
            self._terminate()  # keep the log: the error message points at it
            raise
        return self

    def _wait_healthy(self) -> None:
        import httpx

        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        url = f"http://{self.host}:{self.port}/health"
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                raise LocalServerError(
                    f"local server exited with code {code} before it was ready "
                    f"(model {self.model_path}); log {self.log_path}:\n{self._log_tail()}"
                )
            try:
                reply = httpx.get(url, timeout=1.0)
                if reply.status_code == 200 and reply.json().get("pid") == self._process.pid:
                    return
            except (httpx.HTTPError, ValueError, AttributeError):
                pass  # not up yet, or not our server
            time.sleep(0.1)
        raise LocalServerError(
            f"local server not ready after {self.startup_timeout_s:.0f} s on port {self.port}; "
            f"log {self.log_path}:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

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


def _child_env() -> dict[str, str]:
    """The environment for the server process: ours, with the runner package importable."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def main(argv: Sequence[str] | None = None) -> int:
    """Command line for ``python -m runner.local`` (what `LocalServer` runs)."""
    parser = argparse.ArgumentParser(prog="python -m runner.local", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="GGUF file, or a name from the model manifest")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--model-name", default=None, help="model id to report")
    parser.add_argument("--n-ctx", type=int, default=DEFAULT_N_CTX, help="context window, tokens")
    parser.add_argument("--threads", type=int, default=None, help="default: physical cores")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--chat-format", default=HANDLER_NAME)
    parser.add_argument("--verbose", action="store_true", help="llama.cpp logs to stderr")
    args = parser.parse_args(argv)
    from runner import models

    try:
        path = Path(args.model)
        if not path.is_file():
            path = models.resolve(args.model)
        serve(
            path,
            host=args.host,
            port=args.port,
            n_ctx=args.n_ctx,
            n_threads=args.threads,
            chat_format=args.chat_format,
            seed=args.seed,
            model_name=args.model_name,
            verbose=args.verbose,
        )
    except (LocalServerError, models.ModelError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
