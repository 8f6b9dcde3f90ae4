"""What the command line prints where a person reads it, pastes from it or pipes it: hints that
name the store they were given, the settings that decide where runs are kept, tables in narrow
terminals, errors written to a file.

Every test drives the real `runner` CLI (in this process through `cli`, or as a child process
where the terminal or the process's files are the subject) against real servers on loopback.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from runner.scripted import ScriptedServer, ScriptedSettings
from tests.conftest import cli, cli_json


def _hint(stdout: str, label: str) -> list[str]:
    """The command after `label` in runner's output (its wrapped lines joined), as argv
    without the leading "runner"."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(label))
    text = lines[at].strip().removeprefix(label)
    for line in lines[at + 1:]:
        if not line.startswith("      ") or line.strip().startswith(("resume with:", "if the provider")):
            break
        text += " " + line.strip()
    argv = shlex.split(text.split("   (")[0])
    assert argv[0] == "runner", text
    return argv[1:]


def test_the_resume_hint_names_the_runs_dir_it_was_given(tmp_path: Path) -> None:
    """A run kept in a runs directory that is not ./runs (given with --runs-dir, even one with
    a space in its name) stops resumable: the printed command, typed as printed, finds it."""
    runs = tmp_path / "my runs"
    with ScriptedServer(ScriptedSettings()) as first:
        capped = cli("run", "--scenario", "plan", "--base-url", first.base_url, "--max-turns", "1",
                     "--max-retries", "0", "--runs-dir", str(runs), runs_dir=None, cwd=tmp_path)
        assert capped.returncode == 3, capped.stderr
        again = _hint(capped.stdout, "resume with: ")
        assert again[2:4] == ["--runs-dir", str(runs)], capped.stdout
    # the provider is gone: provider unavailable, stopped interrupted
    gone = cli(*[("5" if a == "N" else a) for a in again], runs_dir=None, cwd=tmp_path)
    assert gone.returncode == 3 and "interrupted" in gone.stdout, gone.stdout + gone.stderr
    assert _hint(gone.stdout, "resume with: ")[2:4] == ["--runs-dir", str(runs)], gone.stdout
    moved = _hint(gone.stdout, "if the provider moved: ")
    with ScriptedServer(ScriptedSettings()) as second:
        done = cli(*[(second.base_url if a == "URL" else a) for a in moved], runs_dir=None, cwd=tmp_path)
        assert done.returncode == 0 and "status=completed" in done.stdout, done.stdout + done.stderr
    out = json.loads(cli("run", "--scenario", "plan", "--max-turns", "1", "--json", runs_dir=None, cwd=tmp_path).stdout)
    bare = f"resume with: runner resume {out['run_id']} --max-turns N"
    shown = cli("show", out["run_id"], runs_dir=None, cwd=tmp_path)  # ./runs: the hint needs nothing more
    assert bare in shown.stdout, shown.stdout
    _, out = cli_json("run", "--scenario", "plan", "--max-turns", "1", runs_dir=runs, cwd=tmp_path)
    bare = f"resume with: runner resume {out['run_id']} --max-turns N"
    shown = cli("show", out["run_id"], runs_dir=runs, cwd=tmp_path)  # nor a folder $RUNNER_RUNS_DIR names
    assert bare in shown.stdout, shown.stdout


def test_the_resume_hint_names_a_database_store_without_its_password(pg_url: str, tmp_path: Path) -> None:
    url = pg_url + "&password=hunter2"  # the throwaway cluster trusts its socket: the password is not asked
    capped = cli("run", "--scenario", "plan", "--max-turns", "1", "--store", url, runs_dir=None, cwd=tmp_path)
    assert capped.returncode == 3, capped.stderr
    assert "hunter2" not in capped.stdout + capped.stderr
    again = _hint(capped.stdout, "resume with: ")
    assert again[2:4] == ["--store", pg_url + "&password=***"], capped.stdout
    trace_at = _hint(capped.stdout, "trace: ")
    assert trace_at[2:] == ["--store", pg_url + "&password=***"], capped.stdout
