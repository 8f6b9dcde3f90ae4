"""The harness core against the real scripted provider over loopback HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner import store
from runner.trace import read_trace
from tests.conftest import cli, cli_json, drive, one_error, scripted_run


def test_plan_completes_in_three_turns_with_growing_prompts(runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "plan", runs_dir=runs)
    assert code == 0
    assert out["status"] == "completed" and out["interruption"] is None
    assert out["turns"] == 3 and out["tool_runs"] == 2
    assert "errors.log" in out["answer"] and "timed out" in out["answer"]
    per_turn = out["per_turn_prompt_tokens"]
    assert len(per_turn) == 3 and per_turn == sorted(set(per_turn))
    assert out["prompt_tokens"] == sum(per_turn)
    assert out["cost_usd"] == pytest.approx((out["prompt_tokens"] * 2 + out["completion_tokens"] * 12) / 1e6)


def test_plan_human_summary(runs: Path) -> None:
    proc = cli("run", "--scenario", "plan", runs_dir=runs)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()[:2]
    assert first == "plan  status=completed  turns=3  tools=2"
    assert second.startswith("   tokens in=") and "cost=$" in second
    assert "per-turn prompt tokens:" in proc.stdout


def test_runaway_stops_at_turn_cap(runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "runaway", "--max-turns", "20", runs_dir=runs)
    assert code == 3
    assert out["status"] == "max_turns_exceeded"
    assert out["turns"] == 20 and out["interruption"] == {"type": "max_turns", "limit": 20, "used": 20}
    assert out["answer"] == ""


def test_turn_cap_cost_grows_quadratically(provider: str) -> None:
    costs, inputs = {}, {}
    for cap in (50, 100):
        state = drive(scripted_run("runaway", max_turns=cap), provider, None)
        assert state.turns == cap
        costs[cap], inputs[cap] = state.cost_usd, state.prompt_tokens
    assert 3.3 <= costs[100] / costs[50] <= 4.2
    assert 3.3 <= inputs[100] / inputs[50] <= 4.2


def test_budget_overshoots_by_at_most_one_turn(runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "runaway", "--max-budget", "0.01", runs_dir=runs)
    assert code == 3 and out["status"] == "budget_exceeded"
    assert out["interruption"]["type"] == "max_budget" and out["interruption"]["limit_usd"] == 0.01
    assert out["interruption"]["used_usd"] == pytest.approx(out["cost_usd"])
    state = store.load(runs, out["run_id"])
    assert state.cost_usd >= 0.01
    assert state.cost_usd - 0.01 <= state.per_turn[-1].cost_usd
    assert state.cost_usd - state.per_turn[-1].cost_usd < 0.01  # the last turn was bought under the cap


@pytest.mark.parametrize("budget", [0.005, 0.01, 0.05])
def test_cap_max_tokens_keeps_spend_under_the_budget(provider: str, budget: float) -> None:
    state = drive(scripted_run("runaway", max_turns=None, max_budget_usd=budget, cap_max_tokens=True), provider, None)
    assert state.status == "budget_exceeded" and state.cost_usd <= budget
    assert "would leave too little for a reply" in (state.reason or "")
    assert all(t.max_tokens is not None and t.completion_tokens <= t.max_tokens for t in state.per_turn)


@pytest.mark.parametrize("tokens", [1_500, 4_000])
def test_cap_max_tokens_keeps_a_runs_tokens_under_its_token_budget(provider: str, tokens: int) -> None:
    state = drive(scripted_run("runaway", max_turns=None, max_tokens_total=tokens, cap_max_tokens=True), provider, None)
    assert state.status == "budget_exceeded" and state.prompt_tokens + state.completion_tokens <= tokens
    assert "would leave too little for a reply" in (state.reason or "") and "-token budget" in (state.reason or "")
    assert all(t.max_tokens is not None and t.completion_tokens <= t.max_tokens for t in state.per_turn)
    loose = drive(scripted_run("runaway", max_turns=None, max_tokens_total=tokens), provider, None)
    assert loose.prompt_tokens + loose.completion_tokens >= tokens  # without the cap it passes the budget


def test_a_reply_cut_off_by_the_budget_cap_is_not_an_answer(provider: str) -> None:
    full = drive(scripted_run("plan"), provider, None)
    # Budgets around the full cost: the prompt estimate is deliberately high, so find one
    # that buys the final turn but not the whole 22-token answer.
    for extra_tokens in range(0, 400, 2):
        budget = full.cost_usd + extra_tokens * 12 / 1e6
        state = drive(scripted_run("plan", max_budget_usd=budget, cap_max_tokens=True), provider, None)
        if state.turns == 3:
            break
    assert state.status == "budget_exceeded" and state.cost_usd <= budget
    last = state.per_turn[-1]
    assert last.finish_reason == "length" and last.budget_capped and state.answer == ""
    assert last.max_tokens is not None and last.completion_tokens == last.max_tokens >= 16
    state.config.limits.max_budget_usd = 1.0  # resume with more money: the model is asked again
    state = drive(state, provider, None)
    assert state.status == "completed" and state.turns == 4 and state.reason == "the model answered"


def test_trace_has_run_id_on_every_line_and_a_final_stop(runs: Path) -> None:
    _code, out = cli_json("run", "--scenario", "plan", runs_dir=runs)
    path = store.trace_path(runs, out["run_id"])
    lines = path.read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert all(e["runId"] == out["run_id"] for e in events)
    types = [e["type"] for e in events]
    assert types == ["run_started", "turn", "tool_start", "tool_result", "turn", "tool_start",
                     "tool_result", "turn", "run_stopped"]
    turns = [e for e in events if e["type"] == "turn"]
    assert [t["turn"] for t in turns] == [1, 2, 3]
    assert all(t["totalTokens"] == t["promptTokens"] + t["completionTokens"] for t in turns)
    assert [t["costUsd"] for t in turns] == sorted(t["costUsd"] for t in turns)
    assert turns[-1]["costUsd"] == pytest.approx(out["cost_usd"])
    stop = events[-1]
    assert stop["status"] == "completed" and stop["reason"] and stop["turns"] == 3
    assert len(read_trace(path)) == len(events)


def test_trace_command_answers_why_and_cost(runs: Path) -> None:
    _code, out = cli_json("run", "--scenario", "runaway", "--max-turns", "4", runs_dir=runs)
    proc = cli("trace", out["run_id"], runs_dir=runs)
    assert proc.returncode == 0
    last = " ".join(proc.stdout.splitlines()[-2:])  # stopped: status, turns, cost; then the reason
    assert "max_turns_exceeded" in last and "turn cap of 4" in last and f"{out['cost_usd']:.6f}" in last
    proc = cli("trace", out["run_id"], "--json", runs_dir=runs)
    assert all(json.loads(line)["runId"] == out["run_id"] for line in proc.stdout.splitlines())


def test_runs_lists_saved_runs(runs: Path) -> None:
    _, a = cli_json("run", "--scenario", "plan", runs_dir=runs)
    _, b = cli_json("run", "--scenario", "runaway", "--max-turns", "2", runs_dir=runs)
    code, listed = cli_json("runs", runs_dir=runs)
    assert code == 0
    # newest first
    assert [(r["run_id"], r["status"]) for r in listed] == [(b["run_id"], "max_turns_exceeded"), (a["run_id"], "completed")]


def test_raising_the_cap_resumes_a_capped_run(runs: Path) -> None:
    _, out = cli_json("run", "--scenario", "plan", "--max-turns", "1", runs_dir=runs)
    assert out["status"] == "max_turns_exceeded" and out["turns"] == 1
    code, done = cli_json("resume", out["run_id"], "--max-turns", "10", runs_dir=runs)
    assert code == 0 and done["status"] == "completed" and done["turns"] == 3 and done["tool_runs"] == 2
    _, fresh = cli_json("run", "--scenario", "plan", runs_dir=runs)
    assert done["cost_usd"] == pytest.approx(fresh["cost_usd"])


def test_a_budget_stop_with_capped_replies_names_the_budget_that_pays_the_next_turn(runs: Path) -> None:
    """With --cap-max-tokens, a run stops when its next prompt would leave too little for a
    reply: the stop names the least budget that pays for one, a resume below it is refused
    (nothing changes), and one at it runs the next turn."""
    _, out = cli_json("run", "--scenario", "plan", "--max-budget", "0.002", "--cap-max-tokens", runs_dir=runs)
    it = out["interruption"]
    assert out["status"] == "budget_exceeded" and it["needs_usd"] > out["cost_usd"], out
    assert f"(a budget of ${it['needs_usd']:.6f} pays for one as long as" in out["reason"]
    shown = cli("show", out["run_id"], runs_dir=runs, env={"COLUMNS": "200"})
    assert f"resume with USD >= {it['needs_usd']:.6f} (0: no budget)" in shown.stdout, shown.stdout
    seq = store.load(runs, out["run_id"]).seq
    short = cli("resume", out["run_id"], "--max-budget", f"{(out['cost_usd'] + it['needs_usd']) / 2:.6f}", runs_dir=runs)
    assert short.returncode == 2 and f"its next turn needs a budget of ${it['needs_usd']:.6f}" in one_error(short.stderr)
    assert store.load(runs, out["run_id"]).seq == seq
    code, more = cli_json("resume", out["run_id"], "--max-budget", f"{it['needs_usd']:.6f}", runs_dir=runs)
    assert code == 0 and more["status"] == "completed" and more["cost_usd"] <= it["needs_usd"], more  # the answer fit


def test_a_token_budget_stop_with_capped_replies_names_the_budget_that_pays_the_next_turn(runs: Path) -> None:
    _, out = cli_json("run", "--scenario", "plan", "--max-tokens-total", "1000", "--cap-max-tokens", runs_dir=runs)
    it = out["interruption"]
    spent = out["prompt_tokens"] + out["completion_tokens"]
    assert out["status"] == "budget_exceeded" and out["turns"] == 2 and spent <= 1000 < it["needs_tokens"], out
    assert f"(a budget of {it['needs_tokens']:,} tokens pays for one as long as" in out["reason"]
    shown = cli("show", out["run_id"], runs_dir=runs, env={"COLUMNS": "200"})
    assert f"resume with N >= {it['needs_tokens']:,} (0: no cap)" in shown.stdout, shown.stdout
    short = cli("resume", out["run_id"], "--max-tokens-total", str(it["needs_tokens"] - 1), runs_dir=runs)
    assert short.returncode == 2 and f"needs a budget of {it['needs_tokens']:,}" in one_error(short.stderr)
    code, more = cli_json("resume", out["run_id"], "--max-tokens-total", "100000", runs_dir=runs)
    assert code == 0 and more["status"] == "completed", more


@pytest.mark.parametrize("args, message", [
    (["run"], "give a PROMPT"),
    (["run", "--scenario", "plan", "--model", "m"], "--model goes with --base-url"),
    (["run", "--scenario", "nope"], "unknown scenario"),
    (["run", "--scenario", "plan", "--tool-errors", "loud"], "--tool-errors"),
    (["run", "--scenario", "plan", "--fault", "418@1"], "bad fault"),
    (["resume", "no-such-run"], "no run"),
    (["trace", "no-such-run"], "no trace"),
    (["run", "hi", "--base-url", "notaurl", "--model", "m"], "must start with http"),
    (["resume", "x", "--approve", "c1", "--reason", "because"], "--reason goes with --reject"),
])
def test_usage_errors_exit_2_with_one_line(runs: Path, args: list[str], message: str) -> None:
    proc = cli(*args, runs_dir=runs)
    assert proc.returncode == 2
    assert message in one_error(proc.stderr) and "Traceback" not in proc.stderr


def test_resume_without_room_under_the_limit_that_stopped_it_is_a_usage_error(runs: Path) -> None:
    _, capped = cli_json("run", "--scenario", "plan", "--max-turns", "1", runs_dir=runs)
    proc = cli("resume", capped["run_id"], runs_dir=runs)
    assert proc.returncode == 2 and "give --max-turns larger than 1" in one_error(proc.stderr)
    _, broke = cli_json("run", "--scenario", "runaway", "--max-budget", "0.002", runs_dir=runs)
    proc = cli("resume", broke["run_id"], "--max-budget", "0.001", runs_dir=runs)
    assert proc.returncode == 2 and "give --max-budget larger than that" in one_error(proc.stderr)
    assert store.load(runs, broke["run_id"]).config.limits.max_budget_usd == 0.002  # nothing saved
    # nor under the other limit: a resume that lifts one cap and sets the other too low
    proc = cli("resume", capped["run_id"], "--max-turns", "0", "--max-budget", "0.0001", runs_dir=runs)
    assert proc.returncode == 2 and "give --max-budget larger than that (0: no budget)" in one_error(proc.stderr)
    turns = store.load(runs, broke["run_id"]).turns
    proc = cli("resume", broke["run_id"], "--max-budget", "0", "--max-turns", str(turns), runs_dir=runs)
    assert proc.returncode == 2 and f"give --max-turns larger than {turns} (0: no cap)" in one_error(proc.stderr)
    assert store.load(runs, capped["run_id"]).status == "max_turns_exceeded"
    assert store.load(runs, broke["run_id"]).status == "budget_exceeded"


def test_corrupt_state_file_is_a_clear_error(runs: Path) -> None:
    _, out = cli_json("run", "--scenario", "plan", "--max-turns", "1", runs_dir=runs)
    path = runs / out["run_id"] / "state.json"
    path.write_text('{"run_id": "x", "messages": [')
    (runs / out["run_id"] / "journal.jsonl").unlink()  # with it, the run is rebuilt (test_journal)
    proc = cli("resume", out["run_id"], runs_dir=runs)
    assert proc.returncode == 1 and "not a valid run state" in proc.stderr and "Traceback" not in proc.stderr
    assert path.read_text() == '{"run_id": "x", "messages": ['  # nothing overwritten
    listed = cli("runs", runs_dir=runs)
    assert listed.returncode == 0 and "skipped an unreadable run" in listed.stderr and out["run_id"] in listed.stderr


def test_unreachable_endpoint_is_resumable_with_message(runs: Path) -> None:
    code, out = cli_json("run", "hello", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                         "--max-retries", "0", "--keep", runs_dir=runs)
    assert code == 3 and out["status"] == "interrupted" and "cannot reach" in out["reason"]
    assert out["interruption"]["type"] == "provider_unavailable" and out["interruption"]["http_status"] is None


def test_suite_scripted_answers_all_six(runs: Path) -> None:
    code, out = cli_json("suite", "--provider", "scripted", runs_dir=runs)
    assert code == 0 and out["model"] is None
    results = out["results"]
    assert [r["task"] for r in results] == ["timeout_file", "count_files", "read_notes", "read_each",
                                           "largest_file", "rotate_logs"]
    assert all(r["correct"] and r["status"] == "completed" and r["wall_ms"] > 0 for r in results)
    assert list(runs.glob("suite-*.md")) and list(runs.glob("suite-*.json"))
