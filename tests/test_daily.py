"""Daily use, through the real CLI (in this process, or in a child process where the process
is the subject: a tool module found in its working directory, a plugin on its PYTHONPATH,
output read while it runs, Ctrl-C): keys and the config file, misconfiguration that fails
fast, retries shown as they happen, tools of one's own (Python, --tool, plugins), prompts from
stdin and files."""

from __future__ import annotations

import asyncio
import functools
import http.server
import importlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from runner.endpoints import Endpoint
from runner.errors import UnknownTool
from runner.harness import execute
from runner.scripted import ScriptedServer
from runner.state import RunConfig, new_run
from runner.store import FileStore
from tests.conftest import cli, cli_process, one_error
from tests.fakeprovider import Answer, FakeProvider, completion, error, scripted, tool_call

KEY = "sk-test-9f3c2e71d0a84b5f-secret"

WEATHER = '''\
from pydantic import BaseModel
from runner import Tool


class Weather(Tool):
    name = "get_weather"
    description = "Today's weather in a city."
    read_only = True

    class Params(BaseModel):
        city: str

    def run_sync(self, args, ctx):
        return f"{args.city}: 21 C, clear"
'''


INHERITED = ("RUNNER_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL", "RUNNER_BASE_URL", "RUNNER_RUNS_DIR",
             "RUNNER_STORE")
"""What a user's shell may set that these tests must not inherit."""


def _env(cwd: Path, env: dict[str, str] | None) -> dict[str, str | None]:
    """No key, base URL or store inherited; no user config file but the test's own."""
    return {**dict.fromkeys(INHERITED), "XDG_CONFIG_HOME": str(cwd / "xdg"), **(env or {})}


