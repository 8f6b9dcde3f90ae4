"""The OpenTelemetry spans of runs, built from what the store committed, with no receiver:
names, nesting, usage and ids that do not change from one export to the next. The runs are the
scripted provider's, so their turns, tokens and tools are known. tests/test_otel.py sends the
same spans to a real receiver (Arize Phoenix) and reads them back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner import otel
from runner.store import FileStore
from tests.conftest import cli_json


def _spans(store: FileStore, run_id: str) -> tuple[list[Any], list[str]]:
    """The spans of a run and its children (OpenTelemetry's `ReadableSpan`s), and the runs
    among them that have not stopped."""
    return otel.collect(store, [run_id], otel.resource_for())


def _by_name(spans: list[Any], name: str) -> list[Any]:
    return [s for s in spans if s.name == name]


def test_a_run_is_one_trace_of_its_turns_and_tools_under_the_agent_span(runs: Path) -> None:
    code, run = cli_json("run", "--scenario", "plan", runs_dir=runs)
    assert code == 0
    store = FileStore(runs)
    spans, unfinished = _spans(store, run["run_id"])
    assert unfinished == [] and len(spans) == 1 + run["turns"] + run["tool_runs"] == 6
    [root] = _by_name(spans, "invoke_agent runner")
    assert root.parent is None and root.attributes is not None
    assert root.attributes["gen_ai.agent.id"] == run["run_id"] and root.attributes["runner.status"] == "completed"
    assert root.attributes["gen_ai.usage.input_tokens"] == run["prompt_tokens"]
    chats = sorted(_by_name(spans, "chat scripted/plan"), key=lambda s: s.attributes["runner.turn"])
    assert [s.attributes["gen_ai.usage.input_tokens"] for s in chats] == run["per_turn_prompt_tokens"]
    assert [list(s.attributes["gen_ai.response.finish_reasons"]) for s in chats] == [["tool_calls"], ["tool_calls"],
                                                                                      ["stop"]]
    assert abs(sum(s.attributes["runner.cost_usd"] for s in chats) - run["cost_usd"]) < 1e-9
    tools = sorted((s for s in spans if s.name.startswith("execute_tool ")), key=lambda s: s.start_time)
    assert [(s.attributes["gen_ai.tool.name"], s.attributes["gen_ai.tool.call.id"]) for s in tools] == [
        ("list_files", "c1"), ("read_file", "c2")]
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in chats + tools)
    assert {s.context.trace_id for s in spans} == {otel.trace_id_of(run["run_id"])}
    again, _ = _spans(store, run["run_id"])
    assert [s.context.span_id for s in again] == [s.context.span_id for s in spans]  # exported twice: the same spans


def test_a_child_run_nests_under_the_research_call_and_a_verdict_is_an_event(runs: Path) -> None:
    code, parent = cli_json("run", "--scenario", "research", runs_dir=runs)
    assert code == 0
    store = FileStore(runs)
    spans, _ = _spans(store, parent["run_id"])
    agents = _by_name(spans, "invoke_agent runner")
    top = next(s for s in agents if s.attributes["gen_ai.agent.id"] == parent["run_id"])
    [child] = [s for s in agents if s is not top]
    [research] = [s for s in spans if s.name == "execute_tool research"]
    assert research.parent.span_id == top.context.span_id and child.parent.span_id == research.context.span_id
    assert child.attributes["runner.parent_run_id"] == parent["run_id"]
    assert {s.context.trace_id for s in spans} == {otel.trace_id_of(parent["run_id"])}

    code, waiting = cli_json("run", "--scenario", "destructive", runs_dir=runs)
    assert code == 3
    spans, _ = _spans(store, waiting["run_id"])
    [root] = _by_name(spans, "invoke_agent runner")
    assert root.attributes["runner.status"] == "interrupted"
    assert [e.name for e in root.events] == ["runner.approval_required"]
    code, done = cli_json("resume", waiting["run_id"], "--approve", waiting["interruption"]["call_id"], runs_dir=runs)
    assert code == 0
    spans, unfinished = _spans(store, waiting["run_id"])
    [root] = _by_name(spans, "invoke_agent runner")
    assert unfinished == [] and root.attributes["runner.status"] == "completed"  # its last stop
    assert [e.name for e in root.events] == ["runner.approval_required", "runner.verdict"]
    assert len(spans) == 1 + done["turns"] + done["tool_runs"]  # both processes' turns, each once


def test_a_call_answered_without_running_says_why_on_its_span(runs: Path) -> None:
    code, run = cli_json("run", "--scenario", "repeat", "--dedupe", runs_dir=runs)
    assert code == 0
    spans, _ = _spans(FileStore(runs), run["run_id"])
    tools = sorted(_by_name(spans, "execute_tool read_file"), key=lambda s: s.start_time)
    assert [s.attributes.get("runner.tool.skipped") for s in tools] == [None, "cached"]
