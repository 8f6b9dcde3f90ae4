"""What the command line prints where a person reads it, pastes from it or pipes it: hints that
name the store they were given, the settings that decide where runs are kept, tables in narrow
terminals, errors written to a file.

Every test drives the real `runner` CLI (in this process through `cli`, or as a child process
where the terminal or the process's files are the subject) against real servers on loopback.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from runner.scripted import ScriptedServer, ScriptedSettings
from runner.store import FileStore
from tests.conftest import cli, cli_json, cli_process, one_error


def _hint(stdout: str, label: str) -> list[str]:
    """The command after `label` (its start: "resume with" finds "resume with N > 3 (...):")
    in runner's output, as argv without the leading "runner": on the label's line, or, when
    that line would be too long, whole on the next one (a command to copy is never spread
    over lines)."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(label.strip().rstrip(":")))
    after = lines[at].partition(": runner ")
    text = "runner " + after[2] if after[1] else lines[at + 1].strip()
    argv = shlex.split(text)  # all of it: a command pasted as printed runs
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
    shown = cli("show", out["run_id"], runs_dir=None, cwd=tmp_path)  # ./runs: the hint needs nothing more
    assert _hint(shown.stdout, "resume with:") == ["resume", out["run_id"], "--max-turns", "N"], shown.stdout
    _, out = cli_json("run", "--scenario", "plan", "--max-turns", "1", runs_dir=runs, cwd=tmp_path)
    shown = cli("show", out["run_id"], runs_dir=runs, cwd=tmp_path)  # nor a folder $RUNNER_RUNS_DIR names
    assert _hint(shown.stdout, "resume with:") == ["resume", out["run_id"], "--max-turns", "N"], shown.stdout


def test_the_resume_hint_names_a_database_store_without_its_password(pg_url: str, tmp_path: Path) -> None:
    url = pg_url + "&password=hunter2"  # the throwaway cluster trusts its socket: the password is not asked
    for args in (("runs",), ("worker", "--idle-exit", "0.1")):
        empty = cli(*args, "--store", url, runs_dir=None, cwd=tmp_path)
        said = empty.stdout + empty.stderr
        assert empty.returncode == 0 and "hunter2" not in said and "password=***" in said, said
    capped = cli("run", "--scenario", "plan", "--max-turns", "1", "--store", url, runs_dir=None, cwd=tmp_path)
    assert capped.returncode == 3, capped.stderr
    assert "hunter2" not in capped.stdout + capped.stderr
    again = _hint(capped.stdout, "resume with: ")
    assert again[2:4] == ["--store", pg_url + "&password=***"], capped.stdout
    trace_at = _hint(capped.stdout, "trace: ")
    assert trace_at[2:] == ["--store", pg_url + "&password=***"], capped.stdout


