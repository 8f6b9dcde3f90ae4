"""OpenTelemetry export against a real receiver: Arize Phoenix (`phoenix serve`, the `phoenix`
extra, in the dev extra too) started by the test on free loopback ports, fed over OTLP/HTTP by
the real CLI, and read back through Phoenix's REST API (those tests are marked slow). The runs
are the scripted provider's, so their turns, tokens and tools are known."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import cli, cli_process, cli_process_json

STARTUP_S = 120.0
"""Phoenix's start-up took 12.6 s on this machine at load 4.7 (migrations of a new SQLite file)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = Path(sys.executable).with_name("phoenix")
    assert exe.exists(), "the OpenTelemetry tests need Phoenix: pip install 'runner[phoenix]' (in the dev extra)"
    work = tmp_path_factory.mktemp("phoenix")
    port = _free_port()
    env = {**os.environ, "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(_free_port()), "PHOENIX_HOST": "127.0.0.1",
           "PHOENIX_WORKING_DIR": str(work), "PHOENIX_TELEMETRY_ENABLED": "false"}
    with (work / "phoenix.log").open("w") as log:
        proc = subprocess.Popen([str(exe), "serve"], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            assert proc.poll() is None, (work / "phoenix.log").read_text()[-2000:]
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"Phoenix did not start in {STARTUP_S:.0f} s"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def attr(span: dict[str, Any], key: str) -> Any:
    """A span attribute from Phoenix's answer, whether it keeps keys flat or nested."""
    attributes = span.get("attributes") or {}
    if key in attributes:
        return attributes[key]
    node: Any = attributes
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def spans_of(phoenix: str, trace_id: str, want: int, *, settle_s: float = 0.0) -> list[dict[str, Any]]:
    """The spans Phoenix holds for one trace, once there are at least `want` (it ingests in
    the background); with `settle_s`, waits that long more and reads again (for duplicates)."""
    deadline = time.monotonic() + 30
    while True:
        got = httpx.get(f"{phoenix}/v1/projects/runner/spans", params={"trace_id": trace_id, "limit": 1000},
                        timeout=10)
        spans = got.json()["data"] if got.status_code == 200 else []
        if len(spans) >= want:
            if settle_s:
                time.sleep(settle_s)
                return spans_of(phoenix, trace_id, want)
            return list(spans)
        assert time.monotonic() < deadline, f"Phoenix holds {len(spans)} spans of trace {trace_id}, want {want}"
        time.sleep(0.3)


@pytest.mark.slow  # Phoenix takes 10-15 s to start
def test_a_scripted_run_exported_live_then_twice_is_one_trace(phoenix: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    code, run = cli_process_json("run", "--scenario", "plan", "--otlp-endpoint", phoenix, runs_dir=runs)
    assert code == 0
    code, exported = cli_process_json("export", run["run_id"], "--otlp-endpoint", phoenix, runs_dir=runs)
    assert code == 0
    trace_id = exported["traces"][run["run_id"]]
    assert exported["spans_sent"] == 6  # this process had not sent them; the receiver keeps one copy

    spans = spans_of(phoenix, trace_id, 6)
    assert len(spans) == 6
    root = next(s for s in spans if s["name"] == "invoke_agent runner")
    root_id = root["context"]["span_id"]
    assert root.get("parent_id") in (None, "")
    assert attr(root, "gen_ai.operation.name") == "invoke_agent" and attr(root, "gen_ai.agent.id") == run["run_id"]
    assert attr(root, "gen_ai.usage.input_tokens") == run["prompt_tokens"]
    assert attr(root, "gen_ai.usage.output_tokens") == run["completion_tokens"]
    assert attr(root, "runner.status") == "completed"
    chats = sorted((s for s in spans if s["name"] == "chat scripted/plan"), key=lambda s: attr(s, "runner.turn"))
    assert [attr(s, "gen_ai.usage.input_tokens") for s in chats] == run["per_turn_prompt_tokens"] == [233, 273, 472]
    assert sum(attr(s, "gen_ai.usage.output_tokens") for s in chats) == run["completion_tokens"]
    assert [attr(s, "gen_ai.response.finish_reasons") for s in chats] == [["tool_calls"], ["tool_calls"], ["stop"]]
    assert abs(sum(attr(s, "runner.cost_usd") for s in chats) - run["cost_usd"]) < 1e-9
    tools = sorted((s for s in spans if s["name"].startswith("execute_tool ")), key=lambda s: s["start_time"])
    assert [attr(s, "gen_ai.tool.name") for s in tools] == ["list_files", "read_file"]
    assert [attr(s, "gen_ai.tool.call.id") for s in tools] == ["c1", "c2"]
    assert all(s["parent_id"] == root_id for s in chats + tools)
    assert {s["context"]["trace_id"] for s in spans} == {trace_id}

    code, again = cli_process_json("export", run["run_id"], "--otlp-endpoint", phoenix, runs_dir=runs)
    assert code == 0 and again["traces"] == exported["traces"]
    assert len(spans_of(phoenix, trace_id, 6, settle_s=2.0)) == 6  # exported twice: still one trace of 6 spans


@pytest.mark.slow  # Phoenix takes 10-15 s to start
def test_child_runs_nest_under_the_research_call_and_a_resumed_run_is_one_trace(phoenix: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    code, parent = cli_process_json("run", "--scenario", "research", runs_dir=runs)
    assert code == 0
    code, sent = cli_process_json("export", parent["run_id"], "--otlp-endpoint", phoenix, runs_dir=runs)
    assert code == 0
    trace_id = sent["traces"][parent["run_id"]]
    spans = spans_of(phoenix, trace_id, sent["spans_sent"])
    agents = [s for s in spans if s["name"] == "invoke_agent runner"]
    assert len(agents) == 2
    top = next(s for s in agents if attr(s, "gen_ai.agent.id") == parent["run_id"])
    child = next(s for s in agents if s is not top)
    research = next(s for s in spans if attr(s, "gen_ai.tool.name") == "research")
    assert research["parent_id"] == top["context"]["span_id"]
    assert child["parent_id"] == research["context"]["span_id"]
    assert attr(child, "runner.parent_run_id") == parent["run_id"]

    code, waiting = cli_process_json("run", "--scenario", "destructive", runs_dir=runs)
    assert code == 3
    code, done = cli_process_json("resume", waiting["run_id"], "--approve", waiting["interruption"]["call_id"],
                          "--otlp-endpoint", phoenix, runs_dir=runs)
    assert code == 0 and done["status"] == "completed"
    trace = [json.loads(line) for line in cli_process("trace", waiting["run_id"], "--json", runs_dir=runs).stdout.splitlines()]
    turns = sum(1 for e in trace if e["type"] == "turn")
    tools = sum(1 for e in trace if e["type"] == "tool_result")
    code, sent = cli_process_json("export", waiting["run_id"], "--otlp-endpoint", phoenix, runs_dir=runs)
    spans = spans_of(phoenix, sent["traces"][waiting["run_id"]], 1 + turns + tools, settle_s=1.0)
    assert len(spans) == 1 + turns + tools  # both processes' turns, in one trace, each once
    root = next(s for s in spans if s["name"] == "invoke_agent runner")
    assert attr(root, "runner.status") == "completed"  # the live export held it back until the run ended
    assert [e["name"] for e in root.get("events") or []].count("runner.verdict") == 1


def test_no_endpoint_imports_nothing_of_opentelemetry(tmp_path: Path) -> None:
    probe = ("import sys, runner.cli as c\n"
             "try:\n    c.main(['run', '--scenario', 'plan', '--json'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith('opentelemetry') or m == 'runner.otel'))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={**env, "RUNNER_RUNS_DIR": str(tmp_path / "runs")})
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr


def test_export_needs_an_endpoint_and_a_known_run(tmp_path: Path) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": ""}
    proc = cli("export", "nope", runs_dir=tmp_path / "runs", env=env)
    assert proc.returncode == 2 and "--otlp-endpoint" in proc.stderr
    proc = cli("export", "nope", "--otlp-endpoint", "http://127.0.0.1:9", runs_dir=tmp_path / "runs", env=env)
    assert proc.returncode == 2 and "nope" in proc.stderr


@pytest.mark.slow  # Phoenix takes 10-15 s to start
def test_a_worker_and_a_suite_export_live(phoenix: str, tmp_path: Path) -> None:
    """`--otlp-endpoint` on `runner worker` (every run it drives) and on `runner suite`."""
    from runner.otel import trace_id_of

    runs = tmp_path / "runs"
    code, queued = cli_process_json("run", "--scenario", "plan", "--detach", runs_dir=runs)
    assert code == 0
    worker = cli_process("worker", "--idle-exit", "1", "--poll", "0.1", "--otlp-endpoint", phoenix, runs_dir=runs)
    assert worker.returncode == 0, worker.stderr
    spans = spans_of(phoenix, f"{trace_id_of(queued['run_id']):032x}", 6)
    root = next(s for s in spans if s["name"] == "invoke_agent runner")
    assert attr(root, "runner.status") == "completed" and len(spans) == 6

    code, report = cli_process_json("suite", "--provider", "scripted", "--otlp-endpoint", phoenix, runs_dir=runs)
    assert code == 0 and len(report["results"]) == 6
    for result in report["results"]:
        spans = spans_of(phoenix, f"{trace_id_of(result['run_id']):032x}", 1 + result["turns"] + result["tool_runs"])
        assert sum(1 for s in spans if s["name"].startswith("chat ")) == result["turns"]
        assert attr(next(s for s in spans if s["name"] == "invoke_agent runner"), "runner.status") == "completed"
