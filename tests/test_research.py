"""Child runs: the research tool's child is a run of its own, driven through `ctx.spawn`,
and its spend is counted on the parent exactly once, even across a kill inside the child."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner import store
from tests.conftest import cli_json, cli_process


@pytest.mark.parametrize("crash", ["reply:2", "reply:3", "tool_result:2"])
def test_kill_inside_the_child_then_resume_counts_its_cost_once(crash: str, tmp_path: Path) -> None:
    _, clean = cli_json("run", "--scenario", "research", runs_dir=tmp_path / "clean")
    assert clean["status"] == "completed" and clean["child_cost_usd"] > 0
    runs = tmp_path / "runs"
    killed = cli_process("run", "--scenario", "research", runs_dir=runs, env={"RUNNER_CRASH_AT": crash})
    assert killed.returncode == -9, killed.stderr
    parent = next(s for s in store.list_runs(runs) if s.parent_run_id is None)
    child = store.load(runs, f"{parent.run_id}.c1")
    assert child.turns >= 1 and child.status == "running"  # killed mid-child, some of it paid
    code, out = cli_json("resume", parent.run_id, runs_dir=runs)
    assert code == 0 and out["status"] == "completed" and out["answer"] == clean["answer"]
    assert out["cost_usd"] == pytest.approx(clean["cost_usd"])
    assert out["child_cost_usd"] == pytest.approx(clean["child_cost_usd"])
    resumed_child = store.load(runs, f"{parent.run_id}.c1")
    assert resumed_child.turns == 3 and resumed_child.status == "completed"  # resumed, not restarted
    final = store.load(runs, parent.run_id)
    assert final.child_costs == {resumed_child.run_id: pytest.approx(resumed_child.cost_usd)}