def runner(*args: str, cwd: Path, env: dict[str, str] | None = None,
           stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`runner ARGS` in `cwd`, run by the CLI in this process (`tests.conftest.cli`)."""
    return cli(*args, runs_dir=None, cwd=cwd, env=_env(cwd, env), stdin=stdin)


def runner_process(*args: str, cwd: Path, env: dict[str, str] | None = None, stdin: str | None = None,
                   timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`runner ARGS` in `cwd`, in a child process: for what the process finds on its own (a tool
    module in its working directory, a plugin on its PYTHONPATH)."""
    return cli_process(*args, runs_dir=None, cwd=cwd, env=_env(cwd, env), stdin=stdin, timeout=timeout)


def weather_handler(body: dict[str, Any]) -> Answer:
    """Turn 1: call get_weather; then answer with what the tool said."""
    msgs = body["messages"]
    if not any(m["role"] == "assistant" for m in msgs):
        return completion({"role": "assistant", "content": None,
                           "tool_calls": [tool_call("call_w1", "get_weather", '{"city": "Lisbon"}')]})
    said = [m["content"] for m in msgs if m["role"] == "tool"][-1]
    return completion({"role": "assistant", "content": f"The weather: {said}"})


def grep_tree(folder: Path, needle: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- keys and the config file ---------------------------------------------------------------


def test_key_from_config_named_variable_is_sent_and_never_written(tmp_path: Path) -> None:
    (tmp_path / "runner.toml").write_text('api_key_env = "MY_PROVIDER_KEY"\nprice_in_usd_per_mtok = 1.0\n')
    with FakeProvider(scripted("plan")) as fake:
        env = {"MY_PROVIDER_KEY": KEY}
        proc = runner("run", "Which file mentions a timeout?", "--base-url", fake.base_url, "--model", "m",
                      "--max-turns", "1", "--runs-dir", "runs", "--json", cwd=tmp_path, env=env)
        assert proc.returncode == 3, proc.stderr
        run_id = json.loads(proc.stdout)["run_id"]
        state = FileStore(tmp_path / "runs").load(run_id)
        assert state.config.endpoint.api_key_env == "MY_PROVIDER_KEY"
        assert state.config.price_in_usd_per_mtok == 1.0  # from ./runner.toml
        # resume finds the key again through the recorded variable name
        proc = runner("resume", run_id, "--max-turns", "5", "--runs-dir", "runs", "--json", cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        assert fake.auth and all(a == f"Bearer {KEY}" for a in fake.auth)
    # a provider that echoes the key in its error: the message is kept, the key is not
    with FakeProvider(lambda body: error(401, f"Incorrect API key provided: {KEY}", "invalid_api_key")) as fake:
        proc = runner("run", "hi", "--base-url", fake.base_url, "--model", "m", "--keep", "--runs-dir", "runs",
                      cwd=tmp_path, env={"RUNNER_API_KEY": KEY})
        assert proc.returncode == 1
        assert "Incorrect API key provided" in proc.stdout + proc.stderr
        assert KEY not in proc.stdout + proc.stderr
        proc = runner("config", "show", cwd=tmp_path, env={"RUNNER_API_KEY": KEY})
        assert KEY not in proc.stdout and "…" in proc.stdout and "env RUNNER_API_KEY" in proc.stdout
    assert len(FileStore(tmp_path / "runs").list_runs()) == 2
    assert grep_tree(tmp_path / "runs", KEY) == []
    assert grep_tree(tmp_path / "runs", KEY[-12:]) == []


def test_a_short_key_is_not_hidden_in_words_and_a_real_one_is_hidden_whole(tmp_path: Path) -> None:
    with FakeProvider(lambda body: error(401, "bad key", "invalid_api_key")) as fake:
        proc = runner_process("run", "weather?", "--base-url", fake.base_url, "--model", "m", "--runs-dir", "runs",
                              cwd=tmp_path, env={"RUNNER_API_KEY": "bad"})
    assert proc.returncode == 1 and "HTTP 401: bad key" in proc.stderr, proc.stderr
    assert "[api key]" not in proc.stderr
    echoed = f"Incorrect API key provided: '{KEY}' (sent as Bearer {KEY})."
    with FakeProvider(lambda body: error(401, echoed, "invalid_api_key")) as fake:
        proc = runner_process("run", "weather?", "--base-url", fake.base_url, "--model", "m", "--runs-dir", "runs",
                              cwd=tmp_path, env={"RUNNER_API_KEY": KEY})
    assert proc.returncode == 1, proc.stderr
    assert "Incorrect API key provided: '[api key]' (sent as Bearer [api key])." in " ".join(proc.stderr.split())
    assert KEY not in proc.stderr


def test_a_run_is_never_driven_without_the_key_it_names(tmp_path: Path) -> None:
    """Where the variable a run reads its key from is not set, nothing is asked and nothing is
    lost: resume refuses before touching the run, a worker stops it resumable saying why, and
    no other variable's key is sent in its place."""
    (tmp_path / "runner.toml").write_text('api_key_env = "MY_PROVIDER_KEY"\n')
    with FakeProvider(scripted("plan")) as fake:
        env = {"MY_PROVIDER_KEY": KEY}
        capped = runner("run", "Which file mentions a timeout?", "--base-url", fake.base_url, "--model", "m",
                        "--max-turns", "1", "--runs-dir", "runs", "--json", cwd=tmp_path, env=env)
        run_id = json.loads(capped.stdout)["run_id"]
        asked, seq = len(fake.requests), FileStore(tmp_path / "runs").load(run_id).seq
        other = {"OPENAI_API_KEY": "sk-another-providers-key-1234"}
        refused = runner("resume", run_id, "--max-turns", "5", "--runs-dir", "runs", cwd=tmp_path, env=other)
        assert refused.returncode == 2 and "$MY_PROVIDER_KEY" in one_error(refused.stderr), refused.stderr
        assert FileStore(tmp_path / "runs").load(run_id).seq == seq  # untouched
        queued = runner("resume", run_id, "--max-turns", "5", "--detach", "--runs-dir", "runs", cwd=tmp_path,
                        env=other)
        assert queued.returncode == 0, queued.stderr
        worker = runner_process("worker", "--idle-exit", "0.5", "--runs-dir", "runs", cwd=tmp_path, env=other)
        state = FileStore(tmp_path / "runs").load(run_id)
        assert len(fake.requests) == asked and state.status == "interrupted", worker.stdout + worker.stderr
        assert "MY_PROVIDER_KEY is not set" in (state.reason or "") and state.turns == 1
        said = worker.stderr  # the worker says how each run stopped, and why
        assert f"{run_id}: interrupted after 1 turn: provider unavailable: no request sent" in said, said
        assert "drove 1 run(s): 1 interrupted; 0 error(s)" in said, said
        resumed = runner("resume", run_id, "--runs-dir", "runs", "--json", cwd=tmp_path, env=env)
        assert resumed.returncode == 0 and json.loads(resumed.stdout)["status"] == "completed", resumed.stderr
        assert fake.auth and all(a == f"Bearer {KEY}" for a in fake.auth)


def test_a_run_given_its_key_on_the_command_line_needs_it_again(tmp_path: Path) -> None:
    """`--api-key` is never recorded: the printed resume carries `--api-key KEY`, a resume
    without it refuses before touching the run (no placeholder, no $OPENAI_API_KEY sent), and
    with it the run goes on. A scenario on runner's own provider needs no key at all."""
    (tmp_path / "runner.toml").write_text('api_key_env = "MY_PROVIDER_KEY"\n')
    plain = runner("run", "--scenario", "plan", "--runs-dir", "runs", "--json", cwd=tmp_path)
    assert plain.returncode == 0 and json.loads(plain.stdout)["status"] == "completed", plain.stderr
    with FakeProvider(scripted("plan")) as fake:
        capped = runner("run", "Which file mentions a timeout?", "--base-url", fake.base_url, "--model", "m",
                        "--api-key", KEY, "--max-turns", "1", "--runs-dir", "runs", cwd=tmp_path)
        assert capped.returncode == 3, capped.stderr
        hint = next(line for line in capped.stdout.splitlines() if "runner resume" in line)
        assert hint.rstrip().endswith("--api-key KEY --max-turns N"), capped.stdout
        run_id = next(line.split()[-1] for line in capped.stdout.splitlines() if "run id:" in line)
        asked = len(fake.requests)
        refused = runner("resume", run_id, "--max-turns", "5", "--runs-dir", "runs", cwd=tmp_path,
                         env={"OPENAI_API_KEY": "sk-another-providers-key-1234"})
        assert refused.returncode == 2 and "--api-key" in one_error(refused.stderr), refused.stderr
        assert len(fake.requests) == asked
        for args in (("--detach",), ("--api-key", KEY, "--detach")):  # a worker would have no key to send
            queued = runner("resume", run_id, "--max-turns", "5", *args, "--runs-dir", "runs", cwd=tmp_path)
            assert queued.returncode == 2 and "never saved, so no worker could send it" in one_error(queued.stderr)
        assert FileStore(tmp_path / "runs").info(run_id).shown_status == "max_turns_exceeded"
        done = runner("resume", run_id, "--api-key", KEY, "--max-turns", "5", "--runs-dir", "runs", "--json",
                      cwd=tmp_path)
        assert done.returncode == 0 and json.loads(done.stdout)["status"] == "completed", done.stderr
        assert fake.auth and all(a == f"Bearer {KEY}" for a in fake.auth)


def test_a_key_given_on_the_command_line_is_refused_for_a_queued_run(tmp_path: Path) -> None:
    proc = runner("run", "hi", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--api-key", KEY, "--detach",
                  "--runs-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 2 and "--api-key is never saved, so no worker could send it" in one_error(proc.stderr)
    assert not (tmp_path / "runs").exists()


def test_config_file_refuses_a_key_and_show_names_sources(tmp_path: Path) -> None:
    (tmp_path / "runner.toml").write_text(f'api_key = "{KEY}"\n')
    proc = runner("config", "show", cwd=tmp_path)
    assert proc.returncode == 2 and "api_key_env" in proc.stderr and KEY not in proc.stderr
    (tmp_path / "runner.toml").write_text('model = "from-project"\n')
    user = tmp_path / "xdg" / "runner" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text('model = "from-user"\nmax_retries = 7\n')
    proc = runner("config", "show", "--json", cwd=tmp_path, env={"OPENAI_BASE_URL": "http://h:1/v1"})
    rows = {r["name"]: (r["value"], r["source"]) for r in json.loads(proc.stdout)["settings"]}
    assert rows["model"] == ("from-project", "runner.toml")
    assert rows["max_retries"] == ("7", str(user))
    assert rows["base_url"] == ("http://h:1/v1", "env OPENAI_BASE_URL")
    assert rows["max_turns"] == ("20", "default")


# --- misconfiguration fails fast ------------------------------------------------------------


HTML = "<!DOCTYPE html><html><head><title>Welcome to nginx!</title></head><body>hi</body></html>"


def test_html_200_fails_on_turn_one_with_a_hint(tmp_path: Path) -> None:
    with FakeProvider(lambda body: Answer(200, HTML, {"Content-Type": "text/html"})) as fake:
        started = time.monotonic()
        proc = runner("run", "hi", "--base-url", fake.base_url, "--model", "m", "--runs-dir", "runs", cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr
        assert time.monotonic() - started < 10
        assert len(fake.requests) == 1  # not retried
        assert "Welcome to nginx!" in proc.stderr and "OpenAI-compatible" in proc.stderr
        assert "not kept" in proc.stderr and "resume" not in proc.stderr.replace("nothing to resume", "")
        assert not (tmp_path / "runs").exists()  # created for the run, removed with it
        proc = runner("run", "hi", "--base-url", fake.base_url, "--model", "m", "--runs-dir", "runs", "--keep",
                      "--json", cwd=tmp_path)
        out = json.loads(proc.stdout)
        assert (proc.returncode, out["status"], out["error"]["type"]) == (1, "failed", "bad_endpoint")


def test_plain_text_200_and_405_fail_without_retry(tmp_path: Path) -> None:
    for answer in (Answer(200, "OK", {"Content-Type": "text/plain"}), error(405, "Method Not Allowed")):
        with FakeProvider(lambda body, a=answer: a) as fake:  # type: ignore[misc]
            proc = runner("run", "hi", "--base-url", fake.base_url, "--model", "m", "--runs-dir", "runs",
                          "--keep", "--json", cwd=tmp_path)
            out = json.loads(proc.stdout)
            assert (proc.returncode, out["error"]["type"], len(fake.requests)) == (1, "bad_endpoint", 1)
            assert "OpenAI-compatible" in out["error"]["message"]


def test_a_plain_web_server_fails_at_once_with_a_hint(tmp_path: Path) -> None:
    """Python's own http.server (the handler `python -m http.server` serves with) answers a POST
    with an HTML 501 page: not retried, one hint."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = runner("run", "hi", "--base-url", f"http://127.0.0.1:{server.server_address[1]}/v1", "--model", "m",
                      "--runs-dir", "runs", cwd=tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 1 and "retry" not in proc.stderr
    assert proc.stderr.count("OpenAI-compatible") == 1 and "HTTP 501" in proc.stderr and "not kept" in proc.stderr
    said = proc.stderr.splitlines()  # stderr is no terminal here: the error stays whole on one line
    assert said[-2].startswith("error: provider error: HTTP 501") and said[-2].endswith("usually ends in /v1")


def test_refused_connection_prints_each_retry_as_it_happens_and_keeps_no_run(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    env = {k: v for k, v in os.environ.items() if k not in ("RUNNER_RUNS_DIR", "RUNNER_STORE")}
    proc = subprocess.Popen([sys.executable, "-m", "runner", "run", "hi", "--base-url", url, "--model", "m",
                             "--max-retries", "2", "--runs-dir", "runs"], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    lines = [proc.stderr.readline()]
    while not lines[-1].startswith("  retry 1/2"):
        lines.append(proc.stderr.readline())
        assert lines[-1], lines
    assert proc.poll() is None  # shown while the retries go on, not at the end
    rest = proc.stderr.read()
    assert proc.wait(timeout=30) == 1
    assert "  retry 2/2 in 1.0 s: cannot reach" in rest
    assert "not kept" in rest
    assert not (tmp_path / "runs").exists() or FileStore(tmp_path / "runs").list_runs() == []


def test_endpoint_listening_two_seconds_late_is_reached(tmp_path: Path) -> None:
    port = free_port()
    late: list[ScriptedServer] = []
    timer = threading.Timer(2.0, lambda: late.append(ScriptedServer(port=port).__enter__()))
    timer.start()
    try:
        proc = runner("run", "--scenario", "plan", "--base-url", f"http://127.0.0.1:{port}/v1", "--runs-dir", "runs",
                      "--json", cwd=tmp_path)
    finally:
        timer.join()
        for server in late:
            server.__exit__(None, None, None)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "completed"
    assert "  retry 1/4" in proc.stderr


def test_runs_dir_created_only_by_commands_that_write(tmp_path: Path) -> None:
    for args in (("runs",), ("runs", "--totals"), ("trace", "nope")):
        runner(*args, "--runs-dir", "nowhere", cwd=tmp_path)
        assert not (tmp_path / "nowhere").exists(), args
    proc = runner("run", "--scenario", "plan", "--runs-dir", "fresh", cwd=tmp_path)
    assert proc.returncode == 0 and "created runs directory fresh" in proc.stderr


# --- prompts --------------------------------------------------------------------------------


def test_prompt_from_stdin_and_file(tmp_path: Path) -> None:
    text = "Which file mentions a timeout?\n" + "x" * 200_000
    proc = runner("run", "-", "--scenario", "plan", "--runs-dir", "runs", "--json", cwd=tmp_path, stdin=text)
    assert proc.returncode == 0, proc.stderr
    state = FileStore(tmp_path / "runs").load(json.loads(proc.stdout)["run_id"])
    assert state.messages[0].content == text
    (tmp_path / "p.txt").write_text("from a file")
    proc = runner("run", "--prompt-file", "p.txt", "--scenario", "plan", "--runs-dir", "runs", "--json", cwd=tmp_path)
    state = FileStore(tmp_path / "runs").load(json.loads(proc.stdout)["run_id"])
    assert state.messages[0].content == "from a file"
    proc = runner("run", "-", "--scenario", "plan", "--runs-dir", "runs", cwd=tmp_path, stdin="  \n")
    assert proc.returncode == 2 and "empty" in proc.stderr


# --- tools of one's own ---------------------------------------------------------------------


def test_own_tool_from_cli_and_missing_on_resume_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(WEATHER)
    with FakeProvider(weather_handler) as fake:
        proc = runner_process("run", "Weather in Lisbon?", "--base-url", fake.base_url, "--model", "m", "--tool",
                              "mytools:Weather", "--max-turns", "1", "--runs-dir", "runs", "--json", cwd=tmp_path)
        assert proc.returncode == 3, proc.stderr
        run_id = json.loads(proc.stdout)["run_id"]
        assert "get_weather" in [t["function"]["name"] for t in fake.requests[0]["tools"]]
        state = FileStore(tmp_path / "runs").load(run_id)
        # a module of the working folder is recorded by its file: found from any folder
        assert state.config.tool_refs == {"get_weather": f"{tmp_path / 'mytools.py'}:Weather"}
        assert state.messages[-1].content == "Lisbon: 21 C, clear"
        (tmp_path / "mytools.py").rename(tmp_path / "elsewhere.py")
        proc = runner_process("resume", run_id, "--max-turns", "3", "--runs-dir", "runs", cwd=tmp_path)
        assert proc.returncode == 2
        assert "get_weather" in one_error(proc.stderr) and "mytools" in proc.stderr
        proc = runner_process("resume", run_id, "--max-turns", "3", "--tool", "elsewhere:Weather", "--runs-dir", "runs",
                              "--json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["answer"] == "The weather: Lisbon: 21 C, clear"


def test_missing_tool_at_start_leaves_no_run(tmp_path: Path) -> None:
    proc = runner_process("run", "hi", "--scenario", "plan", "--tool", "nosuch:Thing", "--runs-dir", "runs",
                          cwd=tmp_path)
    assert proc.returncode == 2 and "nosuch" in proc.stderr
    assert not (tmp_path / "runs").exists()
    state = new_run("hi", RunConfig(endpoint=Endpoint(model="scripted/plan"), tools=["list_files", "get_weather"]))
    with pytest.raises(UnknownTool, match="get_weather"):
        asyncio.run(execute(state, "http://127.0.0.1:9/v1", tmp_path / "runs"))
    assert FileStore(tmp_path / "runs").list_runs() == []


def test_own_tool_from_python_is_saved_and_traced(tmp_path: Path) -> None:
    sys.path.insert(0, str(tmp_path))
    (tmp_path / "mytools2.py").write_text(WEATHER)
    try:
        Weather = importlib.import_module("mytools2").Weather

        with FakeProvider(weather_handler) as fake:
            state = new_run("Weather in Lisbon?", RunConfig(endpoint=Endpoint(model="m"), tools=[Weather()]))
            result = asyncio.run(execute(state, fake.base_url, tmp_path / "runs"))
        assert result.answer == "The weather: Lisbon: 21 C, clear"
        runs = FileStore(tmp_path / "runs")
        assert runs.load(result.run_id).config.tool_refs == {"get_weather": "mytools2:Weather"}
        assert [e.type for e in runs.read_trace(result.run_id) if e.type == "tool_result"] == ["tool_result"]
        with FakeProvider(weather_handler) as fake:  # execute(tools=[...]) alongside built-in names
            state = new_run("Weather in Lisbon?", RunConfig(endpoint=Endpoint(model="m")))
            result = asyncio.run(execute(state, fake.base_url, tmp_path / "runs", tools=["list_files", Weather()]))
            assert [t["function"]["name"] for t in fake.requests[0]["tools"]] == ["list_files", "get_weather"]
        assert result.status == "completed"
    finally:
        sys.path.remove(str(tmp_path))


def test_own_tool_by_file_path_runs_and_resumes_from_another_folder(tmp_path: Path) -> None:
    (tmp_path / "w1").mkdir()
    (tmp_path / "w2").mkdir()
    (tmp_path / "w2" / "mytools.py").write_text(WEATHER)
    with FakeProvider(weather_handler) as fake:
        for spec in ("../w2/mytools.py:Weather", str(tmp_path / "w2" / "mytools.py") + ":Weather"):
            proc = runner_process("run", "Weather in Lisbon?", "--base-url", fake.base_url, "--model", "m", "--tool",
                                  spec, "--max-turns", "1", "--runs-dir", "../runs", "--json", cwd=tmp_path / "w1")
            assert proc.returncode == 3, proc.stderr
            run_id = json.loads(proc.stdout)["run_id"]
            state = FileStore(tmp_path / "runs").load(run_id)
            assert state.messages[-1].content == "Lisbon: 21 C, clear"
            assert state.config.tool_refs == {"get_weather": f"{tmp_path / 'w2' / 'mytools.py'}:Weather"}
        # from another folder: the run recorded the file's absolute path
        proc = runner_process("resume", run_id, "--max-turns", "3", "--runs-dir", "runs", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["answer"] == "The weather: Lisbon: 21 C, clear"


def test_a_tool_spec_that_is_no_usable_tool_is_one_usage_line(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(WEATHER + BROKEN_TOOLS)
    (tmp_path / "boom.py").write_text("raise ValueError('boom at import')\n")
    for spec, said in [
        ("./mytools:Weather", "a file of tools is given with its .py ending; did you mean ./mytools.py:Weather?"),
        ("./nofile.py:Weather", f"there is no file {tmp_path / 'nofile.py'}"),
        (f"{tmp_path}/mytools.py:Weather:X", f"one NAME goes after the file ({tmp_path}/mytools.py:NAME; "
                                              "an attribute of it: NAME.ATTR)"),
        (".mytools:Weather", ".mytools is a relative module name"),
        ("mytools:Tool", "mytools.py:Tool is not a usable tool: it has no name and no description and no run_sync or run"),
        ("mytools:NoName", "mytools.py:NoName is not a usable tool: it has no name ("),
        ("mytools:NoRun", "mytools.py:NoRun is not a usable tool: it has no run_sync or run ("),
        ("mytools:BaseModel", "mytools.py:BaseModel is not a runner.Tool"),
        ("mytools:Nothing", "mytools.py has no attribute 'Nothing'"),
        ("boom:X", "boom.py:X: ValueError: boom at import"),
        ("./boom.py:X", "ValueError: boom at import"),
    ]:
        proc = runner_process("run", "hi", "--scenario", "plan", "--tool", spec, "--runs-dir", "runs", cwd=tmp_path)
        assert proc.returncode == 2, (spec, proc.stderr)
        assert proc.stderr.count("\n") == 1 and said in one_error(proc.stderr), (spec, proc.stderr)
        assert "bug in runner" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_two_tools_under_one_name_are_refused_before_a_run_is_made(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(WEATHER + "\n\nclass Again:\n    weather = Weather()\n\n\n"
                                         "class ReadFile(Weather):\n    name = 'read_file'\n")
    for specs, said in [(("mytools:Weather", "./mytools.py:Again.weather"),
                         "more than one tool is named 'get_weather': each tool offered needs a name of its own"),
                        (("mytools:ReadFile",), "more than one tool is named 'read_file': each tool offered needs a "
                                                "name of its own (a built-in tool has it; rename yours, or give "
                                                "--no-builtin-tools)")]:
        args = [a for spec in specs for a in ("--tool", spec)]
        proc = runner_process("run", "hi", "--scenario", "plan", *args, "--runs-dir", "runs", cwd=tmp_path)
        assert proc.returncode == 2 and one_error(proc.stderr) == f"error: {said}", proc.stderr
    assert not (tmp_path / "runs").exists()
    from runner.errors import UsageError
    sys.path.insert(0, str(tmp_path))
    try:
        mytools = importlib.import_module("mytools")
        with pytest.raises(UsageError, match="more than one tool is named 'get_weather'"):
            asyncio.run(execute(new_run("hi", RunConfig(endpoint=Endpoint(model="scripted/plan"))), None,
                                tmp_path / "runs", tools=[mytools.Weather(), mytools.Again.weather]))
        assert not (tmp_path / "runs").exists()  # refused before the run was stored
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mytools", None)


OWN_FILES = '''\
from pydantic import BaseModel
from runner import Tool


class ListFiles(Tool):
    name = "list_files"
    description = "The files there are."
    read_only = True

    class Params(BaseModel):
        pass

    def run_sync(self, args, ctx):
        return "errors.log (mine)"


class ReadFile(Tool):
    name = "read_file"
    description = "A file's text."
    read_only = True

    class Params(BaseModel):
        path: str

    def run_sync(self, args, ctx):
        return f"my read_file of {args.path}"
'''


def test_own_tools_under_built_in_names_stay_the_runs_on_resume_and_in_a_worker(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(OWN_FILES)
    own = ["--no-builtin-tools", "--tool", "mine.py:ListFiles", "--tool", "mine.py:ReadFile", "--runs-dir", "runs"]
    store = FileStore(tmp_path / "runs")
    proc = runner_process("run", "hi", "--scenario", "plan", *own, "--max-turns", "1", "--json", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    first = json.loads(proc.stdout)["run_id"]
    proc = runner_process("resume", first, "--max-turns", "3", "--runs-dir", "runs", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = runner_process("run", "hi", "--scenario", "plan", *own, "--detach", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = runner_process("worker", "--runs-dir", "runs", "--idle-exit", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = [info.state for info in store.list_runs()]
    assert len(runs) == 2 and {s.status for s in runs} == {"completed"}
    for state in runs:  # the tools the run was made with, never the built-ins of the same names
        said = [m.content for m in state.messages if m.role == "tool"]
        assert said == ["errors.log (mine)", "my read_file of errors.log"], (state.run_id, said)


BROKEN_TOOLS = '''

class NoName(Tool):
    description = "no name"

    def run_sync(self, args, ctx):
        return "x"


class NoRun(Tool):
    name = "no_run"
    description = "no run"
'''


def test_plugin_tool_by_entry_point(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "weatherplug-0.1.dist-info").mkdir(parents=True)
    (site / "weatherplug.py").write_text(WEATHER)
    (site / "weatherplug-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: weatherplug\nVersion: 0.1\n")
    (site / "weatherplug-0.1.dist-info" / "entry_points.txt").write_text("[runner.tools]\nweather = weatherplug:Weather\n")
    with FakeProvider(weather_handler) as fake:
        proc = runner_process("run", "Weather?", "--base-url", fake.base_url, "--model", "m", "--tool", "weather",
                              "--runs-dir", "runs", "--json", cwd=tmp_path, env={"PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["answer"] == "The weather: Lisbon: 21 C, clear"
    proc = runner_process("run", "Weather?", "--scenario", "plan", "--tool", "nosuchplugin", "--runs-dir", "runs",
                          cwd=tmp_path, env={"PYTHONPATH": str(site)})
    assert proc.returncode == 2 and "weather" in proc.stderr



# --- a model by name ------------------------------------------------------------------------


def children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(entry.name), cmdline))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_run_model_by_name_serves_it_and_leaves_no_server_after_sigkill(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RUNNER_RUNS_DIR", "RUNNER_STORE", "RUNNER_BASE_URL",
                                                            "OPENAI_BASE_URL", "RUNNER_MODEL")}
    proc = subprocess.run([sys.executable, "-m", "runner", "run", "Which file is the largest?", "--model", "smollm2",
                           "--max-turns", "1", "--runs-dir", "runs", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    out = json.loads(proc.stdout)
    assert out["model"] == "smollm2-135m-instruct" and out["turns"] == 1, proc.stderr
    assert "first turn tool_choice=required" not in proc.stderr  # --json: no chatter
    state = FileStore(tmp_path / "runs").load(out["run_id"])
    assert state.config.endpoint.first_turn_tool_choice == "required"  # the manifest's
    assert any(m.tool_calls for m in state.messages)
    run = subprocess.Popen([sys.executable, "-m", "runner", "run", "Which file is the largest?", "--model",
                            "smollm2", "--runs-dir", "runs"], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        servers: list[tuple[int, str]] = []
        while not servers and time.monotonic() < deadline:
            servers = [c for c in children_of(run.pid) if "runner.local" in c[1]]
            time.sleep(0.05)
        assert servers, "no llama.cpp server started"
        time.sleep(1.0)  # loading the model
    finally:
        run.kill()
        run.wait()
    deadline = time.monotonic() + 10
    while alive(servers[0][0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(servers[0][0])


# --- show, trace, runs and totals at 80 columns ---------------------------------------------


def test_show_trace_runs_and_totals_fit_80_columns(tmp_path: Path) -> None:
    env = {"COLUMNS": "80"}
    long_prompt = "Please free some space. " * 40
    proc = runner("run", long_prompt, "--scenario", "destructive", "--runs-dir", "runs", "--json", cwd=tmp_path)
    run_id = json.loads(proc.stdout)["run_id"]
    runner("resume", run_id, "--reject", "c2", "--reason", "keep the logs", "--runs-dir", "runs", cwd=tmp_path)
    runner("run", "--scenario", "runaway", "--max-turns", "3", "--runs-dir", "runs", cwd=tmp_path)
    runner("run", "--scenario", "research", "--runs-dir", "runs", cwd=tmp_path)
    shown = runner("show", run_id, "--runs-dir", "runs", cwd=tmp_path, env=env).stdout
    assert max(map(len, shown.splitlines())) <= 80, shown
    for expected in ("── user", "→ delete_file {\"path\": \"access.log\"}", "rejected by", "keep the logs",
                     "answer: I did not delete anything", "stopped: completed", "more lines (--full shows all)"):
        assert expected in shown, expected
    full = runner("show", run_id, "--full", "--runs-dir", "runs", cwd=tmp_path, env=env).stdout
    assert "more lines" not in full
    md = runner("show", run_id, "--format", "md", "--runs-dir", "runs", cwd=tmp_path).stdout
    assert md.startswith(f"# Run {run_id}") and long_prompt.strip() in md
    data = json.loads(runner("show", run_id, "--format", "json", "--runs-dir", "runs", cwd=tmp_path).stdout)
    assert data["state"]["run_id"] == run_id and data["events"][0]["type"] == "run_started"
    for args in (("trace", run_id), ("runs",), ("runs", "--totals", "--by", "model"), ("runs", "--totals", "--by", "day")):
        out = runner(*args, "--runs-dir", "runs", cwd=tmp_path, env=env).stdout
        assert out and max(map(len, out.splitlines())) <= 80, (args, out)
    listed = runner("runs", "--runs-dir", "runs", cwd=tmp_path, env=env).stdout
    assert "started" in listed and "max_turns_exceeded" in listed and "runaway" in listed
    totals = json.loads(runner("runs", "--totals", "--by", "status", "--runs-dir", "runs", "--json", cwd=tmp_path).stdout)
    states = [FileStore(tmp_path / "runs").load(r["run_id"])
              for r in json.loads(runner("runs", "--runs-dir", "runs", "--json", cwd=tmp_path).stdout)]
    assert totals[-1]["group"] == "TOTAL" and totals[-1]["runs"] == len(states) == 4  # research child included
    assert totals[-1]["turns"] == sum(s.turns for s in states)
    assert totals[-1]["cost_usd"] == pytest.approx(sum(s.cost_usd - s.child_cost_usd for s in states))
    assert totals[-1]["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in totals[:-1]))
    assert {r["group"] for r in totals[:-1]} == {"completed", "max_turns_exceeded"}


def test_experiments_write_to_the_runs_directory_and_name_unknown_ones(tmp_path: Path) -> None:
    listed = runner("experiments", "--list", cwd=tmp_path, env={"COLUMNS": "80"})
    assert listed.returncode == 0 and "turn_cap" in listed.stdout and max(map(len, listed.stdout.splitlines())) <= 80
    assert "…" not in listed.stdout and "comes from the cap-100 run." in " ".join(listed.stdout.split())  # wrapped, whole
    proc = runner("experiments", "nope", cwd=tmp_path)
    assert proc.returncode == 2 and "known: turn_cap" in one_error(proc.stderr)
    proc = runner("experiments", "local_suite", "--skip-local", cwd=tmp_path)
    assert proc.returncode == 2 and "nothing to run" in proc.stderr
    proc = runner("experiments", "dedupe", "--runs-dir", "mine", cwd=tmp_path, env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "mine" / "experiments" / "dedupe.md").is_file()
    assert max(map(len, proc.stdout.splitlines())) <= 80
    journal = (tmp_path / "mine" / "experiments" / "journal.md").read_text()
    assert re.search(r"^## \d{4}-\d\d-\d\d \d\d:\d\d UTC · `runner experiments dedupe`: ", journal, re.M), journal
    proc = runner("experiments", "dedupe", "--out", "elsewhere", "--journal", "kept.md", cwd=tmp_path)
    assert (tmp_path / "elsewhere" / "dedupe.md").is_file()
    kept = (tmp_path / "kept.md").read_text()
    assert kept.startswith("# Journal\n") and kept.count("`runner experiments dedupe`") == 1
    assert "load average" in kept and not (tmp_path / "elsewhere" / "journal.md").exists()


def test_shell_completion_installs_and_completes(tmp_path: Path) -> None:
    # typed in bash, as a user does: the shell is found among the command's parent processes
    # (it is not found when the test runs with no shell above it, e.g. under nohup)
    proc = subprocess.run(["bash", "-c", f"{shlex.quote(sys.executable)} -m runner --install-completion; exit $?"],
                          cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path), "SHELL": "/bin/bash"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "bash completion installed" in proc.stdout, proc.stdout + proc.stderr
    assert "runner" in (tmp_path / ".bashrc").read_text()
    proc = runner(cwd=tmp_path, env={"COMP_WORDS": "runner ru", "COMP_CWORD": "1", "_RUNNER_COMPLETE": "complete_bash"})
    assert proc.stdout.split() == ["run", "runs"]


@pytest.mark.slow
def test_serve_logs_one_line_per_request(tmp_path: Path) -> None:
    import httpx

    env = {k: v for k, v in os.environ.items() if k not in ("RUNNER_RUNS_DIR", "RUNNER_STORE")}
    server = subprocess.Popen([sys.executable, "-m", "runner", "serve", "--model", "smollm2", "--port", "0"], cwd=tmp_path,
                              env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        reply = httpx.post(url + "/chat/completions", timeout=120, json={
            "model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi."}]})
        assert reply.status_code == 200
        httpx.get(url + "/models", timeout=10)
        time.sleep(0.6)
    finally:
        server.send_signal(2)
        _, err = server.communicate(timeout=30)
    logged = [line.split() for line in err.splitlines() if line.startswith("  POST") or line.startswith("  GET")]
    usage = reply.json()["usage"]
    assert logged[0][:3] == ["POST", "/v1/chat/completions", "200"]
    assert logged[0][3:5] == [f"in={usage['prompt_tokens']}", f"out={usage['completion_tokens']}"]
    assert logged[1][:3] == ["GET", "/v1/models", "200"] and logged[1][-1] == "ms"


# --- suite reports --------------------------------------------------------------------------


def test_suite_total_adds_up_and_the_report_names_models_date_and_runs(tmp_path: Path) -> None:
    proc = runner("suite", "--provider", "scripted", "--repeat", "2", "--runs-dir", "runs", cwd=tmp_path,
                  env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in ("timeout_file", "count_files", "read_notes", "read_each",
                                                      "largest_file", "rotate_logs", "TOTAL")]
    body, total = rows[:-1], rows[-1]
    assert total[0] == "TOTAL" and len(body) == 6
    assert float(total[2].replace(",", "")) == pytest.approx(sum(float(r[2].replace(",", "")) for r in body), abs=6)
    assert total[1] == f"{sum(float(r[1].split('/')[0]) for r in body):g}/{sum(float(r[1].split('/')[1]) for r in body):g}"
    assert total[3] == "12/12" and "TOTAL: the sum of the rows" in proc.stdout
    report = next((tmp_path / "runs").glob("suite-*.json"))
    md = report.with_suffix(".md").read_text()
    data = json.loads(report.read_text())
    assert md.startswith("# Suite report: scripted\n") and time.strftime("%Y-%m-%d", time.gmtime()) in md
    assert all(f"`{r['run_id']}`" in md for r in data["results"])


def test_suite_resume_finishes_a_cancelled_suite(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RUNNER_RUNS_DIR", "RUNNER_STORE")}
    proc = subprocess.Popen([sys.executable, "-m", "runner", "suite", "--provider", "scripted", "--latency-ms", "150",
                             "--runs-dir", "runs"], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    while "timeout_file" not in proc.stderr.readline():
        pass
    proc.send_signal(2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    report = next((tmp_path / "runs").glob("suite-*.json"))
    assert f"runner suite --resume runs/{report.name}" in err
    before = json.loads(report.read_text())
    done = {r["run_id"]: r for r in before["results"] if r["status"] == "completed"}
    time.sleep(1.1)  # the new report gets a new name
    proc2 = runner("suite", "--resume", str(report), "--runs-dir", "runs", "--json", cwd=tmp_path)
    assert proc2.returncode == 0, proc2.stderr
    after = json.loads(proc2.stdout)
    assert [r["status"] for r in after["results"]] == ["completed"] * 6 and not after["cancelled"]
    assert [r["task"] for r in after["results"]] == ["timeout_file", "count_files", "read_notes", "read_each",
                                                     "largest_file", "rotate_logs"]
    assert {r["run_id"] for r in after["results"]} >= set(before["unfinished"]) | set(done)
    assert len({r["run_id"] for r in after["results"]}) == 6 and after["unfinished"] == []
    for run_id, r in done.items():  # nothing run twice
        assert next(a for a in after["results"] if a["run_id"] == run_id)["cost_usd"] == r["cost_usd"]
    proc3 = runner("suite", "--resume", after["report_path"], "--runs-dir", "runs", cwd=tmp_path)
    assert proc3.returncode == 2 and "nothing to resume" in proc3.stderr


def test_a_long_run_summary_keeps_the_per_turn_line_short(tmp_path: Path) -> None:
    proc = runner("run", "--scenario", "runaway", "--max-turns", "30", "--runs-dir", "runs", cwd=tmp_path,
                  env={"COLUMNS": "80"})
    line = next(x for x in proc.stdout.splitlines() if "per-turn prompt tokens" in x)
    assert "(30 turns)" in line and len(line) <= 80, line


def test_config_file_tools_and_model_apply_to_a_run(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(WEATHER)
    with FakeProvider(weather_handler) as fake:
        (tmp_path / "runner.toml").write_text(f'base_url = "{fake.base_url}"\nmodel = "m-from-config"\n'
                                              'tools = ["mytools:Weather"]\nmax_retries = 0\n')
        proc = runner_process("run", "Weather in Lisbon?", "--runs-dir", "runs", "--json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert fake.requests[0]["model"] == "m-from-config"
        assert "get_weather" in [t["function"]["name"] for t in fake.requests[0]["tools"]]
    state = FileStore(tmp_path / "runs").load(json.loads(proc.stdout)["run_id"])
    assert state.config.endpoint.max_retries == 0
    assert state.config.tool_refs == {"get_weather": f"{tmp_path / 'mytools.py'}:Weather"}


def test_a_worker_finds_the_runs_tool_and_key_again(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(WEATHER)
    (tmp_path / "runner.toml").write_text('api_key_env = "MY_PROVIDER_KEY"\n')
    env = {"MY_PROVIDER_KEY": KEY}
    with FakeProvider(weather_handler) as fake:
        proc = runner_process("run", "Weather in Lisbon?", "--base-url", fake.base_url, "--model", "m", "--tool",
                              "mytools:Weather", "--detach", "--runs-dir", "runs", "--json", cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        run_id = json.loads(proc.stdout)["run_id"]
        worker = runner_process("worker", "--idle-exit", "0.5", "--runs-dir", "runs", cwd=tmp_path, env=env,
                                timeout=120)
        assert worker.returncode == 0, worker.stderr
        assert fake.auth and all(a == f"Bearer {KEY}" for a in fake.auth)
    state = FileStore(tmp_path / "runs").load(run_id)
    assert state.status == "completed" and state.answer == "The weather: Lisbon: 21 C, clear"
    assert grep_tree(tmp_path / "runs", KEY) == []


def test_show_places_a_slipped_turn_and_runners_correction(tmp_path: Path) -> None:
    def handler(body: dict[str, Any]) -> Answer:
        if not any(m["role"] == "user" and m.get("name") == "runner" for m in body["messages"]):
            return completion({"role": "assistant", "content": "   "})  # blank: a slip
        return completion({"role": "assistant", "content": "Three files."})

    with FakeProvider(handler) as fake:
        proc = runner("run", "How many files?", "--base-url", fake.base_url, "--model", "m", "--runs-dir", "runs",
                      "--json", cwd=tmp_path)
    run_id = json.loads(proc.stdout)["run_id"]
    shown = runner("show", run_id, "--runs-dir", "runs", cwd=tmp_path, env={"COLUMNS": "80"}).stdout
    lines = shown.splitlines()
    slip = next(i for i, x in enumerate(lines) if "slip: blank_content, not kept" in x)
    again = next(i for i, x in enumerate(lines) if x.startswith("── runner (corrects a slip; corrective_retries)"))
    answer = next(i for i, x in enumerate(lines) if x.startswith("── turn 2"))
    assert lines[slip].startswith("── turn 1") and slip < again < answer and "Three files." in lines[answer + 1]


def test_a_scenario_never_reaches_the_provider_the_environment_names(tmp_path: Path) -> None:
    """$RUNNER_BASE_URL, $OPENAI_BASE_URL and runner.toml's base_url name the user's provider:
    a scenario run keeps to runner's own scripted provider (only --base-url moves it)."""
    with FakeProvider(scripted("plan")) as fake:
        (tmp_path / "runner.toml").write_text(f'base_url = "{fake.base_url}"\n')
        for env in ({"RUNNER_BASE_URL": fake.base_url}, {"OPENAI_BASE_URL": fake.base_url}, {}):
            proc = runner("run", "--scenario", "plan", "--latency-ms", "1", "--runs-dir", "runs", "--json",
                          cwd=tmp_path, env={**env, "RUNNER_API_KEY": KEY})
            assert proc.returncode == 0 and json.loads(proc.stdout)["status"] == "completed", proc.stderr
        assert fake.requests == []


def test_a_tool_returning_data_is_read_as_json_and_one_returning_nothing_is_its_error(tmp_path: Path) -> None:
    (tmp_path / "datatools.py").write_text(WEATHER.replace('return f"{args.city}: 21 C, clear"',
                                                           'return {"city": args.city, "temp_c": 21}') + '''

class Nothing(Weather):
    def run_sync(self, args, ctx):
        print("looked it up")  # and forgot to return it; a print never reaches --json's stdout
''')
    said = {}
    with FakeProvider(weather_handler) as fake:
        for attr in ("Weather", "Nothing"):
            proc = runner_process("run", "Weather in Lisbon?", "--base-url", fake.base_url, "--model", "m",
                                  "--no-builtin-tools", "--tool", f"datatools.py:{attr}", "--runs-dir", "runs",
                                  "--json", cwd=tmp_path)
            assert proc.returncode == 0, proc.stderr
            said[attr] = json.loads(proc.stdout)["answer"]
            assert ("looked it up" in proc.stderr) == (attr == "Nothing")
    assert said["Weather"] == 'The weather: {"city": "Lisbon", "temp_c": 21}'
    assert said["Nothing"] == ("The weather: Error: the tool get_weather returned NoneType, not text "
                               "(a tool returns a str)")


def test_a_resume_tool_stands_in_only_for_a_tool_of_the_runs_own(tmp_path: Path) -> None:
    """`resume --tool` gives a run's own tool that moved; it never replaces a built-in the run
    used, nor adds a tool the run does not offer. Refused before the run is touched."""
    (tmp_path / "mine.py").write_text(OWN_FILES + "\n\nclass Weather2(ReadFile):\n    name = 'get_weather'\n")
    proc = runner_process("run", "--scenario", "destructive", "--runs-dir", "runs", "--json", cwd=tmp_path)
    run_id = json.loads(proc.stdout)["run_id"]
    seq = FileStore(tmp_path / "runs").load(run_id).seq
    for spec, said in [("mine.py:ReadFile", "--tool gives 'read_file', but the run uses the built-in read_file: a "
                                            "resume does not put another tool in its place"),
                       ("mine.py:Weather2", "--tool gives 'get_weather', a tool the run does not offer (it offers "
                                            "list_files, read_file, delete_file, scan_archive)")]:
        proc = runner_process("resume", run_id, "--approve", "c2", "--tool", spec, "--runs-dir", "runs", cwd=tmp_path)
        assert proc.returncode == 2 and said in one_error(proc.stderr), proc.stderr
    assert FileStore(tmp_path / "runs").load(run_id).seq == seq


def test_a_tool_given_again_on_resume_is_recorded_where_it_is_now(tmp_path: Path) -> None:
    """The tools file moved: `resume --tool NEW/PATH --detach` records the new place, so the
    worker that drives the run next finds it."""
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "mytools.py").write_text(WEATHER)
    with FakeProvider(weather_handler) as fake:
        proc = runner_process("run", "Weather in Lisbon?", "--base-url", fake.base_url, "--model", "m", "--tool",
                              "old/mytools.py:Weather", "--max-turns", "1", "--runs-dir", "runs", "--json",
                              cwd=tmp_path)
        run_id = json.loads(proc.stdout)["run_id"]
        (tmp_path / "old").rename(tmp_path / "new")
        proc = runner_process("resume", run_id, "--max-turns", "3", "--tool", "new/mytools.py:Weather", "--detach",
                              "--runs-dir", "runs", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        state = FileStore(tmp_path / "runs").load(run_id)
        assert state.config.tool_refs == {"get_weather": f"{tmp_path / 'new' / 'mytools.py'}:Weather"}
        proc = runner_process("worker", "--runs-dir", str(tmp_path / "runs"), "--idle-exit", "1", cwd=tmp_path / "new")
    assert proc.returncode == 0, proc.stderr
    assert FileStore(tmp_path / "runs").load(run_id).status == "completed"


def test_a_tools_module_that_imports_its_neighbour_works_from_any_folder(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "helper.py").write_text('CLEAR = "21 C, clear"\n')
    (tmp_path / "proj" / "mytools.py").write_text(
        WEATHER.replace("from runner import Tool", "from runner import Tool\n\nfrom helper import CLEAR")
        .replace('return f"{args.city}: 21 C, clear"', 'return f"{args.city}: {CLEAR}"'))
    with FakeProvider(weather_handler) as fake:
        proc = runner_process("run", "Weather in Lisbon?", "--base-url", fake.base_url, "--model", "m", "--tool",
                              "mytools:Weather", "--detach", "--runs-dir", str(tmp_path / "runs"), "--json",
                              cwd=tmp_path / "proj")
        assert proc.returncode == 0, proc.stderr
        worker = runner_process("worker", "--idle-exit", "0.5", "--runs-dir", "runs", cwd=tmp_path)
        assert worker.returncode == 0, worker.stdout + worker.stderr
    state = FileStore(tmp_path / "runs").load(json.loads(proc.stdout)["run_id"])
    assert state.status == "completed" and state.answer == "The weather: Lisbon: 21 C, clear"
