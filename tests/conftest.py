"""Shared fixtures: the real scripted provider on loopback, isolated runs directories, and
a helper that drives the real CLI in a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from runner.harness import execute
from runner.scripted import PROMPTS, ScriptedServer, ScriptedSettings
from runner.state import RunConfig, RunState, new_run


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


def scripted_run(scenario: str, **config: Any) -> RunState:
    """A fresh run of a scripted scenario (base_url left empty, as the CLI does)."""
    prompt = config.pop("prompt", PROMPTS.get(scenario, "Go."))
    return new_run(prompt, RunConfig(model=f"scripted/{scenario}", **config))


def drive(state: RunState, base_url: str, runs_root: Path | None, **kw: Any) -> RunState:
    return asyncio.run(execute(state, base_url, runs_root, **kw))


def cli(*args: str, runs_dir: Path, check_json: bool = False, timeout: float = 120,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m runner ARGS` with its own runs directory; returns the finished process."""
    full_env = {**os.environ, "RUNNER_RUNS_DIR": str(runs_dir), **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)
    if check_json:
        json.loads(proc.stdout)
    return proc


def cli_json(*args: str, runs_dir: Path, **kw: Any) -> tuple[int, Any]:
    """Run the CLI with --json; returns (exit code, the parsed JSON: an object, or a list for `runs`)."""
    proc = cli(*args, "--json", runs_dir=runs_dir, **kw)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)
