"""Putting a run together: the tool catalog, the workspace, the client, the trace, and the
scripted provider when no base URL is given. `execute` is what the CLI, the suite and the
experiments call; `loop.run` stays free of all this wiring.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from runner import catalog, loop, store
from runner.cancel import CancelToken
from runner.client import ChatClient
from runner.errors import RunNotFound, ServiceError
from runner.resources import tasks_dir
from runner.state import RunState
from runner.streaming import TurnProgress
from runner.tools import Tool
from runner.trace import Tracer


def workspace_template() -> Path:
    """The checked-in three-file workspace the tools work over (copied per run)."""
    return tasks_dir() / "workspace"


def build_tools(state: RunState) -> list[Tool]:
    """The catalog named by `state.config.tools`, in that order (see `runner.catalog.build`)."""
    return catalog.build(state.config)


async def execute(
    state: RunState, base_url: str, runs_root: Path | None, *, cancel: CancelToken | None = None,
    on_progress: Callable[[str, str], None] | None = None, tools_see_cancel: bool = True,
    server_settings: dict[str, Any] | None = None,
    on_turn: Callable[[TurnProgress], None] | None = None,
) -> RunState:
    """Run (or resume) `state` against `base_url`, saving under `runs_root` (None: in memory).

    `server_settings` (what the endpoint runs with, e.g. the local server's n_ctx, chat_format,
    seed, n_threads) is recorded on `run_started`.

    Tools work on the run's private copy of the workspace: `runs_root/<run_id>/workspace`,
    or a temporary folder, removed afterwards, when `runs_root` is None.
    """
    with contextlib.ExitStack() as cleanup:
        if runs_root is not None:
            workspace = store.workspace_path(runs_root, state.run_id, workspace_template())
            tracer = Tracer(store.trace_path(runs_root, state.run_id))
        else:
            scratch = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="runner-")))
            workspace = store.workspace_path(scratch, state.run_id, workspace_template())
            tracer = Tracer(None)
        cleanup.callback(tracer.close)
        cfg = state.config
        async with ChatClient(base_url, timeout_s=cfg.timeout_s, max_retries=cfg.max_retries) as client:

            async def run_child(child: RunState, child_cancel: CancelToken) -> RunState:
                """A child run shares the client and workspace; it is saved and traced as a run
                of its own, and resumed (not restarted) if it already exists."""
                if runs_root is not None:
                    try:
                        child = store.load(runs_root, child.run_id)
                    except RunNotFound:
                        store.save(child, runs_root)
                child_tracer = Tracer(store.trace_path(runs_root, child.run_id) if runs_root else None)
                try:
                    return await loop.run(child, loop.Runtime(
                        client=client, tools=catalog.build(child.config), workspace=workspace,
                        runs_root=runs_root, cancel=child_cancel, on_progress=on_progress,
                        tracer=child_tracer, run_child=run_child))
                finally:
                    child_tracer.close()

            rt = loop.Runtime(
                client=client, tools=catalog.build(state.config), workspace=workspace, runs_root=runs_root,
                cancel=cancel or CancelToken(), on_progress=on_progress, tracer=tracer,
                tools_see_cancel=tools_see_cancel, run_child=run_child, server_settings=server_settings,
                on_turn=on_turn,
            )
            return await loop.run(state, rt)


def die_with_parent() -> None:
    """preexec_fn for helper servers: on Linux, SIGTERM the child when its parent dies, so a
    killed runner (kill -9, the resume tests) never leaves a provider behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@contextlib.contextmanager
def scripted_provider(latency_ms: float = 0, faults: str | None = None) -> Iterator[str]:
    """Start `runner scripted serve` as a child process on a free loopback port.

    Yields the base URL ("http://127.0.0.1:PORT/v1"); stops the server on exit.
    A separate process keeps the tokenizer and web server out of the client's memory.

    Raises:
        RuntimeError: the server did not report its address.
    """
    cmd = [sys.executable, "-m", "runner", "scripted", "serve", "--port", "0",
           "--latency-ms", str(latency_ms)]
    if faults:
        cmd += ["--fault", faults]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=die_with_parent)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("http"):
            raise ServiceError(f"the scripted provider did not start (exit code {proc.poll()}): {line}")
        yield line
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