def test_config_show_says_where_and_how_runs_are_kept(tmp_path: Path) -> None:
    """Every setting that decides where runs are kept and what their commits survive, with its
    source; a store URL's password never shown; a value a command would refuse marked so."""

    def shown(env: dict[str, str | None]) -> dict[str, tuple[str, str]]:
        proc = cli("config", "show", "--json", runs_dir=None, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        return {r["name"]: (r["value"], r["source"]) for r in json.loads(proc.stdout)["settings"]}

    unset: dict[str, str | None] = {"RUNNER_STORE": None, "RUNNER_DURABILITY": None, "RUNNER_LEASE_S": None,
                                    "RUNNER_CONFIG": str(tmp_path / "none.toml"), "RUNNER_MODELS_DIR": str(tmp_path)}
    rows = shown(unset)
    assert rows["runs_dir"] == ("./runs", "default") and rows["store"] == ("(the runs directory)", "default")
    assert rows["durability"] == ("process", "default") and rows["lease_s"][1] == "default"
    # no model set: the one a PROMPT alone runs on, unless a base URL is set (its model is needed)
    default = json.loads((Path(__file__).parents[1] / "models" / "manifest.json").read_text())["default"]
    assert rows["model"] == (f"{default} (not pulled)", "manifest default")
    assert shown({**unset, "RUNNER_BASE_URL": "http://127.0.0.1:9"})["model"] == ("", "default")
    rows = shown({**unset, "RUNNER_RUNS_DIR": str(tmp_path / "kept"), "RUNNER_DURABILITY": "power",
                  "RUNNER_STORE": "postgresql://bob:hunter2@db.example/runs", "RUNNER_LEASE_S": "12"})
    assert rows["runs_dir"] == (str(tmp_path / "kept"), "env RUNNER_RUNS_DIR")
    assert rows["store"] == ("postgresql://bob:***@db.example/runs", "env RUNNER_STORE")
    assert rows["durability"] == ("power", "env RUNNER_DURABILITY") and rows["lease_s"] == ("12", "env RUNNER_LEASE_S")
    rows = shown({**unset, "RUNNER_DURABILITY": "bogus"})
    assert rows["durability"] == ("bogus (refused)", "env RUNNER_DURABILITY")
    table = cli("config", "show", runs_dir=None, cwd=tmp_path, env={**unset, "RUNNER_STORE": "postgresql:///r?password=pw"})
    assert "pw" not in table.stdout.replace("password", "") and "durability" in table.stdout, table.stdout


def test_config_show_marks_every_store_a_command_refuses(tmp_path: Path) -> None:
    """A store or runs directory `runner runs` refuses is marked "(refused)" by `config show`,
    and one it takes is not."""
    (tmp_path / "a-file").write_text("")
    base = {"RUNNER_STORE": None, "RUNNER_RUNS_DIR": None, "RUNNER_CONFIG": str(tmp_path / "none.toml")}
    for env, name, refused in [({"RUNNER_STORE": "garbage://"}, "store", True),
                               ({"RUNNER_STORE": str(tmp_path / "a-file")}, "store", True),
                               ({"RUNNER_STORE": "~nosuchuser4242/runs"}, "store", True),
                               ({"RUNNER_RUNS_DIR": str(tmp_path / "a-file")}, "runs_dir", True),
                               ({"RUNNER_STORE": str(tmp_path / "kept")}, "store", False),
                               ({"RUNNER_STORE": "postgresql://bob:pw@db.example/runs"}, "store", False)]:
        full = {**base, **env}
        proc = cli_process("config", "show", "--json", runs_dir=None, cwd=tmp_path, env=full)
        assert proc.returncode == 0, proc.stderr
        value = {r["name"]: r["value"] for r in json.loads(proc.stdout)["settings"]}[name]
        assert value.endswith(" (refused)") == refused, (env, value)
        if not value.startswith("postgresql"):  # a command refuses it too, or takes it
            listed = cli_process("runs", runs_dir=None, cwd=tmp_path, env=full)
            assert (listed.returncode == 2) == refused, (env, listed.stderr)
            assert not refused or one_error(listed.stderr)


def test_trace_lines_say_their_time_is_ms_since_the_start_and_json_is_unchanged(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = cli_process("run", "--scenario", "plan", "--latency-ms", "400", "--json", runs_dir=runs)
    run_id = json.loads(proc.stdout)["run_id"]
    shown = cli_process("trace", run_id, runs_dir=runs)
    assert shown.returncode == 0, shown.stderr
    header, *lines = shown.stdout.splitlines()
    assert header.split() == ["since", "start", "event", "fields"]
    events = [line for line in lines if line.startswith("+")]
    assert len(events) == 9 and lines[len(events)].startswith("stopped: completed"), shown.stdout
    times_ms = [int(line[1:10].replace(",", "")) for line in events]
    assert all(line[10:15] == " ms  " for line in events)
    assert times_ms[0] == 0 and times_ms == sorted(times_ms) and 1_200 <= times_ms[-1] < 60_000  # 3 turns of 400 ms
    assert header.index("event") == events[0].index("run_started")  # the header stands over its column
    traced = cli_process("trace", run_id, "--json", runs_dir=runs)
    written = [json.loads(line) for line in (runs / run_id / "trace.jsonl").read_text().splitlines()]
    assert [json.loads(line) for line in traced.stdout.splitlines()] == [  # --json: the events, no header
        {k: v for k, v in e.items() if k != "seq"} for e in written]


@pytest.mark.llama
def test_a_failed_serve_reports_its_log_and_leaves_no_file_behind(tmp_path: Path) -> None:
    """`runner serve` on a file llama.cpp cannot load: the error quotes the server's log, and
    the temporary log it was written to is gone (the error names no file that is not there).
    `runner run` on it keeps no run; with --keep, one stopped `interrupted` that a resume retries."""
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"not a gguf at all")
    temp = tmp_path / "tmp"
    temp.mkdir()
    for args in (("serve", "--model", str(corrupt)), ("run", "hi", "--model", str(corrupt))):
        proc = cli_process(*args, runs_dir=tmp_path / "runs", env={"TMPDIR": str(temp)}, timeout=120)
        err = proc.stderr[proc.stderr.find("error: "):]  # after what it started
        if args[0] == "run":  # the run it was for asked nothing: not kept, as a run that never got a reply
            assert "\nnot kept: run " in err and not (tmp_path / "runs").exists(), err
            err = err[:err.index("not kept: run ")]
        said = one_error(err)
        assert proc.returncode == 1 and "Failed to load model" in said, proc.stderr
        assert "runner-local-" not in said and list(temp.iterdir()) == [], (said, list(temp.iterdir()))
    kept = cli_process("run", "hi", "--model", str(corrupt), "--keep", "--json", runs_dir=tmp_path / "runs",
                       timeout=120)
    out = json.loads(kept.stdout)
    assert kept.returncode == 3 and out["status"] == "interrupted", kept.stderr
    assert out["interruption"]["type"] == "provider_unavailable" and "Failed to load model" in out["reason"]
    events = [json.loads(line) for line in (tmp_path / "runs" / out["run_id"] / "trace.jsonl").read_text().splitlines()]
    assert [e["type"] for e in events][-1] == "run_stopped" and "turn" not in [e["type"] for e in events]


def test_a_narrow_terminal_keeps_run_ids_whole_and_leaves_other_columns_out(runs: Path) -> None:
    ids = [cli_json("run", "--scenario", s, runs_dir=runs)[1]["run_id"] for s in ("plan", "runaway")]
    for columns in (59, 45, 30, 12):
        table = cli("runs", runs_dir=runs, env={"COLUMNS": str(columns)})
        lines = table.stdout.splitlines()
        assert table.returncode == 0 and "…" not in table.stdout, table.stdout
        assert [line.split()[0] for line in lines[2:]] == ids[::-1], table.stdout  # newest first, each id whole
        assert all(len(line.rstrip()) <= max(columns, len(ids[0])) for line in lines), table.stdout
    assert "status" in cli("runs", runs_dir=runs, env={"COLUMNS": "59"}).stdout.splitlines()[0]


def test_show_wraps_why_a_run_stopped_instead_of_cutting_it(runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "unknown_tool", runs_dir=runs)
    assert code == 1 and out["status"] == "failed"
    shown = cli("show", out["run_id"], runs_dir=runs, env={"COLUMNS": "80"}).stdout.splitlines()
    assert max(len(line) for line in shown) <= 80
    at = next(i for i, line in enumerate(shown) if line.startswith("stopped: failed"))
    said = " ".join(line.strip() for line in shown[at:])
    assert f"stopped: failed ({out['reason']})" in said and out["error"]["message"] in said, shown[at:]


def test_runs_says_whether_the_runs_folder_is_missing_or_empty(tmp_path: Path) -> None:
    for args in (("runs",), ("runs", "--totals")):
        missing = cli(*args, runs_dir=tmp_path / "typo")
        assert missing.returncode == 0 and missing.stdout == f"no runs: {tmp_path / 'typo'} does not exist (yet)\n"
    assert not (tmp_path / "typo").exists()
    (tmp_path / "empty").mkdir()
    empty = cli("runs", runs_dir=tmp_path / "empty")
    assert empty.returncode == 0 and empty.stdout == f"no runs in {tmp_path / 'empty'}\n"


def test_text_columns_take_what_their_cells_need_and_leave_the_rest_to_the_prompt_and_reason(runs: Path) -> None:
    for scenario in ("plan", "stuck"):
        cli_json("run", "--scenario", scenario, runs_dir=runs)
    _, shown_json = cli_json("runs", "--limit", "1", runs_dir=runs)
    task = next(m["content"] for m in FileStore(runs).load(shown_json[0]["run_id"]).model_dump()["messages"]
                if m["role"] == "user")
    reason = ("repeated call: list_files was called with the same arguments 3 times in a row; "
              "the model is not making progress")
    for columns in (100, 120, 200):
        table = cli("runs", runs_dir=runs, env={"COLUMNS": str(columns)}).stdout
        head, _, first, _ = table.splitlines()
        assert head.split()[-3:] == ["model", "prompt", "reason"], table
        assert head.index("prompt") - head.index("model") == len("model") + 1, table  # "stuck", "plan": 5 wide
        prompt = first[head.index("prompt"):head.index("reason")].rstrip()
        assert prompt and task.startswith(prompt.rstrip("…")), table  # the stuck run's task, cut where it must be
        shown = first[head.index("reason"):].rstrip()
        assert shown == (reason if len(reason) <= columns - head.index("reason") else shown[:-1] + "…"), table
        room = (columns - head.index("prompt")) // 2 - 1  # the two share what is left
        assert reason.startswith(shown.rstrip("…")) and len(shown) >= min(len(reason), room), table
        assert max(len(line.rstrip()) for line in table.splitlines()) <= columns, table


def test_a_whole_number_setting_refuses_3_0_on_the_command_line_as_in_a_config_file(runs: Path,
                                                                                     tmp_path: Path) -> None:
    alone = {"RUNNER_CONFIG": str(tmp_path / "none.toml")}
    for args in (("run", "--scenario", "plan", "--max-turns", "3.0"), ("runs", "--limit", "2.0"),
                 ("run", "--scenario", "plan", "--max-retries=1.5")):
        proc = cli(*args, runs_dir=runs, cwd=tmp_path, env=alone)
        assert proc.returncode == 2 and "is not a whole number" in proc.stderr, (args, proc.stderr)
        assert proc.stderr.startswith("Usage: runner ") and proc.stdout == "", proc.stderr
    (tmp_path / "runner.toml").write_text("max_turns = 3.0\n")
    proc = cli("run", "--scenario", "plan", runs_dir=runs, cwd=tmp_path, env=alone)
    assert proc.returncode == 2 and "max_turns must be a whole number, got 3.0" in one_error(proc.stderr)
    (tmp_path / "runner.toml").write_text("max_turns = 3\n")
    code, out = cli_json("run", "--scenario", "plan", "--max-retries", " 2 ", runs_dir=runs, cwd=tmp_path, env=alone)
    assert code == 0 and out["status"] == "completed"
    assert not runs.exists() or len(json.loads(cli("runs", "--json", runs_dir=runs).stdout)) == 1


def _stderr_on_a_terminal(args: list[str], columns: int, env: dict[str, str]) -> str:
    """What `python -m runner ARGS` writes to a stderr that is a terminal `columns` wide (a
    pseudo-terminal; stdout stays a pipe)."""
    import fcntl
    import pty
    import struct
    import termios

    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    child_env = {k: v for k, v in {**os.environ, **env}.items() if k != "COLUMNS"}
    with subprocess.Popen([sys.executable, "-m", "runner", *args], stdout=subprocess.PIPE, stderr=side,
                          stdin=subprocess.DEVNULL, env=child_env) as proc:
        os.close(side)
        said = b""
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the child closed its side
                break
            if not chunk:
                break
            said += chunk
        proc.wait(timeout=60)
    os.close(main)
    return said.decode().replace("\r\n", "\n")


def test_errors_wrap_on_a_terminal_and_stay_one_line_in_a_file(tmp_path: Path) -> None:
    args = ["run", "--scenario", "nosuch", "--runs-dir", str(tmp_path / "runs")]
    env = {"RUNNER_CONFIG": str(tmp_path / "none.toml")}
    on_terminal = _stderr_on_a_terminal(args, 50, env)
    lines = on_terminal.rstrip("\n").splitlines()
    assert len(lines) > 2 and all(len(line) <= 50 for line in lines), on_terminal
    assert lines[0].startswith("error: unknown scenario 'nosuch'") and all(x.startswith("  ") for x in lines[1:])
    with open(tmp_path / "errors.log", "w") as log:  # `runner ... 2>errors.log`, a terminal 50 wide or not
        code = subprocess.run([sys.executable, "-m", "runner", *args], stderr=log, stdout=subprocess.DEVNULL,
                              env={**os.environ, **env, "COLUMNS": "50"}, timeout=60).returncode
    in_file = (tmp_path / "errors.log").read_text()
    assert code == 2 and in_file.count("\n") == 1 and len(in_file) > 50, in_file
    assert in_file.rstrip("\n") == " ".join(line.strip() for line in lines)


def test_database_errors_never_print_the_store_password(pg_url: str, tmp_path: Path) -> None:
    """The store's own errors (a run it does not hold, a server it cannot reach) name the store
    with its password as ***."""
    url = pg_url + "&password=hunter2"
    missing = cli("show", "nosuchrun", "--store", url, runs_dir=None, cwd=tmp_path)
    assert missing.returncode != 0 and "nosuchrun" in missing.stderr, missing.stderr
    assert "hunter2" not in missing.stdout + missing.stderr and "password=***" in missing.stderr
    gone = cli("runs", "--store", "postgresql://bob:hunter2@127.0.0.1:9/runs", runs_dir=None, cwd=tmp_path)
    assert gone.returncode != 0 and "cannot reach the run store" in gone.stderr, gone.stderr
    assert "hunter2" not in gone.stdout + gone.stderr and "bob:***@" in gone.stderr


def test_a_command_to_copy_is_never_spread_over_lines(tmp_path: Path) -> None:
    """In 80 columns a long command goes whole on the line after its label; pasted as printed
    into a shell, it works."""
    runs = tmp_path / "my runs" / "a b"
    stopped = cli("run", "--scenario", "destructive", "--runs-dir", str(runs), runs_dir=None, cwd=tmp_path,
                  env={"COLUMNS": "80"})
    assert stopped.returncode == 3, stopped.stderr
    lines = stopped.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "reject with:")
    command = lines[at + 1].strip()
    assert command.startswith("runner resume ") and command.endswith("--reason TEXT") and len(command) > 80
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # where `runner` is
    done = subprocess.run(command.replace("TEXT", "'not today'"), shell=True, cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "80", "PATH": path})
    assert done.returncode == 0 and "status=completed" in done.stdout, done.stdout + done.stderr


