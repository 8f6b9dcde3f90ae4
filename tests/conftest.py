"""Shared fixtures: the real scripted provider on loopback, isolated runs directories, a
throwaway PostgreSQL cluster (one per session, a fresh database per test), the two run stores
side by side (`backend`), and helpers that drive the real CLI: in this process (`cli`) or in a
child process (`cli_process`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping

import pytest

from runner import harness
from runner.scripted import PROMPTS, ScriptedServer, ScriptedSettings
from runner.state import RunConfig, RunState, new_run
from runner.store import FileStore, RunStore

NEEDS = {
    "llama": ("llama.cpp", {"test_hermes_adapter", "test_local_server", "test_suite_local", "test_local_run_resume",
                            "test_kvprefix", "test_untagged"}, {"smollm2_server", "plain_server", "steered_server"}),
    "postgres": ("PostgreSQL", {"test_store_pg"}, {"pg_cluster"}),
    "ray": ("Ray", {"test_ray"}, {"ray_cluster"}),
}
"""Marker -> (what it needs, test modules that all need it, fixtures that need it)."""


def pytest_configure(config: pytest.Config) -> None:
    for marker, (what, _, _) in NEEDS.items():
        config.addinivalue_line("markers", f"{marker}: needs {what} (left out by ./scripts/test.sh --fast)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave unimported a test module whose every test `-m` leaves out (with an expression of
    the form "not A and not B ..."): the fast subset imports neither Ray nor llama.cpp's models."""
    markexpr = str(config.getoption("markexpr") or "")
    excluded = {part.strip().removeprefix("not ").strip() for part in markexpr.split(" and ")
                if part.strip().startswith("not ")}
    if " or " in markexpr or not excluded:
        return None
    if any(collection_path.stem in modules for marker, (_, modules, _) in NEEDS.items() if marker in excluded):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with what it needs, from its module and its fixtures, so that
    `-m "not llama and not postgres and not ray and not slow"` is the fast subset. A test that
    starts a llama.cpp server of its own is marked `llama` by hand."""
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""  # type: ignore[attr-defined]
        fixtures = set(getattr(item, "fixturenames", ()))
        for marker, (_, modules, needs) in NEEDS.items():
            if module in modules or fixtures & needs or f"[{marker}" in item.name:  # a backend parameter
                item.add_marker(marker)


@pytest.fixture(scope="session")
def smollm2_server() -> Iterator[Any]:
    """The real llama.cpp server on the packaged SmolLM2, serving it as "smollm2", shared by the
    session (each test sends its whole conversation, so no test depends on another)."""
    from runner import models
    from runner.local import LocalServer

    with LocalServer(models.resolve("smollm2-135m-instruct"), model_name="smollm2") as running:
        yield running


@pytest.fixture(scope="session")
def provider_server() -> Iterator[ScriptedServer]:
    """A scripted provider served in-process over loopback HTTP (it counts requests)."""
    with ScriptedServer(ScriptedSettings()) as server:
        yield server


@pytest.fixture(scope="session")
def provider(provider_server: ScriptedServer) -> str:
    """Base URL of the in-process scripted provider."""
    return provider_server.base_url


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """One PostgreSQL cluster for the session (Unix socket only); skipped, with the reason,
    only when the PostgreSQL binaries are absent."""
    from tests.pgcluster import Cluster, available

    missing = available()
    if missing:
        pytest.skip(missing)
    with Cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg_cluster: Any) -> str:
    """A fresh, empty database in the session's cluster."""
    return str(pg_cluster.new_database())


LEASE_S = 2.0
"""Lease length for PostgreSQL in tests: short, so a killed driver is taken over quickly."""


class Backend:
    """One store under test, and the environment that points the CLI at it."""

    def __init__(self, kind: str, store: RunStore, env: dict[str, str], runs: Path) -> None:
        self.kind, self.store, self.env, self.runs = kind, store, env, runs


