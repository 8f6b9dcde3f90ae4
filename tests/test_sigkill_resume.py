"""Durable runs: SIGKILL after each kind of transition, resume in another process, on both
run stores (the FileStore and PostgreSQL).

Each case runs the real CLI in a child process against the in-process scripted provider
(which counts the requests it answers), kills it with RUNNER_CRASH_AT, checks the run is
readable, resumes it with the CLI in the test's own process, and compares with an
uninterrupted run.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pytest

from runner import loop, store
from runner.endpoints import Endpoint
from runner.harness import workspace_template
from runner.scripted import ScriptedServer
from runner.state import FunctionCall, Message, RunConfig, RunState, ToolCall, new_run
from runner.tools import Tool, ToolContext, deleted_files
from tests.conftest import Backend, cli_json, cli_process, drive, scripted_run


def _only_run(b: Backend) -> str:
    infos = b.store.list_runs()
    assert len(infos) == 1
    return infos[0].state.run_id


def _transcript(state: RunState) -> list[dict[str, Any]]:
    return [m.model_dump() for m in state.messages]


def _kill_and_resume(scenario: str, crash: str, b: Backend, base_url: str, *extra: str) -> str:
    from runner.scripted import PROMPTS

    killed = cli_process("run", PROMPTS[scenario], "--base-url", base_url, "--model", f"scripted/{scenario}",
                         "--json", *extra, runs_dir=b.runs, env={**b.env, "RUNNER_CRASH_AT": crash})
    assert killed.returncode == -9, f"expected SIGKILL at {crash}: {killed.stdout} {killed.stderr}"
    run_id = _only_run(b)
    b.store.load(run_id)  # readable after the kill, whatever the point
    assert b.store.info(run_id).shown_status in ("died", "interrupted", "running", "completed")
    if b.kind == "files":
        assert not any(p.name.endswith(".tmp") and p.stat().st_size == 0 for p in (b.runs / run_id).iterdir())
    code, out = cli_json("resume", run_id, runs_dir=b.runs, env=b.env)
    assert code == 0, out
    return run_id


# (crash point, turns legitimately asked twice, calls legitimately started twice). Saves of the
# plan run: 1 initial, 2 reply 1, 3 result c1, 4 reply 2, 5 result c2, 6 reply 3, 7 the stop.
# Only what was never recorded is redone: a reply torn mid-save, a read-only call whose
# result was not saved.
CASES = [
    ("reply:1", {}, {}), ("reply:3", {}, {}),
    ("tool_start:1", {}, {}), ("tool_start:2", {}, {}),
    ("tool_done:1", {}, {"c1": 2}),
    ("tool_result:1", {}, {}), ("tool_result:2", {}, {}),
    ("save:2", {1: 2}, {}), ("save:3", {}, {"c1": 2}), ("save:7", {}, {}),
]


@pytest.mark.parametrize("crash, asked_twice, started_twice", CASES)
def test_kill_anywhere_then_resume_equals_an_uninterrupted_run(
    crash: str, asked_twice: dict[int, int], started_twice: dict[str, int], tmp_path: Path,
    provider_server: ScriptedServer, backend: Backend,
) -> None:
    base_url = provider_server.base_url
    ref = drive(scripted_run("plan", base_url=base_url), base_url, tmp_path / "ref")
    before = len(provider_server.requests)
    run_id = _kill_and_resume("plan", crash, backend, base_url)
    state = backend.store.load(run_id)
    assert state.status == "completed" and state.answer == ref.answer
    assert _transcript(state) == _transcript(ref)
    assert state.cost_usd == pytest.approx(ref.cost_usd) and state.turns == ref.turns == 3
    assert [t.prompt_tokens for t in state.per_turn] == [t.prompt_tokens for t in ref.per_turn]
    # the model is never asked again for a turn whose reply was recorded
    asked = Counter(turn for scenario, turn in provider_server.requests[before:])
    assert asked == {1: 1, 2: 1, 3: 1, **asked_twice}
    # no tool call whose result was recorded runs again
    events = [e.model_dump() for e in backend.store.read_trace(run_id)]
    starts = Counter(e["callId"] for e in events if e["type"] == "tool_start")
    assert starts == {"c1": 1, "c2": 1, **started_twice}
    assert [r.call_id for r in state.tool_runs] == ["c1", "c2"]
    assert [e["type"] for e in events].count("run_resumed") == 1
    # every recorded turn is in the trace exactly once: state and events were committed together
    assert [e["turn"] for e in events if e["type"] == "turn"] == [1, 2, 3]


@pytest.mark.parametrize("crash", ["tool_start:2", "tool_done:2"])
def test_a_write_in_doubt_happens_exactly_once(crash: str, backend: Backend, provider: str) -> None:
    """delete_file honours its idempotency key, so the in-doubt call is re-run safely."""
    run_id = _kill_and_resume("destructive", crash, backend, provider, "--auto-approve", "delete_file")
    state = backend.store.load(run_id)
    assert state.status == "completed" and state.answer == "Deleted access.log to free space."
    assert deleted_files(backend.store.workspace(run_id, workspace_template())) == ["access.log"]
    assert state.started == {} and state.tool_run_count == 2


class Charge(Tool):
    """A write tool with no idempotency key: charging a card twice is the failure to avoid."""

    name = "list_files"  # answers the scripted `plan` scenario's first call
    description = "Charge a card."
    read_only = False
    calls: ClassVar[list[str]] = []

    async def run(self, args, ctx: ToolContext) -> str:  # type: ignore[no-untyped-def]
        Charge.calls.append(ctx.call_id)
        return "charged"


def test_a_write_in_doubt_without_a_key_stops_for_approval(provider: str, tmp_path: Path) -> None:
    from runner.client import ChatClient
    from runner.tools import ReadFile

    state = new_run("go", RunConfig(endpoint=Endpoint(model="scripted/plan")))
    # as left by a process killed while the write was running
    state.messages.append(Message(role="assistant", tool_calls=[
        ToolCall(id="c1", function=FunctionCall(name="list_files", arguments="{}"))]))
    state.turns = 1
    state.started["c1"] = "list_files:x"

    async def go() -> None:
        async with ChatClient(provider) as client:
            rt = loop.Runtime(client=client, tools=[Charge(), ReadFile()], workspace=tmp_path)
            await loop.run(state, rt)
            assert state.status == "interrupted" and state.interruption is not None
            assert state.interruption.type == "approval" and state.interruption.in_doubt
            assert Charge.calls == []
            await loop.run(state, rt)  # a plain resume does not run it either
            assert state.status == "interrupted" and Charge.calls == []
            loop.approve(state, "c1")
            await loop.run(state, rt)

    asyncio.run(go())
    assert Charge.calls == ["c1"] and state.status == "completed"


def test_state_round_trips_and_old_fixture_loads(tmp_path: Path, provider: str) -> None:
    state = drive(scripted_run("plan"), provider, tmp_path)
    again = store.load(tmp_path, state.run_id)
    assert again == state
    fixture = Path(__file__).parent / "fixtures" / "state_v1.json"
    old = type(state).model_validate_json(fixture.read_text())
    assert old.format_version == 1 and old.status == "completed" and old.turns == 3
