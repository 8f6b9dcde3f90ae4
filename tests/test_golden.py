"""Golden trace of the `plan` run: the event sequence and every field except times.

Regenerate after an intended change with:  RUNNER_REGEN_GOLDEN=1 python -m pytest tests/test_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from runner import store
from tests.conftest import drive, scripted_run

GOLDEN = Path(__file__).parent / "golden" / "plan_trace.jsonl"
VOLATILE = {"runId", "ts", "ms", "endpoint"}


def _stable(line: str) -> dict:  # type: ignore[type-arg]
    return {k: v for k, v in json.loads(line).items() if k not in VOLATILE}


def test_plan_trace_matches_golden(provider: str, runs: Path) -> None:
    state = drive(scripted_run("plan"), provider, runs)
    events = [_stable(line) for line in store.trace_path(runs, state.run_id).read_text().splitlines()]
    if os.environ.get("RUNNER_REGEN_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert events == [json.loads(line) for line in GOLDEN.read_text().splitlines()]