@pytest.fixture(params=["files", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each store in turn: a FileStore in a temp folder, a PostgresStore on a fresh database."""
    runs = tmp_path / "runs"
    if request.param == "files":
        store: RunStore = FileStore(runs)
        env = {"RUNNER_RUNS_DIR": str(runs)}
    else:
        from runner.store.postgres import PostgresStore

        url = request.getfixturevalue("pg_url")
        store = PostgresStore(url, lease_s=LEASE_S)
        env = {"RUNNER_STORE": url, "RUNNER_LEASE_S": str(LEASE_S)}
    try:
        yield Backend(request.param, store, env, runs)
    finally:
        store.close()


def scripted_run(scenario: str, **config: Any) -> RunState:
    """A fresh run of a scripted scenario (base_url left empty, as the CLI does)."""
    prompt = config.pop("prompt", PROMPTS.get(scenario, "Go."))
    return new_run(prompt, RunConfig.model_validate({"model": f"scripted/{scenario}", **config}))


def drive(state: RunState, base_url: str, runs_root: Path | RunStore | None, **kw: Any) -> RunState:
    return asyncio.run(harness.drive(state, base_url, runs_root, **kw))


def cli(*args: str, runs_dir: Path | None, check_json: bool = False, timeout: float = 120,
        env: Mapping[str, str | None] | None = None, cwd: Path | None = None,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI (`runner.cli.main`, the `runner` entry point) in this process with its own runs
    directory (None: $RUNNER_RUNS_DIR unset) and `env` over this process's (None: unset): stdin, stdout, stderr, the environment and the working directory are its own for
    the call (click's CliRunner isolation), and so is the terminal: not one, 80 columns, as for
    a child process with piped output. Returns what a finished `python -m runner ARGS` would.

    For what only a real process shows (a signal, a kill, its exit status, its imports, a tool
    module found in its working directory), use `cli_process`. The command runs in a child
    process too with a PostgreSQL store (a command leaves its store's connection pool open
    until its process exits) and while this thread runs an event loop (playwright's sync API
    keeps one; a command runs its own). `timeout` is the child's only."""
    from click.testing import CliRunner

    from runner.cli import main

    if "--store" in args or (env or {}).get("RUNNER_STORE") or _loop_running():
        return cli_process(*args, runs_dir=runs_dir, check_json=check_json, timeout=timeout, env=env, cwd=cwd,
                           stdin=stdin)
    env = {"COLUMNS": "80", "LINES": "24", "RUNNER_RUNS_DIR": str(runs_dir) if runs_dir else None, **(env or {})}
    assert "RUNNER_CRASH_AT" not in env, "a crash point kills the process: use cli_process"
    assert "--debug" not in args, "--debug stays on for the process: use cli_process"
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    code: int | str | None = 0
    with contextlib.chdir(cwd or os.getcwd()), CliRunner().isolation(input=stdin, env=env) as (out, err, _):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code
        finally:  # a foreground run owns SIGINT and SIGTERM, and ignores them once it stops
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            sys.stdout.flush()  # what print() left in the buffer, as a process's exit flushes it
            sys.stderr.flush()
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    if isinstance(code, str):  # sys.exit("message"): printed, exit 1
        stderr, code = stderr + code + "\n", 1
    proc = subprocess.CompletedProcess(["runner", *args], code or 0, stdout, stderr)
    if check_json:
        json.loads(proc.stdout)
    return proc


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def cli_process(*args: str, runs_dir: Path | None, check_json: bool = False, timeout: float = 120,
                env: Mapping[str, str | None] | None = None, cwd: Path | None = None,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m runner ARGS` in a child process, as `cli` does in this one; returns the
    finished process."""
    given = {"RUNNER_RUNS_DIR": str(runs_dir) if runs_dir else None, **(env or {})}
    full_env = {k: v for k, v in {**os.environ, **given}.items() if v is not None}
    proc = subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd, input=stdin)
    if check_json:
        json.loads(proc.stdout)
    return proc


def one_error(stderr: str) -> str:
    """The one error `stderr` holds, as one line: it opens with "error: ", every further line
    is an indented paragraph of it (stderr is no terminal here: nothing is wrapped; see
    test_cli_output.py for a terminal's)."""
    first, *rest = stderr.rstrip("\n").splitlines()
    assert first.startswith("error: ") and all(line.startswith("  ") for line in rest), stderr
    return " ".join(line.strip() for line in [first, *rest])


def cli_json(*args: str, runs_dir: Path, **kw: Any) -> tuple[int, Any]:
    """Run the CLI in this process with --json; returns (exit code, the parsed JSON: an object,
    or a list for `runs`)."""
    proc = cli(*args, "--json", runs_dir=runs_dir, **kw)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def cli_process_json(*args: str, runs_dir: Path, **kw: Any) -> tuple[int, Any]:
    """`cli_json` in a child process."""
    proc = cli_process(*args, "--json", runs_dir=runs_dir, **kw)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)