def test_a_budget_of_0_lifts_the_budget_as_a_turn_cap_of_0_lifts_the_cap(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    code, out = cli_json("run", "--scenario", "runaway", "--max-budget", "0.002", runs_dir=runs)
    assert code == 3 and out["status"] == "budget_exceeded"
    code, out = cli_json("resume", out["run_id"], "--max-budget", "0", "--max-turns", "6", runs_dir=runs)
    assert code == 3 and out["status"] == "max_turns_exceeded" and out["turns"] == 6, out
    code, out = cli_json("run", "--scenario", "plan", "--max-budget", "0", runs_dir=runs)
    assert code == 0 and out["status"] == "completed"


def test_a_died_run_given_its_key_on_the_command_line_is_resumed_with_it(tmp_path: Path) -> None:
    """The commands printed for a run killed mid-way carry --api-key KEY when the run was given
    its key with --api-key (never recorded), as the hints of a stopped run do."""
    runs = tmp_path / "runs"
    with ScriptedServer(ScriptedSettings()) as server:
        killed = cli_process("run", "--scenario", "plan", "--base-url", server.base_url, "--api-key",
                             "sk-given-on-the-line-1234", runs_dir=runs, env={"RUNNER_CRASH_AT": "reply:2"})
        assert killed.returncode == -9, killed.stderr
        (run_id,) = [p.name for p in runs.iterdir() if not p.name.startswith(".")]
        shown = cli("show", run_id, runs_dir=runs)
        assert _hint(shown.stdout, "resume with:") == ["resume", run_id, "--api-key", "KEY"], shown.stdout


def test_an_answer_of_several_lines_prints_as_written(tmp_path: Path) -> None:
    from tests.fakeprovider import FakeProvider, completion

    text = "Two findings:\n\n- errors.log: a timeout\n- access.log: nothing"
    with FakeProvider(lambda body: completion({"role": "assistant", "content": text})) as fake:
        proc = cli("run", "hi", "--base-url", fake.base_url, "--model", "m", runs_dir=tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    at = lines.index("   answer:")
    assert lines[at + 1:at + 5] == ["     Two findings:", "", "     - errors.log: a timeout", "     - access.log: nothing"]
    assert "\\n" not in proc.stdout


def test_runs_past_the_offset_says_so(runs: Path) -> None:
    cli_json("run", "--scenario", "plan", runs_dir=runs)
    shown = cli("runs", "--offset", "5", runs_dir=runs)
    assert shown.returncode == 0 and shown.stdout.strip() == f"no runs in {runs} past the first 5 (--offset)"


def test_show_names_the_folder_and_ends_with_the_whole_answer_wrapped(runs: Path, tmp_path: Path) -> None:
    from runner import render
    from runner.store import FileStore

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.txt").write_text("alpha\n")
    code, out = cli_json("run", "--scenario", "plan", "--workspace", str(tmp_path / "mine"), runs_dir=runs)
    assert code == 0, out
    shown = cli("show", out["run_id"], runs_dir=runs, env={"COLUMNS": "80"}).stdout.splitlines()
    at = next(i for i, line in enumerate(shown) if line.split()[:1] == ["folder"])  # a long path: on a line of its own
    assert " ".join(line.strip() for line in shown[at:at + 3]).startswith(
        f"folder {tmp_path / 'mine'} · its tools work on a copy")
    assert all(len(line) <= 80 or line.strip() == str(tmp_path / "mine") for line in shown)  # only the path, whole
    state = FileStore(runs).load(out["run_id"])
    words = [f"word{i}" for i in range(40)]

    def answered(text: str) -> list[str]:
        state.messages[-1] = state.messages[-1].model_copy(update={"content": text})
        return render.transcript_lines(state, [], width=80)

    lines = answered(" ".join(words))
    at = next(i for i, line in enumerate(lines) if line.startswith("answer: word0 "))
    assert all(len(line) <= 80 for line in lines[at:])
    assert " ".join(line.strip() for line in lines[at:]).split()[1:41] == words  # all of it, none cut
    long = answered(" ".join(words * 5))
    at = next(i for i, line in enumerate(long) if line.startswith("answer: word0 "))
    assert long[at + render.ANSWER_LINES - 1].endswith(" …") and long[at + render.ANSWER_LINES].startswith("stopped")


def test_show_marks_a_resume_after_the_verdict_given_with_it(runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "destructive", runs_dir=runs)
    assert code == 3 and out["status"] == "interrupted", out
    done = cli("resume", out["run_id"], "--reject", "c2", "--reason", "keep it", runs_dir=runs)
    assert done.returncode == 0, done.stderr
    lines = cli("show", out["run_id"], runs_dir=runs).stdout.splitlines()
    mark = next(i for i, line in enumerate(lines) if line.startswith("── resumed after turn 2 · "))
    assert lines[mark - 2:mark] == ["    The user declined this call: keep it", ""]
    assert lines[mark + 2].startswith("── turn 3 ")
