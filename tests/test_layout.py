"""The package's shape: modules import alone, no import cycles, the public surface is exactly
`__all__`, lint and types are clean, and a built wheel works outside the checkout."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

import runner

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "runner").rglob("*.py") if p != ROOT / "runner" / "__init__.py"
)


def _path(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _runner_imports(path: Path) -> set[str]:
    """runner.* modules imported by a file, at any depth, except under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:  # relative: runner.store's own modules
            package = ".".join(path.relative_to(ROOT).parts[:-1])
            found.update(f"{package}.{node.module}" if node.module else f"{package}.{a.name}" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("runner"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("runner."))
    return found & set(MODULES)


def test_no_import_cycles_between_runner_modules() -> None:
    graph = {m: _runner_imports(_path(m)) - {m} for m in MODULES}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = path[path.index(module):] + [module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*path, module])
        done.add(module)

    for module in MODULES:
        visit(module, [])


@pytest.mark.slow
def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    script = (
        "import importlib, subprocess, sys\n"
        "bad = []\n"
        f"for m in {MODULES!r}:\n"
        "    p = subprocess.run([sys.executable, '-c', f'import {m}'], capture_output=True, text=True)\n"
        "    if p.returncode: bad.append(m + ': ' + p.stderr.strip().splitlines()[-1])\n"
        "print('\\n'.join(bad)); sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_public_surface_is_all_and_every_name_resolves() -> None:
    exported = set(runner._EXPORTS)
    assert set(runner.__all__) == exported
    assert len(runner.__all__) == len(set(runner.__all__))
    for name in runner.__all__:
        assert getattr(runner, name) is not None
    with pytest.raises(AttributeError):
        runner.not_a_name  # noqa: B018


def test_importing_runner_does_no_work() -> None:
    """Nothing at import time: `import runner` loads none of its submodules."""
    code = "import sys, runner; print(sorted(m for m in sys.modules if m.startswith('runner.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_no_function_in_runner_is_over_60_lines() -> None:
    """Every function reads whole on one screen: at most 60 lines from its `def` to its end."""
    functions = [(p, n) for p in sorted((ROOT / "runner").rglob("*.py")) for n in ast.walk(ast.parse(p.read_text()))
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    long = [f"{p.relative_to(ROOT)}:{n.lineno} {n.name} ({(n.end_lineno or 0) - n.lineno + 1} lines)"
            for p, n in functions if (n.end_lineno or 0) - n.lineno + 1 > 60]
    assert not long, long


def test_ruff_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "runner", "scripts", "tests"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


@pytest.mark.slow
def test_wheel_installed_in_a_fresh_venv_runs_a_scenario_and_the_suite(tmp_path: Path) -> None:
    """Build the wheel, install it (no deps) into a fresh venv that borrows this venv's
    dependencies, and run the CLI from an empty folder: the task files and the manifest
    must come from the package, not the checkout."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(dist), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("runner-*.whl"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # Borrow the dependencies (not runner itself: its editable .pth lives in this site dir
    # and a path listed in a .pth is not scanned for further .pth files).
    Path(site, "borrowed-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, str(wheel)],
                   check=True, capture_output=True, timeout=300)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_") and k != "PYTHONPATH"}
    env["HOME"] = str(tmp_path / "home")
    where = subprocess.run([str(py), "-c", "import runner, runner.resources as r; print(runner.__file__); "
                            "print(r.tasks_dir()); print(r.models_dir())"],
                           capture_output=True, text=True, cwd=empty, env=env, check=True).stdout.split("\n")
    assert where[0].startswith(site), where
    assert where[1].startswith(site) and where[2].startswith(str(tmp_path / "home" / ".cache")), where
    runner_bin = [str(py), "-m", "runner"]
    plan = subprocess.run([*runner_bin, "run", "--scenario", "plan"], capture_output=True, text=True,
                          cwd=empty, env=env, timeout=120)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "errors.log" in plan.stdout
    suite = subprocess.run([*runner_bin, "suite", "--provider", "scripted"], capture_output=True, text=True,
                           cwd=empty, env=env, timeout=300)
    assert suite.returncode == 0, suite.stdout + suite.stderr
    assert "6/6" in suite.stdout
    assert (empty / "runs").is_dir()


LAYOUT = [
    "runner.__main__", "runner.cli", "runner.command", "runner.view", "runner.render", "runner.otel", "runner.start", "runner.suite", "runner.fanout",
    "runner.worker", "runner.interactive",
    "runner.harness", "runner.result", "runner.endpoints", "runner.local", "runner.local_app", "runner.openai_request", "runner.engine",
    "runner.chat_adapter", "runner.kvprefix", "runner.models", "runner.scripted", "runner.catalog", "runner.research",
    "runner.mcp", "runner.mcp_launcher", "runner.loop", "runner.steering", "runner.client",
    "runner.streaming", "runner.inprocess", "runner.store", "runner.trace", "runner.tools", "runner.tokens", "runner.replies", "runner.resources",
    "runner.cancel", "runner.procs", "runner.config", "runner.state", "runner.request", "runner.errors",
]
"""runner's modules from the top layer down (a package by its name): each imports only
modules below it. docs/architecture.md describes each layer."""


def test_the_layout_names_every_module() -> None:
    missing = [m for m in MODULES if ".".join(m.split(".")[:2]) not in LAYOUT]
    assert not missing, f"LAYOUT does not name: {missing}"


def test_dependencies_point_down_the_layout() -> None:
    """A module imports only modules listed below it in `LAYOUT`."""
    order = {m: i for i, m in enumerate(LAYOUT)}
    top = {m: ".".join(m.split(".")[:2]) for m in MODULES}
    upward = [f"{m} -> {d}" for m in MODULES for d in _runner_imports(_path(m))
              if top[d] != top[m] and order[top[d]] < order[top[m]]]
    assert not upward, "imports that point up the Layout list: " + ", ".join(upward)


STEERING = "runner.steering"
"""The steering: what the harness adds to steer a small model (a package)."""


def test_grading_imports_nothing_from_the_steering() -> None:
    """What a suite counts as an answer is decided apart from what steers the model: the
    grading module reaches no module of the steering, directly or through another, and
    importing it loads none."""
    graph = {m: _runner_imports(_path(m)) - {m} for m in MODULES}
    reached: set[str] = set()
    todo = ["runner.suite.grading"]
    while todo:
        for dep in graph[todo.pop()] - reached:
            reached.add(dep)
            todo.append(dep)
    assert "runner.replies" in reached
    assert not [m for m in reached if m.split(".")[:2] == STEERING.split(".")], sorted(reached)
    code = ("import sys, runner.suite.grading as g, runner.suite.format as f; "
            "g.grade(f.Task(id='t', prompt='Which?', check=f.Check(all=['x'])), 'read_file and list_files', 0); "
            f"print(sorted(m for m in sys.modules if m.split('.')[:2] == {STEERING.split('.')!r}))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout
