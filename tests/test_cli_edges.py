"""The command line where a new user meets it: errors, Ctrl-C, narrow terminals, odd endpoints.

Every test drives the real `runner` CLI against real servers on loopback: in this process, or
in a child process where a signal or the process's own state is the subject.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from runner import store
from runner.errors import ModelNotFound
from runner.scripted import ScriptedServer, ScriptedSettings, parse_faults
from tests.conftest import cli, cli_json, cli_process, one_error


def _popen(*args: str, runs: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "runner", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RUNNER_RUNS_DIR": str(runs), **env})


def _wait_for(predicate: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def test_scenario_against_a_provider_already_serving_with_a_fault(runs: Path) -> None:
    settings = ScriptedSettings(faults=parse_faults("500@1"))
    with ScriptedServer(settings) as server:
        code, out = cli_json("run", "--scenario", "plan", "--base-url", server.base_url, runs_dir=runs)
        assert (code, out["status"], out["model"]) == (0, "completed", "scripted/plan")
        assert ("plan", 1) in server.requests  # it went to this server, and the fault was retried


def test_fault_with_base_url_is_a_usage_error(runs: Path) -> None:
    proc = cli("run", "--scenario", "plan", "--base-url", "http://127.0.0.1:9/v1", "--fault", "500@1", runs_dir=runs)
    assert proc.returncode == 2 and "runner scripted serve --fault" in proc.stderr


class _HtmlHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = b"<html>\n<head><title>404 Not Found</title></head>\n<body>\n<h1>Not Found</h1>\n" * 5
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def html_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HtmlHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_an_html_error_page_is_one_line_with_a_hint(runs: Path, html_server: str) -> None:
    code, out = cli_json("run", "hi", "--base-url", html_server, "--model", "m", runs_dir=runs)
    assert code == 1 and out["status"] == "failed"
    assert "\n" not in out["reason"] and "<" not in out["reason"]
    assert "404 Not Found" in out["reason"] and "/v1" in out["reason"]


def test_runs_table_fits_80_columns_and_keeps_ids_and_numbers_whole(runs: Path) -> None:
    ids = [cli_json("run", "--scenario", s, runs_dir=runs)[1]["run_id"] for s in ("plan", "denied", "destructive")]
    proc = cli("runs", runs_dir=runs, env={"COLUMNS": "80"})
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, proc.stdout
    for run_id in ids:
        assert run_id in proc.stdout
    assert "0.002712" in proc.stdout  # plan's cost, never cut
    models = cli("models", "list", runs_dir=runs, env={"COLUMNS": "80"})
    assert models.returncode == 0 and "smollm2-135m-instruct" in models.stdout
    table, _, paths = models.stdout.partition("where each is (or goes when pulled):\n")
    assert max(len(line) for line in table.splitlines()) <= 80, models.stdout
    assert all(line.split()[1].startswith("/") for line in paths.splitlines())  # whole, however long


def test_debug_is_accepted_anywhere_and_a_bug_hint_is_not_a_usage_error(runs: Path) -> None:
    proc = cli_process("runs", "--debug", runs_dir=runs)
    assert proc.returncode == 0
    proc = cli("trace", "no-such-run", runs_dir=runs)
    assert proc.returncode == 2 and proc.stderr.startswith("error:") and "Traceback" not in proc.stderr


def test_ctrl_c_mid_suite_writes_the_report_of_the_tasks_done(runs: Path) -> None:
    proc = _popen("suite", "--provider", "scripted", "--latency-ms", "150", runs=runs)
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the first task's line: the second task is now in flight
    if first.startswith("created runs directory"):
        first = proc.stderr.readline()
    assert "timeout_file" in first, first
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert "Traceback" not in err and "crashed" not in out + err
    report = json.loads(sorted(runs.glob("suite-*.json"))[-1].read_text())
    assert report["cancelled"] is True
    statuses = [r["status"] for r in report["results"]]
    assert statuses[0] == "completed" and statuses[-1] == "interrupted" and len(statuses) < 6
    stopped = report["results"][-1]
    assert stopped["reason"] == "cancelled: stopped by Ctrl-C (SIGINT)"
    assert f"runner resume {stopped['run_id']}" in err


@pytest.mark.parametrize(("sig", "said"), [(signal.SIGTERM, "stopped by SIGTERM"),
                                           (signal.SIGINT, "stopped by Ctrl-C (SIGINT)")])
def test_a_run_stopped_by_a_signal_says_which(runs: Path, sig: signal.Signals, said: str) -> None:
    proc = _popen("run", "--scenario", "plan", "--latency-ms", "3000", "--json", runs=runs)
    _wait_for(lambda: any(runs.glob("*/trace.jsonl")) and "run_started" in next(runs.glob("*/trace.jsonl")).read_text())
    time.sleep(0.3)  # the first request is in flight
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    result = json.loads(out)
    assert result["status"] == "interrupted" and result["reason"].startswith(f"cancelled: {said}"), result
    assert result["interruption"] == {"type": "cancelled", "reason": said}
    shown = cli("show", result["run_id"], runs_dir=runs)
    assert f"cancelled: {said}" in shown.stdout and "pressed Stop" not in shown.stdout, shown.stdout


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_early_or_twice_keeps_the_run_resumable_and_prints_its_id(runs: Path, presses: int) -> None:
    proc = _popen("run", "--scenario", "plan", "--latency-ms", "3000", runs=runs)
    _wait_for(lambda: any(runs.glob("*/journal.jsonl")))
    for _ in range(presses):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, out + err
    (state,) = store.list_runs(runs)
    assert state.status == "interrupted" and "crashed" not in (state.reason or "")
    assert state.run_id in out + err
    assert "Traceback" not in err


def test_a_folder_runs_cannot_be_kept_in_is_advised_by_the_option_that_named_it(runs: Path) -> None:
    nope = "/proc/runner-nope"  # no folder can be made in /proc, even as root
    for args, env, named in [(("--store", nope), {}, "--store"),
                             (("--runs-dir", nope), {}, "--runs-dir"),
                             ((), {"RUNNER_STORE": nope}, "$RUNNER_STORE"),
                             ((), {"RUNNER_RUNS_DIR": nope}, "$RUNNER_RUNS_DIR")]:
        proc = cli_process("run", "--scenario", "plan", *args, runs_dir=None, env={"RUNNER_STORE": None, **env})
        assert proc.returncode == 1, proc.stderr
        assert one_error(proc.stderr) == (f"error: cannot keep runs in {nope}: No such file or directory (choose "
                                          f"another folder with {named})"), (args, env, proc.stderr)


def test_resume_of_a_run_waiting_for_approval_needs_a_verdict(runs: Path) -> None:
    _, out = cli_json("run", "--scenario", "destructive", runs_dir=runs)
    proc = cli("resume", out["run_id"], runs_dir=runs)
    assert proc.returncode == 2 and "--approve c2 or --reject c2" in proc.stderr
    assert store.load(runs, out["run_id"]).turns == out["turns"]  # nothing was asked or run


def test_an_unreachable_postgres_store_fails_at_once_with_its_cause(runs: Path, tmp_path: Path) -> None:
    began = time.monotonic()
    proc = cli("runs", "--store", f"postgresql:///runner?host={tmp_path}/nowhere", runs_dir=runs)
    assert proc.returncode == 1 and "No such file or directory" in proc.stderr
    assert one_error(proc.stderr)
    assert time.monotonic() - began < 25  # not the pool's 30 s wait


def test_runs_status_is_checked_and_a_404_suggests_v1(runs: Path, html_server: str) -> None:
    proc = cli("runs", "--status", "nope", runs_dir=runs)
    assert proc.returncode == 2 and "--status must be one of" in proc.stderr
    code, out = cli_json("run", "hi", "--base-url", html_server, "--model", "m", runs_dir=runs)
    assert code == 1 and "did you mean" in out["reason"] and out["reason"].count("/v1") >= 2


def test_suite_table_fits_80_columns(runs: Path) -> None:
    proc = cli("suite", "--provider", "scripted", "--repeat", "2", runs_dir=runs, env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80, proc.stdout
    assert "12/12" in proc.stdout and "report: " in proc.stderr


def test_an_empty_prompt_or_prompt_file_and_a_port_out_of_range_are_usage_errors(runs: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    for args, message in ((["run", "--prompt-file", str(empty), "--scenario", "plan"], "is empty"),
                          (["run", "", "--scenario", "plan"], "the PROMPT is empty"),
                          (["view", "--port", "99999"], "65535"),
                          (["scripted", "serve", "--port", "99999"], "65535")):
        serves = args[0] in ("view", "scripted")  # in a child process: refused or not, it ends
        proc = (cli_process if serves else cli)(*args, runs_dir=runs)
        assert proc.returncode == 2 and message in " ".join(proc.stderr.split()), (args, proc.stderr)
        assert "bug in runner" not in proc.stderr
    assert not runs.exists()  # nothing was run


def test_errors_are_one_line_in_a_file_and_usage_errors_say_what_is_wrong(runs: Path, tmp_path: Path) -> None:
    proc = cli("run", "--scenario", "nosuch", runs_dir=runs)
    assert proc.returncode == 2 and "known: plan, runaway" in one_error(proc.stderr)
    narrow = cli("run", "--scenario", "nosuch", runs_dir=runs, env={"COLUMNS": "50"})  # stderr is no terminal
    assert narrow.stderr == proc.stderr and proc.stderr.count("\n") == 1 and len(proc.stderr) > 80
    for args, said in [
        (("run", ""), "error: the PROMPT is empty"),
        (("runs", "--status", "nosuch"), "--status must be one of running,"),
        (("experiments", "nosuch"), "error: unknown experiment(s) nosuch; known: turn_cap,"),
        (("experiments", "approval", "--out", str(tmp_path / "a-file")), f"--out {tmp_path / 'a-file'} is a file, not"),
        (("runs", "--runs-dir", str(tmp_path / "a-file")), f"the runs directory {tmp_path / 'a-file'} is a file"),
        (("run", "--scenario", "plan", "--store", "bogus://x"), "the store bogus://x has a URL scheme runner does not "
                                                                 "know; give a postgresql:// or postgres:// URL"),
        (("runs", "--prune", "--dry-run", "--totals"), "--totals does not go with --prune"),
        (("suite", "--provider", "scripted", "--base-url", "http://127.0.0.1:9/v1"), "--provider scripted has no"),
        (("suite", "--provider", "local", "--base-url", "http://[::1"), "is not a URL runner can reach: Invalid IPv6"),
        (("suite", "--resume", "README.md"), "cannot read the suite report README.md (read as README.json)"),
        (("suite", "--resume", "notes.txt"), "--resume notes.txt: not a suite report"),
        (("suite", "--resume", "other.json"), "cannot read the suite report other.json: Field required (at model)"),
        (("suite", "--provider", "scripted", "--policy", "+nope"), "--policy +nope: no such policy"),
        (("suite", "--provider", "scripted", "--max-turns", "0"), "--max-turns 0: a suite always caps its tasks"),
    ]:
        for name in ("a-file", "README.md", "notes.txt"):
            (tmp_path / name).write_text("# not a report\n")
        (tmp_path / "other.json").write_text('{"results": []}')
        proc = cli(*args, runs_dir=runs, cwd=tmp_path)
        assert proc.returncode == 2 and said in one_error(proc.stderr), (args, proc.stderr)
    assert not (tmp_path / "bogus:").exists()
    for args, said in [(("runs", "--totals", "--by", "week"), "'week' is not one of 'model', 'day', 'status'."),
                       (("show", "x", "--format", "nope"), "'nope' is not one of 'text', 'md', 'json'."),
                       (("scripted", "serve", "--latency-ms", "-5"), "-5 is not in the range x>=0.0.")]:
        proc = cli(*args, runs_dir=runs)
        assert proc.returncode == 2 and said in proc.stderr and "Value error" not in proc.stderr, proc.stderr


def test_config_file_and_environment_values_keep_the_options_bounds(runs: Path, tmp_path: Path) -> None:
    for line, said in [("max_turns = -3", "runner.toml: max_turns must be at least 0, got -3"),
                       ("price_in_usd_per_mtok = -5", "runner.toml: price_in_usd_per_mtok must be at least 0, got -5"),
                       ("timeout_s = 0", "runner.toml: timeout_s must be at least 0.001, got 0")]:
        (tmp_path / "runner.toml").write_text(line + "\n")
        for args in (("run", "--scenario", "plan"), ("config", "show")):
            proc = cli(*args, runs_dir=runs, cwd=tmp_path, env={"RUNNER_CONFIG": str(tmp_path / "none.toml")})
            assert proc.returncode == 2 and said in one_error(proc.stderr), (args, proc.stderr)
    (tmp_path / "runner.toml").write_text("max_turns = 0\nprice_in_usd_per_mtok = 0\n")
    code, out = cli_json("run", "--scenario", "plan", runs_dir=runs, cwd=tmp_path)
    assert code == 0 and out["status"] == "completed"


def test_config_minimums_are_the_bounds_of_runner_runs_options() -> None:
    import dataclasses

    from runner.config import MINIMUMS
    from runner.request import RunRequest

    option_of = {"max_turns": "max_turns", "max_budget_usd": "max_budget_usd", "price_in_usd_per_mtok": "price_in",
                 "price_out_usd_per_mtok": "price_out", "timeout_s": "timeout_s", "max_retries": "max_retries"}
    bounds = {f.name: f.metadata.get("min") for f in dataclasses.fields(RunRequest)}
    assert MINIMUMS == {setting: bounds[option_of[setting]] for setting in MINIMUMS}
    assert set(MINIMUMS) == set(option_of)


def test_the_suite_takes_a_unique_start_of_a_model_name_as_run_does() -> None:
    from runner.suite import model_columns

    assert model_columns("local", ["smollm2"]) == model_columns("local", ["smollm2-135m-instruct"])
    with pytest.raises(ModelNotFound, match=r"'qwen2\.5' is the start of 3 local models"):
        model_columns("local", ["qwen2.5"])


def test_help_names_values_not_python_types(runs: Path) -> None:
    helps = {name: cli(*name.split(), "--help", runs_dir=runs) for name in ("run", "suite", "export", "experiments")}
    for name, proc in helps.items():
        assert proc.returncode == 0 and "list[" not in proc.stdout and "chapter" not in proc.stdout, (name, proc.stdout)
    assert "RUN_ID  Runs to send" in helps["export"].stdout and "NAME  Experiments to run" in helps["experiments"].stdout
    for name, shown in [("run", "--tool-errors text|generic|fatal"), ("run", "--on-slip corrective|repeat|fail"),
                        ("run", "PROMPT  The user's task"), ("suite", "--provider scripted|local|both"),
                        ("suite", "--executor local|ray"), ("suite", "--model NAME")]:
        assert shown in helps[name].stdout, (name, shown)


def test_notices_wider_than_the_terminal_wrap_and_short_lines_keep_their_spacing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from runner import render

    monkeypatch.setenv("COLUMNS", "50")
    short = "  scripted  plan #1  turns=3  tools=2    6 ms"
    assert render.wrap(short, 50) == short
    long = ("warning: otel export: the OTLP receiver at http://127.0.0.1:6006/v1/traces did not take "
            "6 span(s): unreachable through the exporter's retries")
    assert render.wrap(long) == long  # stderr is no terminal here: nothing wraps
    lines = render.wrap(long, 50).splitlines()
    assert len(lines) > 1 and all(len(x) <= 50 or " " not in x.strip() for x in lines)
    assert all(x.startswith("  ") for x in lines[1:]) and " ".join(x.strip() for x in lines) == long


def test_a_tilde_in_a_path_option_or_the_runs_variable_is_the_home_folder(tmp_path: Path) -> None:
    """`--runs-dir=~/x` reaches runner unexpanded (the shell expands `~` only at a word's start),
    as does `RUNNER_RUNS_DIR='~/x'`: both mean the home folder, never a folder named `~`."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    made = cli("run", "--scenario", "plan", "--runs-dir=~/by-option", runs_dir=None, env={"HOME": str(home)}, cwd=work)
    assert made.returncode == 0, made.stderr
    assert f"created runs directory {home / 'by-option'}" in made.stdout + made.stderr
    from_env = cli("run", "--scenario", "plan", runs_dir=None, env={"HOME": str(home), "RUNNER_RUNS_DIR": "~/by-env"},
                   cwd=work)
    assert from_env.returncode == 0, from_env.stderr
    listed = cli("runs", "--runs-dir", "~/by-env", runs_dir=None, env={"HOME": str(home)}, cwd=work)
    assert listed.returncode == 0 and "completed" in listed.stdout
    assert sorted(p.name for p in home.iterdir() if not p.name.startswith(".")) == ["by-env", "by-option"]
    assert list(work.iterdir()) == []
    for args, env in ((("runs", "--runs-dir", "~nosuchuser/x"), {}), (("runs",), {"RUNNER_RUNS_DIR": "~nosuchuser"}),
                      (("run", "--scenario", "plan", "--prompt-file", "~nosuchuser/f"), {})):
        nobody = cli(*args, runs_dir=None, env=env, cwd=work)
        assert nobody.returncode == 2 and "cannot tell whose home folder ~nosuchuser is" in nobody.stderr, nobody.stderr
    nobody = cli("runs", "--store", "~nosuchuser/x", runs_dir=None, cwd=work)
    assert nobody.returncode == 2 and "cannot tell whose home folder ~nosuchuser is" in one_error(nobody.stderr)


def test_an_empty_path_is_refused_not_taken_for_the_current_folder(tmp_path: Path) -> None:
    for args in (("--runs-dir", ""), ("--prompt-file", "")):
        out = cli("run", "--scenario", "plan", *args, runs_dir=None, cwd=tmp_path)
        assert out.returncode == 2 and "an empty path names no file or folder" in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_bad_durability_setting_does_not_keep_anyone_from_reading_their_runs(runs: Path) -> None:
    """$RUNNER_DURABILITY says how commits are flushed: the commands that only read runs do
    not consult it; the ones that commit still refuse a bad value."""
    assert cli("run", "--scenario", "plan", runs_dir=runs).returncode == 0
    (run_id,) = [p.name for p in runs.iterdir() if not p.name.startswith(".")]
    bad = {"RUNNER_DURABILITY": "bogus"}
    for args, shows in ((("runs",), run_id), (("show", run_id), run_id), (("trace", run_id), "stopped: completed"),
                        (("runs", "--totals"), "all runs")):
        out = cli(*args, runs_dir=runs, env=bad)
        assert out.returncode == 0 and shows in out.stdout, (args, out.stdout, out.stderr)
    refused = cli("run", "--scenario", "plan", runs_dir=runs, env=bad)
    assert refused.returncode == 2 and "must be one of process, power" in one_error(refused.stderr)


def test_serving_on_a_busy_port_or_a_missing_gguf_is_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = cli("scripted", "serve", "--port", str(port), runs_dir=None)
        local = cli("serve", "--model", "smollm2", "--port", str(port), runs_dir=None)  # before loading the model
    in_use = f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert busy.returncode == 2 and one_error(busy.stderr) == in_use
    assert local.returncode == 2 and one_error(local.stderr) == one_error(busy.stderr)
    missing = cli("serve", "--model", str(tmp_path / "nothing.gguf"), runs_dir=None)
    no_file = f"error: --model {tmp_path / 'nothing.gguf'}: no such file"
    assert missing.returncode == 2 and one_error(missing.stderr) == no_file
    suite = cli("suite", "--model", str(tmp_path / "nothing.gguf"), runs_dir=tmp_path / "runs")
    assert suite.returncode == 2 and one_error(suite.stderr) == f"error: {tmp_path / 'nothing.gguf'}: no such file"


def test_a_run_resumes_against_its_provider_come_back_on_another_port(runs: Path) -> None:
    """A run started against one scripted server stops (turn cap); that server goes away and
    another serves on a new port: `resume --base-url` continues there, asking it only for the
    turns the run still needs, and the run keeps the new URL. A run runner serves itself has
    no base URL to replace."""
    with ScriptedServer(ScriptedSettings()) as first:
        code, out = cli_json("run", "--scenario", "plan", "--base-url", first.base_url, "--max-turns", "1",
                             "--max-retries", "0", runs_dir=runs)
        assert code == 3 and out["status"] == "max_turns_exceeded", out
        run_id = out["run_id"]
    gone = cli("resume", run_id, "--max-turns", "5", runs_dir=runs)  # the first server is gone
    assert gone.returncode == 3 and "resume with: runner resume " + run_id in gone.stdout, gone.stdout
    assert f"if the provider moved: runner resume {run_id} --base-url URL" in gone.stdout
    for url, problem in (("localhost:9/v1", "it must start with http:// or https://"),
                         ("http://[::1", "Invalid IPv6 URL"), ("http://127.0.0.1:99999/v1", "Port out of range"),
                         ("http://", "it names no host")):
        bad = cli("resume", run_id, "--max-turns", "5", "--base-url", url, runs_dir=runs)
        assert bad.returncode == 2, bad.stderr
        assert one_error(bad.stderr).startswith(f"error: --base-url {url!r} is not a URL runner can reach: {problem}")
        made = cli("run", "--scenario", "plan", "--base-url", url, runs_dir=runs)
        assert made.returncode == 2 and problem in one_error(made.stderr)
    assert store.load(runs, run_id).config.endpoint.base_url == first.base_url  # nothing recorded
    assert len(json.loads(cli("runs", "--json", runs_dir=runs).stdout)) == 1  # and no run made
    with ScriptedServer(ScriptedSettings()) as second:
        assert second.base_url != first.base_url
        typo = second.base_url.removesuffix("/v1")  # a 404: kept resumable, the paid turn too
        code, out = cli_json("resume", run_id, "--max-turns", "5", "--base-url", typo, runs_dir=runs)
        assert code == 3 and out["status"] == "interrupted" and out["turns"] == 1, out
        code, out = cli_json("resume", run_id, "--max-turns", "5", "--base-url", second.base_url, runs_dir=runs)
        assert code == 0 and out["status"] == "completed" and out["turns"] == 3, out
        assert second.requests == [("plan", 2), ("plan", 3)]  # the turn paid to the first is not asked again
    assert store.load(runs, run_id).config.endpoint.base_url == second.base_url
    events = [json.loads(line) for line in cli("trace", run_id, "--json", runs_dir=runs).stdout.splitlines()]
    resumed = [e["endpoint"] for e in events if e["type"] == "run_resumed"]
    assert resumed == [first.base_url, second.base_url.removesuffix("/v1"), second.base_url]
    code, own = cli_json("run", "--scenario", "plan", "--max-turns", "1", runs_dir=runs)
    with ScriptedServer(ScriptedSettings()) as third:  # a scripted run goes on with a scripted provider elsewhere
        code, out = cli_json("resume", own["run_id"], "--max-turns", "5", "--base-url", third.base_url, runs_dir=runs)
        assert code == 0 and out["status"] == "completed" and out["turns"] == 3, out
        assert third.requests == [("plan", 2), ("plan", 3)]
    assert store.load(runs, own["run_id"]).config.endpoint.base_url == third.base_url


def test_a_budget_on_a_run_that_costs_nothing_is_refused(tmp_path: Path) -> None:
    proc = cli("run", "hi", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--max-budget", "0.01",
               runs_dir=tmp_path / "runs")
    assert proc.returncode == 2 and "this run costs $0" in one_error(proc.stderr)
    assert not (tmp_path / "runs").exists()


def test_a_prompt_to_the_scripted_provider_says_which_folder_it_works_on(runs: Path, tmp_path: Path) -> None:
    """The scripted provider's replies are written for the demo folder, so a prompt sent to it
    works on a copy of that folder, not on the current one, and the run says so first; on a
    folder given with --workspace it says its replies may not fit."""
    with ScriptedServer(ScriptedSettings()) as server:
        said = cli("run", "Which log mentions a timeout?", "--base-url", server.base_url, "--model",
                   "scripted/timeout_file", runs_dir=runs, cwd=tmp_path)
        assert said.returncode == 0, said.stderr
        assert "works on a copy of it, not on the current folder" in " ".join(said.stderr.split())
        own = cli("run", "Which log mentions a timeout?", "--base-url", server.base_url, "--model",
                  "scripted/timeout_file", "--workspace", str(tmp_path), runs_dir=runs)
        assert f"on {tmp_path.resolve()} (a copy of it) its replies may name files that are not there" in " ".join(
            own.stderr.split())
