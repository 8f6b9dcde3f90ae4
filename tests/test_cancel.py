"""Cancellation that reaches the tools, progress, provider faults, sub-agents."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from pydantic import BaseModel

from runner import store
from runner.cancel import CancelToken
from runner.scripted import ScriptedServer, ScriptedSettings, parse_faults
from runner.state import DEFAULT_TOOLS
from runner.tools import ScanArchive, ToolContext
from runner.trace import read_trace
from tests.conftest import cli, cli_json, drive, scripted_run


class DeafScanArchive(ScanArchive):
    """scan_archive as a tool that never checks the Stop signal behaves: it gets a token of
    its own, so Stop reaches only the HTTP layer."""

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> str:
        return super().run_sync(args, dataclasses.replace(ctx, cancel=CancelToken()))


def _slow_run(provider: str, runs: Path, stop_at_report: int | None, tools_hear_stop: bool = True):  # type: ignore[no-untyped-def]
    """The `slow` scenario: scan_archive makes five progress reports over about 3 s. With
    `stop_at_report`, Stop is pressed as that report arrives: mid-scan, whatever the load."""
    token = CancelToken()
    progress: list[tuple[float, str]] = []

    def on_progress(tool: str, label: str) -> None:
        progress.append((time.perf_counter(), label))
        if len(progress) == stop_at_report:
            token.cancel("user pressed Stop")

    began = time.perf_counter()
    tools = None if tools_hear_stop else [*(t for t in DEFAULT_TOOLS if t != "scan_archive"), DeafScanArchive()]
    state = drive(scripted_run("slow"), provider, runs, cancel=token, tools=tools, on_progress=on_progress)
    ended = time.perf_counter()
    return state, token, progress, began, ended


def test_slow_without_cancel_reports_progress_every_half_second(provider: str, runs: Path) -> None:
    state, _, progress, began, ended = _slow_run(provider, runs, None)
    assert state.status == "completed" and "errors.log: 4 errors, 2 warnings, 2 timeouts" in state.answer
    assert [label for _, label in progress] == [f"scanned {n} of 3 files" for n in (0, 1, 1, 2, 2)]
    assert began < progress[0][0] and all(a < b for (a, _), (b, _) in itertools.pairwise(progress))
    assert progress[-1][0] < ended
    # in the trace, every progress report sits between the tool's start and its result
    events = read_trace(store.trace_path(runs, state.run_id))
    scan = [e.type for e in events if e.type in ("tool_start", "tool_progress", "tool_result")
            and e.toolName == "scan_archive"]
    assert scan == ["tool_start", *["tool_progress"] * 5, "tool_result"]
    assert [e.label for e in events if e.type == "tool_progress"] == [label for _, label in progress]


def test_cancel_reaches_the_running_tool_and_stops_the_scan(provider: str, runs: Path) -> None:
    """Order, not milliseconds (the stop latency is measured by `runner experiments cancel`):
    after Stop the tool reports nothing more and the run stops before the scan could end."""
    state, token, progress, _began, ended = _slow_run(provider, runs, 2)
    assert state.status == "interrupted"
    assert state.interruption is not None and state.interruption.type == "cancelled"
    assert state.interruption.reason == "user pressed Stop" and "user pressed Stop" in (state.reason or "")
    assert token.cancelled_at is not None and token.cancelled_at < ended
    assert all(t < token.cancelled_at for t, _ in progress)  # the scan really stopped
    assert [label for _, label in progress] == ["scanned 0 of 3 files", "scanned 1 of 3 files"]
    stop = read_trace(store.trace_path(runs, state.run_id))[-1]
    assert stop.type == "run_stopped" and stop.status == "interrupted"


def test_cancel_wired_only_to_http_waits_for_the_tool(provider: str, runs: Path) -> None:
    """The contrast: with the signal kept from the tools, Stop waits out the whole scan."""
    state, token, progress, _began, _ended = _slow_run(provider, runs, 2, tools_hear_stop=False)
    assert token.cancelled_at is not None
    assert len(progress) == 5  # the scan ran to the end after Stop was pressed
    assert any(t > token.cancelled_at for t, _ in progress)
    assert state.status == "interrupted"  # caught only at the next stop-rule check


def test_ctrl_c_is_the_stop_button_and_the_run_resumes(runs: Path) -> None:
    env = {**os.environ, "RUNNER_RUNS_DIR": str(runs)}
    proc = subprocess.Popen([sys.executable, "-m", "runner", "run", "--scenario", "slow", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    # wait until the scan is running (its first progress line lands in the trace)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        traces = list(runs.glob("*/trace.jsonl"))
        if traces and "tool_progress" in traces[0].read_text():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 3, err
    result = json.loads(out)
    assert result["status"] == "interrupted"
    assert result["interruption"] == {"type": "cancelled", "reason": "stopped by Ctrl-C (SIGINT)"}
    code, done = cli_json("resume", result["run_id"], runs_dir=runs)
    assert code == 0 and done["status"] == "completed" and done["turns"] == 2


def test_progress_goes_to_stderr_and_json_stays_clean(runs: Path) -> None:
    # the --json run in a child process alongside the other (each scan takes about 3 s)
    as_json = subprocess.Popen([sys.executable, "-m", "runner", "run", "--scenario", "slow", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "RUNNER_RUNS_DIR": str(runs)})
    proc = cli("run", "--scenario", "slow", runs_dir=runs)
    assert proc.returncode == 0
    assert "progress: scan_archive: scanned 1 of 3 files" in proc.stderr
    out, err = as_json.communicate(timeout=60)
    assert json.loads(out)["status"] == "completed" and "progress" not in out, err


@pytest.fixture
def faulty() -> Iterator[ScriptedServer]:
    """A fresh provider per test: it remembers which requests it has already faulted."""
    servers: list[ScriptedServer] = []

    def start(spec: str, latency_ms: float = 0, slow_s: float = 5.0) -> ScriptedServer:
        server = ScriptedServer(ScriptedSettings(latency_ms=latency_ms, faults=parse_faults(spec), slow_fault_s=slow_s))
        servers.append(server.__enter__())
        return server

    yield start  # type: ignore[misc]
    for s in servers:
        s.__exit__(None, None, None)


@pytest.mark.parametrize("spec", ["429@2", "500@1", "truncated@2", "500@1,429@2,truncated@3"])
def test_transient_faults_are_retried_without_changing_answer_or_cost(
    spec: str, faulty: Any, provider: str, runs: Path
) -> None:
    clean = drive(scripted_run("plan"), provider, None)
    server = faulty(spec)
    began = time.perf_counter()
    state = drive(scripted_run("plan"), server.base_url, runs)
    assert state.status == "completed" and state.answer == clean.answer
    assert state.cost_usd == pytest.approx(clean.cost_usd) and state.prompt_tokens == clean.prompt_tokens
    turns = [e for e in read_trace(store.trace_path(runs, state.run_id)) if e.type == "turn"]
    faults = parse_faults(spec)
    for turn in turns:
        assert bool(turn.retries) == (turn.turn in faults)
    if faults.get(2) == "429":
        retry = (turns[1].retries or [])[0]
        assert retry["status"] == 429 and retry["waitMs"] == 1000  # Retry-After: 1 honoured
        assert time.perf_counter() - began >= 1.0


def test_a_slow_reply_times_out_and_is_retried(faulty, provider: str) -> None:  # type: ignore[no-untyped-def]
    server = faulty("slow@2", slow_s=3.0)
    state = drive(scripted_run("plan", timeout_s=1.0), server.base_url, None)
    assert state.status == "completed" and state.per_turn[1].retries == 1


def test_a_slow_reply_of_the_in_process_provider_times_out_too(runs: Path) -> None:
    """`--scenario` answers in this process (no socket): its replies still obey --timeout-s."""
    began = time.perf_counter()
    proc = cli("run", "--scenario", "plan", "--fault", "slow@1", "--timeout-s", "1", "--max-retries", "0", "--json",
               runs_dir=runs)
    code, out = proc.returncode, json.loads(proc.stdout)
    assert code == 1 and out["kept"] is False and out["status"] == "interrupted", out  # it never got a reply
    assert f"not kept: run {out['run_id']} never got a reply" in proc.stderr, proc.stderr  # said with --json too
    assert out["interruption"]["type"] == "provider_unavailable" and "timed out" in out["reason"], out
    assert time.perf_counter() - began < 4  # the slow reply takes 5 s


def test_401_fails_with_the_providers_message(runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "plan", "--fault", "401@2", runs_dir=runs)
    assert code == 1 and out["status"] == "failed" and out["turns"] == 1
    assert "401" in out["reason"] and "invalid API key" in out["reason"]


def test_retries_run_out_and_the_run_is_resumable(faulty) -> None:  # type: ignore[no-untyped-def]
    server = faulty("500@1")
    state = drive(scripted_run("plan", max_retries=0), server.base_url, None)
    assert state.status == "interrupted" and "HTTP 500" in (state.reason or "") and state.cost_usd == 0
    assert state.interruption is not None and state.interruption.type == "provider_unavailable"
    assert state.interruption.http_status == 500 and state.interruption.retries == 0


def test_research_child_with_tiny_budget_stops_and_parent_completes(runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "research", "--research-max-budget", "0.0001", runs_dir=runs)
    assert code == 0 and out["status"] == "completed"
    parent = store.load(runs, out["run_id"])
    child = store.load(runs, f"{parent.run_id}.c1")
    assert child.status == "budget_exceeded" and child.turns == 1 and child.parent_run_id == parent.run_id
    assert "budget_exceeded" in out["answer"]  # the parent read why its helper stopped
    assert child.cost_usd > 0 and parent.child_cost_usd == pytest.approx(child.cost_usd)
    assert parent.cost_usd == pytest.approx(sum(t.cost_usd for t in parent.per_turn) + child.cost_usd)
    # only the child's summary reached the parent's transcript, and the trace links the two
    assert len(parent.messages) == 4
    events = read_trace(store.trace_path(runs, parent.run_id))
    assert any(e.type == "tool_result" and e.childRunId == child.run_id for e in events)
    child_events = read_trace(store.trace_path(runs, child.run_id))
    assert child_events[0].type == "run_started" and child_events[0].parentRunId == parent.run_id


def test_research_completes_with_the_childs_summary(runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "research", runs_dir=runs)
    assert code == 0 and "errors.log" in out["answer"] and "worker 7" in out["answer"]
    child = store.load(runs, f"{out['run_id']}.c1")
    assert child.status == "completed" and child.turns == 3 and out["child_cost_usd"] == pytest.approx(child.cost_usd)


def test_one_cancel_stops_parent_and_child(faulty, runs: Path) -> None:  # type: ignore[no-untyped-def]
    server = faulty("", latency_ms=400)
    token = CancelToken()

    def stop_once_the_child_runs() -> None:  # its first reply is then 400 ms away
        deadline = time.monotonic() + 60
        while not any(runs.glob("*.c1/trace.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.01)
        token.cancel("user pressed Stop")

    threading.Thread(target=stop_once_the_child_runs, daemon=True).start()
    state = scripted_run("research", tools=[*DEFAULT_TOOLS, "research"],
                         research_model="scripted/research_child")
    state = drive(state, server.base_url, runs, cancel=token)
    ended = time.perf_counter()
    child = store.load(runs, f"{state.run_id}.c1")
    assert state.status == "interrupted" and child.status == "interrupted"
    assert child.interruption is not None and child.interruption.type == "cancelled"
    assert token.cancelled_at is not None and token.cancelled_at < ended


DEAF_TOOL = '''\
import time

from pydantic import BaseModel
from runner import Tool


class Deaf(Tool):
    name = "scan_archive"
    description = "Scan the log archive for anomalies. Slow: takes a few seconds."
    read_only = True

    class Params(BaseModel):
        pass

    def run_sync(self, args, ctx):
        time.sleep(2)  # never looks at ctx.cancel
        return "Scanned, deaf to Stop."
'''


def test_ctrl_c_twice_during_a_tool_that_does_not_stop_says_what_it_waits_for(runs: Path, tmp_path: Path) -> None:
    (tmp_path / "deaf.py").write_text(DEAF_TOOL)
    env = {**os.environ, "RUNNER_RUNS_DIR": str(runs)}
    proc = subprocess.Popen([sys.executable, "-m", "runner", "run", "--scenario", "slow", "--no-builtin-tools",
                             "--tool", f"{tmp_path / 'deaf.py'}:Deaf", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the tool runs
        traces = list(runs.glob("*/trace.jsonl"))
        if traces and "tool_start" in traces[0].read_text():
            break
        time.sleep(0.05)
    for _ in range(2):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    assert "stopping at the run's next step: a model request is cut off; a running tool is asked to stop" in err
    assert "still stopping: waiting for the running step to end" in err, err
    result = json.loads(out)
    assert result["status"] == "interrupted" and result["interruption"]["type"] == "cancelled"
    state = store.load(runs, result["run_id"])
    assert [m.content for m in state.messages if m.role == "tool"] == ["Scanned, deaf to Stop."]  # it ran to its end
