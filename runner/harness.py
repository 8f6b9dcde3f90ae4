"""Putting a run together: the tool catalog, the workspace, the client, the trace, and the
scripted provider when no base URL is given. `execute` is what the CLI, the suite and the
experiments call; `loop.run` stays free of all this wiring.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from runner import loop, store
from runner.cancel import CancelToken
from runner.client import ChatClient
from runner.research import Research
from runner.state import RunState
from runner.tools import Tool, default_tools
from runner.trace import Tracer

PACKAGE_DIR = Path(__file__).resolve().parent


def tasks_dir() -> Path:
    """`tasks/` of the checkout ($RUNNER_TASKS_DIR overrides)."""
    return Path(os.environ.get("RUNNER_TASKS_DIR") or PACKAGE_DIR.parent / "tasks")


def workspace_template() -> Path:
    """The checked-in three-file workspace the tools work over (copied per run)."""
    return tasks_dir() / "workspace"


def build_tools(state: RunState) -> list[Tool]:
    """The catalog named by `state.config.tools`, in that order.

    Raises:
        ValueError: a name that is not a known tool.
    """
    known: dict[str, Tool] = {t.name: t for t in default_tools()}
    known["research"] = Research(state.config, state.run_id)
    unknown = [n for n in state.config.tools if n not in known]
    if unknown:
        raise ValueError(f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in state.config.tools]


async def execute(
    state: RunState, base_url: str, runs_root: Path | None, *, cancel: CancelToken | None = None,
    on_progress: Callable[[str, str], None] | None = None, tools_see_cancel: bool = True,
) -> RunState:
    """Run (or resume) `state` against `base_url`, saving under `runs_root` (None: in memory).

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
            rt = loop.Runtime(
                client=client, tools=build_tools(state), workspace=workspace, runs_root=runs_root,
                cancel=cancel or CancelToken(), on_progress=on_progress, tracer=tracer,
                tools_see_cancel=tools_see_cancel,
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
            raise RuntimeError(f"the scripted provider did not start (exit code {proc.poll()}): {line}")
        yield line
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
