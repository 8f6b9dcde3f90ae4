"""Tools from MCP servers, against the real servers (`scripts/mcp_servers.sh` installs
mcp-server-time, mcp-server-git, @modelcontextprotocol/server-filesystem and -everything into a
cache outside the checkout) and real processes: `runner run`, `runner resume`, `runner worker`
as child processes, killed with SIGKILL where it matters; `tests/mcp_probe.py` (a server on
the official SDK) where a published server cannot show something on demand. The model is
`tests.fakeprovider`: a real HTTP server whose replies script the tool calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.errors import UsageError
from runner.harness import workspace_template
from runner.mcp import governance, offerable_schema, offered_name, parse_option, read_claude_config, servers_for
from runner.state import McpServer
from runner.store import FileStore
from tests.conftest import cli, cli_process, one_error
from tests.fakeprovider import Answer, FakeProvider, completion, tool_call

pytestmark = pytest.mark.mcp

SERVERS = Path(os.environ.get("RUNNER_MCP_SERVERS") or Path.home() / ".cache" / "runner" / "mcp")
TIME = SERVERS / "py" / "bin" / "mcp-server-time"
FS = SERVERS / "node_modules" / ".bin" / "mcp-server-filesystem"
EVERYTHING = SERVERS / "node_modules" / ".bin" / "mcp-server-everything"
PROBE = Path(__file__).with_name("mcp_probe.py")


@pytest.fixture(autouse=True, scope="module")
def _servers_installed() -> None:
    missing = [p for p in (TIME, FS, EVERYTHING) if not p.exists()]
    if missing:  # ./scripts/test.sh installs them first: their absence is a broken setup, not a skip
        pytest.fail(f"MCP servers missing ({', '.join(map(str, missing))}): run scripts/mcp_servers.sh")


Step = tuple[str, dict[str, Any]]


def calls(*steps: Step | Callable[[list[dict[str, Any]]], Step]) -> Callable[[dict[str, Any]], Answer]:
    """A model that makes one tool call per turn, `steps` in order (a step may be a function
    of the messages), then answers, naming the last tool result's first line."""

    def handler(body: dict[str, Any]) -> Answer:
        messages = body["messages"]
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if turn < len(steps):
            step = steps[turn]
            name, args = step(messages) if callable(step) else step
            return completion({"role": "assistant", "content": None,
                               "tool_calls": [tool_call(f"c{turn + 1}", name, json.dumps(args))]})
        last = next((m["content"] for m in reversed(messages) if m["role"] == "tool"), "")
        first = next((line.strip() for line in last.splitlines() if line.strip()), "nothing")
        return completion({"role": "assistant", "content": f"Done. The last call returned {first[:200]}"})

    return handler


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


def trace(runs: Path, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (runs / run_id / "trace.jsonl").read_text().splitlines() if line.strip()]


def run_id_of(proc: subprocess.CompletedProcess[str]) -> str:
    return str(json.loads(proc.stdout)["run_id"])


