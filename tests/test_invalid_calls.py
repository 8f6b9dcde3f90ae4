"""Calls that cannot run count toward the repeat rules, and call ids the provider leaves out
are derived from the run, so two identical runs send identical histories.

Providers are real HTTP servers on loopback: the scripted provider (its `unknown_tool` and
`bad_arguments` scenarios), or `tests.fakeprovider` for ids no scripted reply leaves out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from runner.state import RunState
from runner.store import FileStore
from tests.conftest import cli_json, drive, scripted_run
from tests.fakeprovider import Answer, FakeProvider, completion, scripted, stream, tool_call


@pytest.mark.parametrize("scenario, named", [
    ("unknown_tool", "the unknown tool 'readFile' 2 times in a row"),
    ("bad_arguments", "read_file was called with the same invalid arguments 2 times in a row"),
])
def test_a_model_stuck_on_an_invalid_call_fails_naming_it(runs: Path, scenario: str, named: str) -> None:
    code, out = cli_json("run", "--scenario", scenario, runs_dir=runs)
    assert code == 1 and out["status"] == "failed" and out["turns"] == 2 and out["tool_runs"] == 0
    assert out["error"]["type"] == "repeated_failure" and named in out["reason"]
    if scenario == "unknown_tool":
        assert "readFile" in out["error"]["message"] and "available tools: list_files" in out["error"]["message"]


def test_the_repeated_call_bound_counts_invalid_calls_too(provider: str) -> None:
    state = drive(scripted_run("unknown_tool", max_identical_failures=0), provider, None)
    assert state.status == "failed" and state.turns == 3 and "3 times in a row" in (state.reason or "")
    state = drive(scripted_run("unknown_tool", max_identical_failures=0, max_identical_calls=0, max_turns=5),
                  provider, None)
    assert state.status == "max_turns_exceeded" and state.turns == 5  # both bounds off: only the cap


def test_an_unknown_tool_with_new_arguments_each_turn_still_stops(provider: str) -> None:
    with FakeProvider(lambda body: completion({"role": "assistant", "content": None, "tool_calls": [
            tool_call(f"c{len(body['messages'])}", "readFile", json.dumps({"path": f"f{len(body['messages'])}"}))]})
    ) as fake:
        state = drive(scripted_run("fake", base_url=fake.base_url), fake.base_url, None)
    assert state.status == "failed" and state.turns == 2 and "'readFile'" in (state.reason or "")


def test_different_invalid_calls_do_not_trip_the_rule(provider: str) -> None:
    state = drive(scripted_run("quirks"), provider, None)  # three kinds of invalid call in one turn
    assert state.status == "completed"


# Deterministic call ids ------------------------------------------------------------------


def _no_ids(scenario: str) -> Any:
    """The scripted scenario's replies with every call id blanked (as sloppy servers send)."""
    inner = scripted(scenario)

    def handler(body: dict[str, Any]) -> Answer:
        answer = inner(body)
        for call in answer.body["choices"][0]["message"].get("tool_calls") or []:
            call["id"] = ""
        return answer

    return handler


@pytest.fixture
def blank_ids() -> Iterator[FakeProvider]:
    with FakeProvider(_no_ids("plan")) as server:
        yield server


def _ids(state: RunState) -> list[str]:
    return [c.id for m in state.messages for c in m.tool_calls or []]


def test_missing_call_ids_are_derived_from_the_run_and_turn(blank_ids: FakeProvider, runs: Path) -> None:
    first = scripted_run("plan", base_url=blank_ids.base_url)
    twin = first.model_copy(deep=True)
    first = drive(first, blank_ids.base_url, None)
    sent_first = [r["messages"] for r in blank_ids.requests]
    blank_ids.requests.clear()
    twin = drive(twin, blank_ids.base_url, runs)  # the same run id, saved this time
    assert first.status == twin.status == "completed"
    assert _ids(first) == _ids(twin) and len(_ids(first)) == 2 and all(i.startswith("call_") for i in _ids(first))
    assert [i.rsplit("_", 2)[1:] for i in _ids(first)] == [["1", "0"], ["2", "0"]]  # turn, index
    assert [r["messages"] for r in blank_ids.requests] == sent_first  # byte for byte the same histories
    other = drive(scripted_run("plan", base_url=blank_ids.base_url), blank_ids.base_url, None)
    assert not set(_ids(other)) & set(_ids(first))  # another run, other ids


def test_derived_ids_are_stable_across_resume(blank_ids: FakeProvider, runs: Path) -> None:
    whole = scripted_run("plan", base_url=blank_ids.base_url)
    cut = whole.model_copy(deep=True)
    cut.config.limits.max_turns = 1
    whole = drive(whole, blank_ids.base_url, None)
    cut = drive(cut, blank_ids.base_url, runs)
    assert cut.status == "max_turns_exceeded"
    code, out = cli_json("resume", cut.run_id, "--max-turns", "5", runs_dir=runs)
    assert code == 0 and out["status"] == "completed" and out["answer"] == whole.answer
    assert _ids(FileStore(runs).load(cut.run_id)) == _ids(whole)


def test_duplicate_and_empty_ids_in_one_reply_get_indexed_ids(provider: str) -> None:
    a = scripted_run("quirks")
    b = a.model_copy(deep=True)
    a, b = drive(a, provider, None), drive(b, provider, None)
    assert _ids(a) == _ids(b)
    first_turn = a.messages[1].tool_calls or []
    assert first_turn[1].id == "dup" and first_turn[0].id.endswith("_1_0") and first_turn[2].id.endswith("_1_2")


def test_a_streamed_reply_without_ids_gets_the_same_ids(blank_ids: FakeProvider) -> None:
    plain = scripted_run("plan", base_url=blank_ids.base_url)
    streamed = plain.model_copy(deep=True)
    plain = drive(plain, blank_ids.base_url, None)
    inner = _no_ids("plan")
    blank_ids.handler = lambda body: Answer(events=stream(inner(body).body["choices"][0]["message"]))
    streamed = drive(streamed, blank_ids.base_url, None, on_turn=lambda progress: None)
    assert streamed.status == "completed" and _ids(streamed) == _ids(plain)
