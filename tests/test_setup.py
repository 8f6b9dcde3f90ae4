"""The README's two commands set up a machine alone: CI runs the README's test command and
nothing else, and scripts/system_deps.sh (which both commands source) installs what is missing,
saying what and why, and is silent when all is there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_DEPS = ROOT / "scripts" / "system_deps.sh"


def _readme_commands() -> list[str]:
    """The commands of the README's "The two commands" block, their comments cut."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## The two commands\n+```bash\n(.*?)```", readme, re.S)
    assert block, "README.md has no bash block under '## The two commands'"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readmes_test_command_and_nothing_else() -> None:
    test_command = [c for c in _readme_commands() if "test" in c]
    assert test_command == ["./scripts/test.sh"], _readme_commands()
    body = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
            if line.strip() and not line.strip().startswith("#")]
    rest = [line for line in body if not line.startswith(("set -", "cd "))]
    assert rest == test_command, body


def test_both_readme_commands_set_up_the_machine_before_installing() -> None:
    for command in _readme_commands():
        script = (ROOT / command).read_text()
        assert 'source "$(dirname "$0")/system_deps.sh"' in script, command
        assert script.index("system_deps build") < script.index("bootstrap.sh\"\n"), command


def _run(parts: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/bash", "-c", f"source {SYSTEM_DEPS}; system_deps {parts}"],
                          capture_output=True, text=True, env=env, timeout=60)


def test_a_missing_part_is_named_with_its_reason_and_without_apt_get_the_commands_go_on(tmp_path: Path) -> None:
    """A PATH with the few tools the script uses but no apt-get, and PostgreSQL looked for where
    it is not: the script names the package and why, says it cannot install it, and returns 0."""
    for tool in ("id", "mktemp", "tail", "rm"):
        (tmp_path / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    proc = _run("postgres", {"PATH": str(tmp_path), "RUNNER_PG_BIN": str(tmp_path / "nowhere")})
    assert proc.returncode == 0, proc.stderr
    assert "installing postgresql-15 (the PostgresStore tests start a throwaway PostgreSQL 15 cluster)" in proc.stderr
    assert "no apt-get here: install postgresql-15 yourself" in proc.stderr


def test_an_unknown_part_is_an_error(tmp_path: Path) -> None:
    proc = _run("kettle", dict(os.environ))
    assert proc.returncode == 2
    assert "unknown part kettle" in proc.stderr


def test_on_a_set_up_machine_it_is_a_silent_no_op() -> None:
    """What the fast subset needs is here when the tests run (test.sh installed it): nothing to say."""
    start = time.monotonic()
    proc = _run("build node", dict(os.environ))
    elapsed_s = time.monotonic() - start
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stderr
    assert elapsed_s < 5, elapsed_s