def spawn(*args: str, runs: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full = {**os.environ, "RUNNER_RUNS_DIR": str(runs), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "runner", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full)


def wait_for(what: Callable[[], Any], timeout_s: float = 60.0, every_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(every_s)
    raise AssertionError(f"waited {timeout_s} s in vain")


def events_of(runs: Path, kind: str) -> list[dict[str, Any]]:
    """Every `kind` event in any trace under `runs`."""
    found = []
    for path in runs.glob("*/trace.jsonl"):
        for line in path.read_text().splitlines():
            if f'"type":"{kind}"' in line:
                with_torn = line.strip()
                if with_torn.endswith("}"):
                    found.append(json.loads(with_torn))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def group_members(pgid: int) -> list[int]:
    """Live processes in process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


# --- naming, schemas, governance (no server) -------------------------------------------------


def test_servers_are_named_three_ways_and_secrets_stay_in_memory(tmp_path: Path) -> None:
    stdio = parse_option("fs=npx -y '@modelcontextprotocol/server-filesystem' '/tmp/a b'")
    assert stdio.command == ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/tmp/a b"]
    assert parse_option("ev=http://127.0.0.1:3001/mcp").url == "http://127.0.0.1:3001/mcp"
    for bad in ("fs", "a__b=x", "fs=", "fs=echo 'open"):
        with pytest.raises(UsageError):
            parse_option(bad)
    desktop = tmp_path / "claude.json"
    desktop.write_text(json.dumps({"mcpServers": {
        "gh": {"command": "gh-server", "args": ["--stdio"], "env": {"GH_TOKEN": "ghp_literal", "MODE": "${MODE}"}},
        "web": {"url": "https://u:p@example.com/mcp?key=1", "headers": {"Authorization": "Bearer ${WEB_KEY}"}},
        "off": {"command": "x", "disabled": True}}}))
    gh, web = read_claude_config(desktop)
    assert gh.env == {"GH_TOKEN": None, "MODE": "${MODE}"} and gh.secrets() == {"env:GH_TOKEN": "ghp_literal"}
    assert "ghp_literal" not in gh.model_dump_json()
    assert web.headers == {"Authorization": "Bearer ${WEB_KEY}"}
    table = {"servers": {"t": {"command": "mcp-server-time", "approve": ["*"], "prefix": ""}}}
    servers = servers_for(["ev=http://h/mcp"], desktop, ["gh:read_*"], table, "runner.toml")
    assert [s.name for s in servers] == ["t", "gh", "web", "ev"] and servers[1].tools == ["read_*"]
    with pytest.raises(UsageError, match="secret"):  # runner's own config file never holds one
        servers_for([], None, [], {"servers": {"t": {"command": "x", "env": {"API_TOKEN": "abc"}}}}, "runner.toml")
    with pytest.raises(UsageError, match="more than one"):
        servers_for(["gh=x"], desktop, [])
    web_only = tmp_path / "web.json"
    web_only.write_text(json.dumps({"mcpServers": {"web": {"url": "https://h/mcp", "headers": {"X-Key": "k1"}}}}))
    queued = cli("run", "hi", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--mcp-config", str(web_only),
                 "--detach", runs_dir=tmp_path / "runs")
    assert queued.returncode == 2 and "header X-Key is given as a value, which is never saved" in queued.stderr
    assert "k1" not in queued.stderr


def test_offered_names_and_schemas_fit_openai_and_the_call_grammar() -> None:
    server = McpServer(name="fs", command=["x"])
    assert offered_name(server, "read.file/v2") == "fs__read_file_v2"
    assert len(offered_name(server, "x" * 80)) == 64
    assert offered_name(server.model_copy(update={"prefix": ""}), "read_file") == "read_file"
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "title": "Args",
              "properties": {"title": {"type": "string", "title": "Title"}, "at": {"$ref": "#/definitions/Point"}},
              "required": ["title", "gone"], "definitions": {"Point": {"type": "object", "title": "P",
                                                                          "properties": {"x": {"type": "number"}}}}}
    offered = offerable_schema(schema, "fs__put")
    assert offered == {"type": "object", "properties": {"title": {"type": "string"},
                                                        "at": {"$ref": "#/$defs/fs__put_Point"}},
                       "required": ["title"], "$defs": {"fs__put_Point": {"type": "object",
                                                                           "properties": {"x": {"type": "number"}}}}}
    for bad, why in (({"anyOf": [{"type": "object"}]}, "anyOf at the top"), ({"type": "string"}, "not an object"),
                     ({"type": "object", "properties": {"a": {"$ref": "https://x/s.json"}}}, "outside itself"),
                     ({"type": "object", "properties": {"a": {"type": 5}}}, "not valid JSON Schema")):
        with pytest.raises(ValueError, match=why):
            offerable_schema(bad, "t")


def test_annotations_govern_and_the_config_beats_them() -> None:
    from mcp.types import Tool as RemoteTool
    from mcp.types import ToolAnnotations

    def tool(name: str, **hints: bool) -> RemoteTool:
        annotations = ToolAnnotations.model_validate(hints) if hints else None
        return RemoteTool.model_validate({"name": name, "inputSchema": {"type": "object"}, "annotations": annotations})

    server = McpServer(name="s", command=["x"])
    assert governance(server, tool("read", readOnlyHint=True)) == (True, True, False)
    assert governance(server, tool("write", readOnlyHint=False, destructiveHint=True, idempotentHint=True)) == (
        False, True, True)
    assert governance(server, tool("add", destructiveHint=False)) == (False, False, False)
    assert governance(server, tool("bare")) == (False, False, True)  # the protocol's defaults: a destructive write
    ruled = server.model_copy(update={"approve": ["read"], "allow": ["w*"], "deny": ["add"]})
    assert governance(ruled, tool("read", readOnlyHint=True)) == (True, True, True)
    assert governance(ruled, tool("write", destructiveHint=True)) == (False, False, False)
    assert governance(ruled, tool("add")) is None
    distrusted = server.model_copy(update={"trust_hints": False})
    assert governance(distrusted, tool("read", readOnlyHint=True)) == (False, False, True)


# --- real servers ----------------------------------------------------------------------------


def test_time_server_answers_and_the_trace_names_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    model = calls(("time__get_current_time", {"timezone": "Europe/Lisbon"}))
    with FakeProvider(model) as fake:
        proc = cli("run", "What time is it in Lisbon?", "--base-url", fake.base_url, "--model", "fake",
                   "--no-builtin-tools", "--mcp", f"time={TIME}", "--json", runs_dir=runs)
    assert proc.returncode == 0, proc.stderr
    run_id = run_id_of(proc)
    offered = [t["function"]["name"] for t in fake.requests[0]["tools"]]
    assert offered == ["time__convert_time", "time__get_current_time"]
    result = tool_messages(fake.requests[1])[0]["content"]
    assert json.loads(result)["timezone"] == "Europe/Lisbon"  # the next request carries the result
    events = trace(runs, run_id)
    started = next(e for e in events if e["type"] == "mcp_server_started")
    assert started["server"] == "time" and started["serverName"] == "mcp-time" and len(started["toolsHash"]) == 16
    assert started["target"] == str(TIME) and started["transport"] == "stdio" and started["protocolVersion"]
    call = next(e for e in events if e["type"] == "mcp_call")
    assert (call["server"], call["tool"], call["callId"], call["isError"]) == ("time", "get_current_time", "c1", False)
    assert call["structured"]["timezone"] == "Europe/Lisbon"
    assert [e["type"] for e in events].index("run_started") == 0
    shown = cli("show", run_id, runs_dir=runs).stdout
    assert "time__get_current_time" in shown and "from time (mcp-time" in shown, shown
    from runner.view.pages import run_view

    [view_call] = [c for entry in run_view(FileStore(runs), run_id).entries for c in entry.calls]
    assert view_call.server == "time"  # runner view says which server answered too
    assert not group_members(started["pid"]) and not alive(started["pid"])  # stopped with the run


def _fs_run(runs: Path, workspace: Path, fake: FakeProvider) -> subprocess.CompletedProcess[str]:
    return cli("run", "Write hello.txt", "--base-url", fake.base_url, "--model", "fake", "--no-builtin-tools",
               "--mcp", f"fs={FS} {workspace}", "--json", runs_dir=runs)


def test_filesystem_write_stops_for_approval_and_is_written_once_or_never(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for verdict in ("approve", "reject"):
        workspace = tmp_path / f"ws-{verdict}"
        shutil.copytree(workspace_template(), workspace)
        target = workspace / "hello.txt"
        model = calls(("fs__write_file", {"path": str(target), "content": "hello\n"}))
        with FakeProvider(model) as fake:
            first = _fs_run(runs, workspace, fake)
            assert first.returncode == 3, first.stderr
            state = json.loads(first.stdout)
            assert state["status"] == "interrupted" and "fs__write_file needs approval" in state["reason"]
            assert not target.exists()
            verdict_args = ["--approve", "c1"] if verdict == "approve" else ["--reject", "c1", "--reason", "no"]
            done = cli("resume", state["run_id"], *verdict_args, "--json", runs_dir=runs)
            assert done.returncode == 0, done.stderr
        calls_made = [e for e in trace(runs, state["run_id"]) if e["type"] == "mcp_call"]
        if verdict == "approve":
            assert target.read_text() == "hello\n" and len(calls_made) == 1
        else:
            assert not target.exists() and calls_made == []
            assert "declined" in tool_messages(fake.requests[-1])[0]["content"]


def test_an_error_result_goes_to_the_model_and_the_run_goes_on(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    workspace = tmp_path / "ws"
    shutil.copytree(workspace_template(), workspace)
    model = calls(("fs__read_text_file", {"path": str(workspace / "missing.txt")}),
                  ("fs__list_directory", {"path": str(workspace)}))
    (tmp_path / "runner.toml").write_text(f'[mcp.servers.fs]\ncommand = "{FS}"\nargs = ["{workspace}"]\n')
    with FakeProvider(model) as fake:  # the server named in the config file, two of its tools offered
        proc = cli("run", "Read missing.txt", "--base-url", fake.base_url, "--model", "fake", "--no-builtin-tools",
                   "--mcp-tools", "fs:read_text_file", "--mcp-tools", "fs:list_directory", "--json", runs_dir=runs,
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [t["function"]["name"] for t in fake.requests[0]["tools"]] == ["fs__list_directory", "fs__read_text_file"]
    error = tool_messages(fake.requests[1])[0]["content"]
    assert error.startswith("Error: ") and "missing.txt" in error
    assert "notes.txt" in tool_messages(fake.requests[2])[1]["content"]
    events = trace(runs, run_id_of(proc))
    assert [e["isError"] for e in events if e["type"] == "mcp_call"] == [True, False]  # one call each: no retry
    assert json.loads(proc.stdout)["status"] == "completed"


LONG = ("everything__trigger-long-running-operation", {"duration": 3, "steps": 30})


def _kill_mid_call(runs: Path, fake: FakeProvider, *mcp: str) -> tuple[str, dict[str, Any]]:
    """Start `runner run` on `fake`, SIGKILL it while its first call is in flight; returns the
    run id and the server's `mcp_server_started` event."""
    proc = spawn("run", "Run the long operation", "--base-url", fake.base_url, "--model", "fake",
                 "--no-builtin-tools", *mcp, runs=runs)
    try:
        wait_for(lambda: events_of(runs, "tool_start"))
        started = wait_for(lambda: events_of(runs, "mcp_server_started"))[0]
        time.sleep(0.5)  # the call is in flight on the server
        assert alive(started["pid"])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    run_id = started["runId"]
    return run_id, started


@pytest.mark.slow
def test_kill_9_mid_call_leaves_no_server_and_resume_reruns_only_what_may_rerun(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with FakeProvider(calls(LONG)) as fake:
        run_id, started = _kill_mid_call(runs, fake, "--mcp", f"everything={EVERYTHING}")
        pgid = os.getpgid(started["pid"]) if alive(started["pid"]) else None
        wait_for(lambda: not alive(started["pid"]), timeout_s=5)  # no server outlives runner
        # nor anything it started: a launcher in its group may exit a moment after the server
        wait_for(lambda: pgid is None or not group_members(pgid), timeout_s=5)
        resumed = cli("resume", run_id, "--json", runs_dir=runs)  # read-only by its annotation: run again
        assert resumed.returncode == 0, resumed.stderr
        assert "Long running operation completed" in tool_messages(fake.requests[-1])[0]["content"]

    runs = tmp_path / "runs2"
    distrusting = tmp_path / "mcp.json"  # the same tool taken as a non-idempotent write, allowed without asking
    distrusting.write_text(json.dumps({"mcpServers": {"everything": {
        "command": str(EVERYTHING), "trust_hints": False, "allow": ["trigger-*"]}}}))
    with FakeProvider(calls(LONG)) as fake:
        run_id, started = _kill_mid_call(runs, fake, "--mcp-config", str(distrusting))
        wait_for(lambda: not alive(started["pid"]), timeout_s=5)
        held = cli("resume", run_id, "--json", runs_dir=runs)
        assert held.returncode == 3 and "outcome is unknown" in json.loads(held.stdout)["reason"]
        asked = len(fake.requests)
        assert len(fake.requests) == asked and not events_of(runs, "mcp_call")  # nothing sent without a verdict
        again = cli("resume", run_id, "--approve", "c1", "--json", runs_dir=runs)
        assert again.returncode == 0, again.stderr
        assert "Long running operation completed" in tool_messages(fake.requests[-1])[0]["content"]


def test_a_server_killed_mid_run_gives_an_error_and_is_started_again(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    model = calls(LONG, ("everything__echo", {"message": "still here"}))
    with FakeProvider(model) as fake:
        proc = spawn("run", "Run it", "--base-url", fake.base_url, "--model", "fake", "--no-builtin-tools",
                     "--mcp", f"everything={EVERYTHING}", "--json", runs=runs)
        wait_for(lambda: events_of(runs, "tool_start"))
        first = wait_for(lambda: events_of(runs, "mcp_server_started"))[0]
        time.sleep(0.3)
        os.kill(first["pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    error = tool_messages(fake.requests[1])[0]["content"]
    assert "stopped during the call (killed by SIGKILL)" in error
    assert tool_messages(fake.requests[2])[1]["content"] == "Echo: still here"
    events = trace(runs, json.loads(out)["run_id"])
    exited = next(e for e in events if e["type"] == "mcp_server_exited")
    assert exited["status"] == "killed by SIGKILL" and "Starting default (STDIO) server" in exited["stderrTail"]
    pids = [e["pid"] for e in events if e["type"] == "mcp_server_started"]
    assert len(pids) == 2 and pids[0] != pids[1]


def test_a_server_that_does_not_start_leaves_the_run_interrupted_and_resumable(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    model = calls(("everything__echo", {"message": "hi"}))
    with FakeProvider(model) as fake:
        args = ("--base-url", fake.base_url, "--model", "fake", "--no-builtin-tools", "--mcp", "everything=${EV_BIN}")
        first = cli("run", "Echo hi", *args, "--json", runs_dir=runs, env={"EV_BIN": None})
        assert first.returncode == 3, first.stderr
        state = json.loads(first.stdout)
        assert state["status"] == "interrupted" and "\n" not in state["reason"]
        assert state["reason"] == "MCP server 'everything' did not start: ${EV_BIN} is not set in this process's environment"
        assert fake.requests == []
        missing = cli("resume", state["run_id"], "--json", runs_dir=runs, env={"EV_BIN": "/nonexistent/server"})
        assert missing.returncode == 3 and "cannot run /nonexistent/server" in json.loads(missing.stdout)["reason"]
        done = cli("resume", state["run_id"], "--json", runs_dir=runs, env={"EV_BIN": str(EVERYTHING)})
    assert done.returncode == 0, done.stderr
    assert tool_messages(fake.requests[-1])[0]["content"] == "Echo: hi"


def _probe_config(tmp_path: Path, **env: str) -> Path:
    path = tmp_path / "probe.json"
    path.write_text(json.dumps({"mcpServers": {"probe": {
        "command": sys.executable, "args": [str(PROBE)],
        "env": {"PROBE_LOG": "${PROBE_LOG}", "PROBE_VARIANT": "${PROBE_VARIANT}", **env}}}}))
    return path


def _probe_env(tmp_path: Path, variant: str = "1") -> dict[str, str]:
    return {"PROBE_LOG": str(tmp_path / "probe.log"), "PROBE_VARIANT": variant}


def _probe_log(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "probe.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_a_resume_refuses_when_a_used_tool_changed_and_force_goes_on(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    config = _probe_config(tmp_path)
    model = calls(("probe__greet", {"name": "Ada"}), ("probe__erase", {"record": "r1"}))
    with FakeProvider(model) as fake:
        first = cli("run", "Greet, then erase", "--base-url", fake.base_url, "--model", "fake", "--no-builtin-tools",
                    "--mcp-config", str(config), "--json", runs_dir=runs, env=_probe_env(tmp_path))
        assert first.returncode == 3 and "probe__erase needs approval" in first.stdout
        run_id = run_id_of(first)
        same = cli("resume", run_id, "--reject", "c2", "--reason", "not yet", "--json", runs_dir=runs,
                   env=_probe_env(tmp_path))
        assert same.returncode == 0, same.stderr
    runs = tmp_path / "runs2"
    with FakeProvider(calls(("probe__greet", {"name": "Ada"}), ("probe__erase", {"record": "r1"}))) as fake:
        first = cli("run", "Greet, then erase", "--base-url", fake.base_url, "--model", "fake", "--no-builtin-tools",
                    "--mcp-config", str(config), runs_dir=runs, env=_probe_env(tmp_path))
        [run_id] = [p.name for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")]
        changed = cli("resume", run_id, "--reject", "c2", runs_dir=runs, env=_probe_env(tmp_path, "2"))
        assert changed.returncode == 2
        assert one_error(changed.stderr) == (
            f"error: run {run_id} called probe__greet of MCP server 'probe', which is defined differently "
            "(description, schema or annotations) now; resume with --force to go on with the tools as they are")
        forced = cli("resume", run_id, "--force", "--json", runs_dir=runs, env=_probe_env(tmp_path, "2"))
        assert forced.returncode == 0, forced.stderr
        greet = next(t for t in fake.requests[-1]["tools"] if t["function"]["name"] == "probe__greet")
        assert set(greet["function"]["parameters"]["properties"]) == {"name", "loud"}
    warnings = [line for line in first.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: MCP server 'probe': tool 'lookup' is not offered: its input schema refers to "
                        "'https://example.com/key.json', outside itself"], first.stderr
    assert "probe__lookup" not in {t["function"]["name"] for t in fake.requests[0]["tools"]}


def test_the_call_id_travels_in_meta_and_a_stop_reaches_the_server_within_50_ms(tmp_path: Path) -> None:
    from runner.cancel import CancelToken
    from runner.harness import drive
    from runner.state import Endpoint, RunConfig, new_run

    config = _probe_config(tmp_path)
    [server] = read_claude_config(config)
    model = calls(("probe__greet", {"name": "Ada"}), ("probe__slow_write", {"seconds": 30}))
    with FakeProvider(model) as fake:
        state = new_run("Greet, then write", RunConfig(endpoint=Endpoint(model="fake", base_url=fake.base_url),
                                                       tools=[], mcp=[server.model_copy(update={"allow": ["*"]})]))
        cancel = CancelToken()

        async def go() -> tuple[Any, float]:
            task = asyncio.ensure_future(drive(state, fake.base_url, FileStore(tmp_path / "runs"), cancel=cancel))
            while not any(e["tool"] == "slow_write" for e in _probe_log(tmp_path)):
                await asyncio.sleep(0.01)
            pressed = time.time()
            cancel.cancel("stop pressed")
            return await task, pressed

        os.environ.update(_probe_env(tmp_path))
        try:
            stopped, pressed = asyncio.run(go())
        finally:
            for name in _probe_env(tmp_path):
                del os.environ[name]
    assert stopped.status == "interrupted" and stopped.reason == "cancelled: stop pressed"
    log = _probe_log(tmp_path)
    assert log[0]["meta"] == {"runner/callId": "c1", "runner/runId": state.run_id}
    assert [e["event"] for e in log if e["tool"] == "slow_write"] == ["start", "cancelled"]  # the notification
    events = trace(tmp_path / "runs", state.run_id)
    cancelled = next(e for e in events if e["type"] == "tool_cancelled")
    assert next(e for e in events if e["type"] == "mcp_call" and e["tool"] == "slow_write")["failure"] == "cancelled"
    assert (cancelled["ts"] - pressed) * 1000 < 50  # the call stopped within 50 ms of the Stop signal
    server_saw = next(e for e in log if e["event"] == "cancelled")["ts"]
    assert server_saw - pressed < 2  # and the server heard of it (the cancel notification) right away


def test_a_worker_on_postgresql_drives_an_mcp_run_and_the_secret_stays_out_of_the_store(
        tmp_path: Path, pg_url: str) -> None:
    secret = "s3cr3t-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:12]
    config = _probe_config(tmp_path, PROBE_SECRET=secret)
    model = calls(("probe__secret_digest", {}))
    with FakeProvider(model) as fake:
        queued = cli_process("run", "What is the digest?", "--base-url", fake.base_url, "--model", "fake",
                             "--no-builtin-tools", "--mcp-config", str(config), "--detach", "--json",
                             "--store", pg_url, runs_dir=None, env=_probe_env(tmp_path))
        assert queued.returncode == 0, queued.stderr
        run_id = run_id_of(queued)
        worker = subprocess.run(
            [sys.executable, "-m", "runner", "worker", "--store", pg_url, "--idle-exit", "2", "--poll", "0.1"],
            capture_output=True, text=True, timeout=180,
            env={**os.environ, "PROBE_SECRET": secret, **_probe_env(tmp_path)})
        assert worker.returncode == 0, worker.stderr
        assert f"{run_id}: completed" in worker.stderr
    digest = tool_messages(fake.requests[-1])[0]["content"]
    assert digest == hashlib.sha256(secret.encode()).hexdigest()  # the worker supplied it from its environment
    import psycopg

    with psycopg.connect(pg_url) as conn:  # every row of every table, as text
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'").fetchall()]
        text = "\n".join(str(row[0]) for table in tables
                         for row in conn.execute(f'SELECT t::text FROM "{table}" t').fetchall())
    assert run_id in text and "PROBE_SECRET" in text and secret not in text


def test_streamable_http_server(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([str(EVERYTHING), "streamableHttp"], env={**os.environ, "PORT": str(port)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: _listening(port), timeout_s=30)
        runs = tmp_path / "runs"
        with FakeProvider(calls(("ev__echo", {"message": "over http"}))) as fake:
            proc = cli("run", "Echo", "--base-url", fake.base_url, "--model", "fake", "--no-builtin-tools",
                       "--mcp", f"ev=http://127.0.0.1:{port}/mcp", "--json", runs_dir=runs)
        assert proc.returncode == 0, proc.stderr
        assert tool_messages(fake.requests[-1])[0]["content"] == "Echo: over http"
        started = next(e for e in trace(runs, run_id_of(proc)) if e["type"] == "mcp_server_started")
        assert started["transport"] == "http" and started["target"] == f"http://127.0.0.1:{port}/mcp"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.communicate(timeout=10)


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_kill_9_of_a_worker_leaves_no_server(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with FakeProvider(calls(LONG)) as fake:
        queued = cli("run", "Run the long operation", "--base-url", fake.base_url, "--model", "fake",
                     "--no-builtin-tools", "--mcp", f"everything={EVERYTHING}", "--detach", "--json", runs_dir=runs)
        assert queued.returncode == 0, queued.stderr
        worker = spawn("worker", "--poll", "0.1", runs=runs)
        try:
            wait_for(lambda: events_of(runs, "tool_start"))
            started = wait_for(lambda: events_of(runs, "mcp_server_started"))[0]
            assert alive(started["pid"])
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.communicate(timeout=30)
        wait_for(lambda: not alive(started["pid"]), timeout_s=5)


def test_images_and_resources_are_described_in_one_line_and_bad_arguments_never_reach_the_server() -> None:
    from runner.cancel import CancelToken
    from runner.mcp import Servers
    from runner.state import Endpoint, RunConfig, new_run
    from runner.tools import ToolContext, ToolError

    state = new_run("x", RunConfig(endpoint=Endpoint(model="m"),
                                   mcp=[McpServer(name="ev", command=[str(EVERYTHING)])]))

    async def go() -> dict[str, str]:
        async with Servers(state) as servers:
            tools = {t.name: t for t in await servers.open()}
            ctx = ToolContext(cancel=CancelToken(), workspace=Path("."), call_id="c1", run_id=state.run_id)
            out = {}
            for name, args in (("ev__get-tiny-image", "{}"), ("ev__get-resource-links", '{"count": 2}')):
                out[name] = await tools[name].run(tools[name].parse(args), ctx)
            with pytest.raises(ToolError, match="a: 'x' is not of type 'number'"):
                tools["ev__get-sum"].parse('{"a": "x", "b": 2}')
            return out

    out = asyncio.run(go())
    assert "[image: image/png, 4,035 bytes, not shown]" in out["ev__get-tiny-image"].splitlines()
    assert "[resource link: demo://resource/dynamic/text/2 (Text Resource 2)]" in out["ev__get-resource-links"]


def test_a_call_past_its_timeout_is_a_tool_error_and_is_cancelled_on_the_server(tmp_path: Path) -> None:
    from runner.cancel import CancelToken
    from runner.mcp import Servers
    from runner.state import Endpoint, RunConfig, new_run
    from runner.tools import ToolContext, ToolError

    probe = McpServer(name="probe", command=[sys.executable, str(PROBE)], call_timeout_s=1,
                      env={"PROBE_LOG": str(tmp_path / "probe.log")})
    state = new_run("x", RunConfig(endpoint=Endpoint(model="m"), mcp=[probe]))

    async def go() -> str:
        async with Servers(state) as servers:
            tools = {t.name: t for t in await servers.open()}
            ctx = ToolContext(cancel=CancelToken(), workspace=Path("."), call_id="c1", run_id=state.run_id)
            began = time.monotonic()
            with pytest.raises(ToolError, match=r"no answer within 1 s \(the call was cancelled on the server\)"):
                await tools["probe__slow_write"].run(tools["probe__slow_write"].parse('{"seconds": 30}'), ctx)
            assert time.monotonic() - began < 5
            return await tools["probe__greet"].run(tools["probe__greet"].parse('{"name": "Ada"}'), ctx)

    assert asyncio.run(go()) == "Hello Ada"  # the same session goes on
    assert [e["event"] for e in _probe_log(tmp_path) if e["tool"] == "slow_write"] == ["start", "cancelled"]


def test_a_filesystem_server_on_runner_workspace_works_on_the_runs_own_copy(tmp_path: Path) -> None:
    runs = tmp_path / "runs"

    def write_there(messages: list[dict[str, Any]]) -> Step:
        folder = tool_messages({"messages": messages})[-1]["content"].splitlines()[-1].strip()
        return "fs__write_file", {"path": f"{folder}/summary.txt", "content": "three logs\n"}

    model = calls(("fs__list_allowed_directories", {}), write_there)
    with FakeProvider(model) as fake:
        proc = cli("run", "Summarise", "--base-url", fake.base_url, "--model", "fake", "--no-builtin-tools",
                   "--auto-approve", "*", "--sandbox", "copy", "--mcp", f"fs={FS} ${{RUNNER_WORKSPACE}}", "--json", runs_dir=runs)
    assert proc.returncode == 0, proc.stderr
    run_id = run_id_of(proc)
    assert (runs / run_id / "workspace" / "summary.txt").read_text() == "three logs\n"
    assert not (workspace_template() / "summary.txt").exists()
    started = next(e for e in trace(runs, run_id) if e["type"] == "mcp_server_started")
    assert started["target"] == f"{FS} '${{RUNNER_WORKSPACE}}'"  # as configured


def test_a_secret_a_failing_server_prints_is_never_recorded(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    secret = "tok-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:16]
    config = tmp_path / "leaky.json"
    config.write_text(json.dumps({"mcpServers": {"leaky": {
        "command": "sh", "args": ["-c", "echo \"login failed with $LEAKY_TOKEN\" >&2; exit 3"],
        "env": {"LEAKY_TOKEN": "${LEAKY_TOKEN}"}}}}))
    with FakeProvider(calls()) as fake:
        proc = cli("run", "Hi", "--base-url", fake.base_url, "--model", "fake", "--mcp-config", str(config), "--json",
                   runs_dir=runs, env={"LEAKY_TOKEN": secret})
    assert proc.returncode == 3, proc.stderr
    reason = json.loads(proc.stdout)["reason"]
    assert reason.startswith("MCP server 'leaky' did not start: ") and "login failed with ***" in reason
    for path in (runs / run_id_of(proc)).rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path


@pytest.mark.slow
def test_a_server_that_never_answers_or_clashes_stops_the_run_in_one_line(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "mute": {"command": "sleep", "args": ["120"], "start_timeout_s": 1},
        "fs": {"command": str(FS), "args": [str(tmp_path)], "prefix": ""}}}))
    with FakeProvider(calls()) as fake:
        args = ("run", "Hi", "--base-url", fake.base_url, "--model", "fake", "--json")
        began = time.monotonic()
        mute = cli(*args, "--mcp-config", str(config), "--mcp-tools", "fs:nothing", runs_dir=runs)
        assert mute.returncode == 3 and time.monotonic() - began < 30
        assert json.loads(mute.stdout)["reason"] == ("MCP server 'mute' did not start: no tool list within 1 s "
                                                     "(start_timeout_s)")
        assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p) == "sleep\0120\0"]
        config.write_text(json.dumps({"mcpServers": {"fs": {"command": str(FS), "args": [str(tmp_path)],
                                                            "prefix": ""}}}))
        clash = cli(*args, "--mcp-config", str(config), runs_dir=runs)  # its read_file beside runner's own
        assert clash.returncode == 3 and json.loads(clash.stdout)["reason"] == (
            "MCP server 'fs' did not start: it offers edit_file, a name another tool of the run has; give it a "
            "prefix of its own (prefix) or leave one out")
    assert fake.requests == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_text()
    except OSError:
        return ""


def test_the_readme_example_answers_with_the_time_the_tool_gave_under_the_local_models_steering(
        tmp_path: Path) -> None:
    """`runner run "What time is it in Tokyo?" --mcp time=...` with the folder tools and every
    steering policy the 1.5B gets, the model replying as the 1.5B did: the right call, then the
    time in words (18:05 as "6:05 PM"). The reviews that weigh an answer against files read do
    not apply to an answer from another tool: it is taken, as the tool gave it."""
    from runner import models
    from runner.steering import active_for_entry

    entry = models.entry_for("qwen2.5-coder-1.5b-instruct")
    assert entry is not None
    policies = [p for p in active_for_entry(entry) if p != "untagged_calls"]

    def model(body: dict[str, Any]) -> Answer:
        messages = body["messages"]
        result = next((m["content"] for m in reversed(messages) if m["role"] == "tool"), None)
        if result is None:
            return completion({"role": "assistant", "content": None, "tool_calls": [
                tool_call("c1", "time__get_current_time", json.dumps({"timezone": "Asia/Tokyo"}))]})
        hour, minute = json.loads(result)["datetime"][11:16].split(":")
        twelve = f"{int(hour) % 12 or 12}:{minute} {'PM' if int(hour) >= 12 else 'AM'}"
        return completion({"role": "assistant", "content": f"The current time in Tokyo is {twelve}."})

    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.md").write_text("Standup at 09:30.\n")
    with FakeProvider(model) as fake:
        proc = cli("run", "What time is it in Tokyo?", "--base-url", fake.base_url, "--model", "fake",
                   "--workspace", str(folder), "--mcp", f"time={TIME}",
                   *(f"--policy={p}" for p in policies), "--json", runs_dir=tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)
    assert done["status"] == "completed" and done["answer"].startswith("The current time in Tokyo is ")
    assert done["answer_unsupported"] is None
    harness = [m for body in fake.requests for m in body["messages"] if m.get("name") == "runner"]
    assert not harness  # no review, no "not in the files"


@pytest.mark.slow
def test_a_run_killed_mid_mcp_call_resumes_on_the_question_it_was_asked(tmp_path: Path) -> None:
    """Killed while an MCP call is in flight, under the 1.5B's steering, then resumed: every
    request after the resume still carries the question as the user's message, and the answer
    is to that question (a model that answers what its messages ask)."""
    from runner import models
    from runner.steering import active_for_entry

    entry = models.entry_for("qwen2.5-coder-1.5b-instruct")
    assert entry is not None
    policies = [f"--policy={p}" for p in active_for_entry(entry) if p != "untagged_calls"]
    step = calls(LONG)

    def model(body: dict[str, Any]) -> Answer:
        asked = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if any(m["role"] == "tool" for m in body["messages"]) or body.get("tool_choice") == "none":
            return completion({"role": "assistant", "content": f"The long operation finished ({asked[:24]})."})
        return step(body)

    runs = tmp_path / "runs"
    with FakeProvider(model) as fake:
        proc = spawn("run", "Run the long operation", "--base-url", fake.base_url, "--model", "fake",
                     "--no-builtin-tools", "--mcp", f"everything={EVERYTHING}", *policies, runs=runs)
        try:
            wait_for(lambda: events_of(runs, "tool_start"))
            time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        run_id = events_of(runs, "run_started")[0]["runId"]
        before = len(fake.requests)
        resumed = cli("resume", run_id, "--json", runs_dir=runs)
    assert resumed.returncode == 0, resumed.stderr
    done = json.loads(resumed.stdout)
    assert done["status"] == "completed" and done["answer"] == "The long operation finished (Run the long operation)."
    after = fake.requests[before:]
    assert after and all(next(m for m in r["messages"] if m["role"] == "user")["content"] == "Run the long operation"
                         for r in after)
