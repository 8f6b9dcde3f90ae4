"""Where runner's files are: the task suite and model manifest it ships, and where models go.

In a checkout (an editable install) the data is the checkout's own `tasks/` and
`models/manifest.json`. In an installed wheel the same files ship inside the package
(`runner/_data/`, read with `importlib.resources`). Downloaded models always go to a user cache
folder, shared by every checkout on the machine. Environment variables override each: `RUNNER_TASKS_DIR`,
`RUNNER_MANIFEST`, `RUNNER_MODELS_DIR`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from runner.errors import UsageError

if TYPE_CHECKING:
    from runner.request import ExperimentsRequest

PACKAGE_DIR = Path(__file__).resolve().parent


@functools.cache  # where the package sits does not change while it runs; each look costs ~70 µs
def checkout_root() -> Path | None:
    """The source checkout holding this package, or None when runner is installed as a wheel."""
    root = PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() and (root / "tasks").is_dir() else None


def _data(*parts: str) -> Path:
    """A file or folder shipped in the package (the wheel is installed unpacked, so a real path)."""
    from importlib import resources  # here: a checkout never reads the packaged copy

    return Path(str(resources.files("runner").joinpath("_data", *parts)))


def tasks_dir() -> Path:
    """The suite and its workspace: $RUNNER_TASKS_DIR, the checkout's `tasks/`, or the packaged copy."""
    override = os.environ.get("RUNNER_TASKS_DIR")
    if override:
        return Path(override).expanduser()
    root = checkout_root()
    return root / "tasks" if root else _data("tasks")


def manifest_path() -> Path:
    """The model manifest: $RUNNER_MANIFEST, the checkout's `models/manifest.json`, or the packaged copy."""
    override = os.environ.get("RUNNER_MANIFEST")
    if override:
        return Path(override).expanduser()
    root = checkout_root()
    return root / "models" / "manifest.json" if root else _data("manifest.json")


def models_dir() -> Path:
    """Where downloaded models live: $RUNNER_MODELS_DIR, else the user cache
    `$XDG_CACHE_HOME/runner/models` (default `~/.cache/runner/models`).

    Outside any checkout on purpose: a model of 1 GB is pulled once per machine and shared by
    every checkout, test run and CI job on it."""
    override = os.environ.get("RUNNER_MODELS_DIR")
    if override:
        return Path(override).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "runner" / "models"


def run_experiments(req: ExperimentsRequest, runs_dir: Path | None = None) -> int:
    """Run the checkout's `scripts/experiments.py` (the chapter's measurements) as `req` asks,
    in this process; returns its exit code.

    Raises:
        UsageError: no checkout holds the script (runner is installed as a wheel), an
            experiment named is not one of the script's, or a folder given is a file.
    """
    import runpy

    root = checkout_root()
    script = root / "scripts" / "experiments.py" if root else Path("scripts/experiments.py")
    if not script.exists():
        raise UsageError(f"{script} not found (experiments run from a checkout)")
    script_globals = runpy.run_path(str(script), run_name="runner_experiments")
    main: Callable[[list[str]], int] = script_globals["main"]
    known = list(script_globals["EXPERIMENTS"])
    if unknown := [n for n in req.names or [] if n not in known]:
        raise UsageError(f"unknown experiment(s) {', '.join(unknown)}; known: {', '.join(known)}")
    for flag, folder in (("--out", req.out), ("--runs-dir", runs_dir)):
        if folder is not None and folder.exists() and not folder.is_dir():
            raise UsageError(f"{flag} {folder} is a file, not a folder")
    return main([*(req.names or []), *(["--skip-local"] if req.skip_local else []),
                 *(["--list"] if req.list_names else []), *(["--out", str(req.out)] if req.out else []),
                 *(["--runs-dir", str(runs_dir)] if runs_dir else []),
                 *(["--journal", str(req.journal)] if req.journal else [])])
