"""`runner suite --provider local --json` on the packaged SmolLM2 through the real llama.cpp
server: whatever the model answers, every task ends in one of the five statuses with its
turns, wall time and mean turn time recorded; with the manifest's first-turn
tool_choice (required for SmolLM2) every task makes a tool call and none is malformed, and the
report carries the prompt tokens evaluated vs reused per turn."""

from __future__ import annotations

from pathlib import Path

from runner import store
from runner.trace import RunStarted, read_trace
from tests.conftest import cli_process_json

FIVE = {"completed", "failed", "max_turns_exceeded", "budget_exceeded", "interrupted"}


def test_local_suite_json_on_the_packaged_model(runs: Path) -> None:
    code, out = cli_process_json("suite", "--provider", "local", "--model", "smollm2-135m-instruct", "--max-turns", "2",
                         "--max-tokens", "96",
                         runs_dir=runs, timeout=900)
    assert code == 0
    assert out["model"] == "SmolLM2-135M-Instruct.Q4_1"
    results = out["results"]
    assert [r["task"] for r in results] == ["timeout_file", "count_files", "read_notes", "read_each",
                                           "largest_file", "rotate_logs"]
    for r in results:
        assert r["provider"] == "local" and r["status"] in FIVE
        assert 1 <= r["turns"] <= 2 and r["wall_ms"] > 0 and r["mean_turn_ms"] > 0
        assert r["prompt_tokens"] > 0 and isinstance(r["correct"], bool)
    assert out["first_turn_tool_choice"] == "required"
    assert all(r["calls"] >= 1 and r["invalid_calls"] == 0 for r in results)
    turns = out["local_turns"]
    assert len(turns) == sum(r["turns"] for r in results)
    assert all(t["prompt_eval_tokens"] + t["cached_prompt_tokens"] == t["prompt_tokens"] for t in turns)
    # turn 1 evaluates at least its task (its shared prefix may come from the saved KV state)
    assert turns[0]["prompt_eval_tokens"] > 0 and all(t["cached_prompt_tokens"] > 0 for t in turns[1:])
    assert len(out["load_average"]) == 3
    markdown = next(runs.glob("suite-*.md")).read_text()
    assert "tool_choice=required" in markdown and "evaluated/reused" in markdown
    assert "0 malformed or unknown" in markdown
    started = read_trace(store.trace_path(runs, results[0]["run_id"]))[0]
    assert isinstance(started, RunStarted) and started.server is not None
    assert started.server["chat_format"] == "runner-hermes" and started.server["omp_wait_policy"] == "PASSIVE"
