"""Tool errors as data, permanent errors, duplicate calls and approval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner import loop, store
from runner.harness import workspace_template
from runner.tools import deleted_files
from tests.conftest import cli, cli_json, drive, scripted_run


def test_recover_under_three_tool_error_policies(provider: str) -> None:
    text = drive(scripted_run("recover", tool_errors="text"), provider, None)
    generic = drive(scripted_run("recover", tool_errors="generic"), provider, None)
    fatal = drive(scripted_run("recover", tool_errors="fatal"), provider, None)
    assert text.status == "completed" and "errors.log" in text.answer and text.turns == 4
    assert generic.status == "completed" and "do not know" in generic.answer and generic.turns == 2
    assert fatal.status == "failed" and "timeout.log" in (fatal.reason or "") and fatal.turns == 1
    # the model read exactly what each policy wrote
    assert next(m.content for m in text.messages if m.role == "tool") == \
        "Error: no such file: timeout.log. The top folder holds: access.log, errors.log, notes.txt."
    assert next(m.content for m in generic.messages if m.role == "tool") == "Error: the tool failed."
    assert text.cost_usd > generic.cost_usd > fatal.cost_usd


def test_custom_error_formatter(provider: str) -> None:
    import asyncio
    import tempfile

    from runner.catalog import build
    from runner.client import ChatClient
    from runner.harness import workspace_template

    state = scripted_run("recover")

    async def go() -> None:
        async with ChatClient(provider) as client:
            rt = loop.Runtime(client=client, tools=build(state.config),
                              workspace=store.workspace_path(Path(tempfile.mkdtemp()), "w", workspace_template()),
                              tool_error_text=lambda e: f"TOOL FAILED <<{e}>>")
            await loop.run(state, rt)

    asyncio.run(go())
    assert next(m.content or "" for m in state.messages if m.role == "tool").startswith("TOOL FAILED <<no such file")


def test_denied_fails_fast_with_a_permanent_error(provider: str) -> None:
    state = drive(scripted_run("denied", max_turns=12), provider, None)
    assert state.status == "failed" and state.turns <= 3
    assert "permanent error" in (state.reason or "") and "permission denied" in (state.reason or "")


def test_denied_without_detection_burns_the_turn_cap(provider: str) -> None:
    state = drive(scripted_run("denied", max_turns=12, permanent_errors=False, max_identical_failures=0),
                  provider, None)
    assert state.status == "max_turns_exceeded" and state.turns == 12 and state.tool_run_count == 12


def test_same_failure_twice_in_a_row_is_permanent(provider: str) -> None:
    state = drive(scripted_run("denied", max_turns=12, permanent_errors=False), provider, None)
    assert state.status == "failed" and state.turns == 2
    assert "failed the same way 2 times in a row" in (state.reason or "")


def test_dedupe_saves_a_tool_run_not_a_turn(provider: str) -> None:
    plain = drive(scripted_run("repeat"), provider, None)
    deduped = drive(scripted_run("repeat", dedupe=True), provider, None)
    assert plain.answer == deduped.answer and plain.status == deduped.status == "completed"
    assert (plain.tool_run_count, deduped.tool_run_count) == (2, 1)
    assert plain.turns == deduped.turns == 3
    assert plain.cost_usd == pytest.approx(deduped.cost_usd)  # the model was paid for the repeat anyway
    assert [r.source for r in deduped.tool_runs] == ["run", "cache"]


def test_dedupe_never_swallows_a_write_unless_told_to(provider: str, runs: Path) -> None:
    safe = drive(scripted_run("double_delete", dedupe=True, auto_approve=True), provider, runs)
    naive = drive(scripted_run("double_delete", dedupe=True, dedupe_all=True, auto_approve=True), provider, runs)
    assert safe.tool_run_count == 2 and naive.tool_run_count == 1
    # the second deletion really ran (and found nothing left to delete)
    assert [r.ok for r in safe.tool_runs] == [True, False]
    assert deleted_files(runs / safe.run_id / "workspace") == ["access.log"]


def test_the_trace_shows_a_start_only_for_the_delete_that_ran(runs: Path) -> None:
    """Two identical deletes, the first approved: it starts and ends; the second, which could
    only fail, is answered at once and traced as skipped (refused), never as started."""
    code, out = cli_json("run", "--scenario", "double_delete", runs_dir=runs)
    assert code == 3 and out["interruption"]["call_id"] == "c1"
    code, out = cli_json("resume", out["run_id"], "--approve", "c1", runs_dir=runs)
    assert code == 0 and out["status"] == "completed" and out["tool_runs"] == 1
    events = [json.loads(line) for line in store.trace_path(runs, out["run_id"]).read_text().splitlines()]
    calls = [(e["type"], e["callId"]) + ((e["reason"],) if e["type"] == "tool_skipped" else ())
             for e in events if e["type"].startswith("tool_")]
    assert calls == [("tool_start", "c1"), ("tool_result", "c1"), ("tool_skipped", "c2", "refused"),
                     ("tool_result", "c2")]
    skipped = next(e for e in events if e["type"] == "tool_skipped")
    assert "no such file: access.log" in skipped["detail"] and skipped["args"] == '{"path": "access.log"}'
    assert deleted_files(runs / out["run_id"] / "workspace") == ["access.log"]


def test_every_answer_without_a_run_is_traced_as_skipped_with_why(runs: Path) -> None:
    """A cached read, a rejection and an invalid call each trace tool_skipped before their
    result, and no tool_start: the trace's starts count what ran."""
    _, cached = cli_json("run", "--scenario", "repeat", "--dedupe", runs_dir=runs)
    _, stopped = cli_json("run", "--scenario", "destructive", runs_dir=runs)
    _, rejected = cli_json("resume", stopped["run_id"], "--reject", "c2", "--reason", "keep it", runs_dir=runs)
    _, invalid = cli_json("run", "--scenario", "unknown_tool", runs_dir=runs)
    for out, reason in ((cached, "cached"), (rejected, "rejected"), (invalid, "invalid")):
        events = [json.loads(line) for line in store.trace_path(runs, out["run_id"]).read_text().splitlines()]
        started = {e["callId"] for e in events if e["type"] == "tool_start"}
        skipped = {e["callId"]: e["reason"] for e in events if e["type"] == "tool_skipped"}
        answered = [e["callId"] for e in events if e["type"] == "tool_result"]
        assert reason in skipped.values(), (reason, skipped)
        assert not started & set(skipped) and sorted(answered) == sorted([*started, *skipped])
        assert len(started) == out["tool_runs"]


def test_idempotency_key_reaches_the_write_tool(provider: str, runs: Path) -> None:
    state = drive(scripted_run("double_delete", auto_approve=True), provider, runs)
    ledger = (runs / state.run_id / "workspace" / ".deleted.jsonl").read_text().splitlines()
    assert [json.loads(line)["key"] for line in ledger] == [f"{state.run_id}/c1"]


def _stop_for_approval(runs: Path) -> dict[str, Any]:
    code, out = cli_json("run", "--scenario", "destructive", runs_dir=runs)
    assert code == 3 and isinstance(out, dict)
    return out


def _files(runs: Path, run_id: str) -> Path:
    """The folder the run's tools see: its own copy once a tool that may write ran, else the
    template (read-only tools read it until then)."""
    from runner.harness import workspace_template

    return store.FileStore(runs).existing_workspace(run_id) or workspace_template()


def test_destructive_stops_for_approval_with_nothing_deleted(runs: Path) -> None:
    out = _stop_for_approval(runs)
    assert out["status"] == "interrupted" and out["turns"] == 2
    preview = out["interruption"].pop("preview")
    assert out["interruption"] == {"type": "approval", "call_id": "c2", "tool_name": "delete_file",
                                   "args": {"path": "access.log"}, "in_doubt": False}
    assert (preview["action"], preview["path"], preview["added_lines"]) == ("delete", "access.log", 0)
    assert preview["removed_lines"] == (workspace_template() / "access.log").read_text().count("\n") > 0
    assert not (runs / out["run_id"] / "workspace").exists()  # no tool that may write ran: no copy
    assert (_files(runs, out["run_id"]) / "access.log").exists()
    events = [json.loads(line) for line in store.trace_path(runs, out["run_id"]).read_text().splitlines()]
    assert events[-2]["type"] == "approval_required" and events[-2]["callId"] == "c2"
    assert events[-1]["reason"] == "delete_file needs approval"


def test_approve_runs_the_call_in_the_run_copy(runs: Path) -> None:
    out = _stop_for_approval(runs)
    code, done = cli_json("resume", out["run_id"], "--approve", "c2", runs_dir=runs)
    assert code == 0 and done["status"] == "completed" and done["turns"] == 3
    assert done["answer"] == "Deleted access.log to free space."
    assert not (runs / out["run_id"] / "workspace" / "access.log").exists()
    assert (Path(__file__).parents[1] / "tasks" / "workspace" / "access.log").exists()


def test_reject_with_a_reason_is_written_where_the_model_reads(runs: Path) -> None:
    out = _stop_for_approval(runs)
    code, done = cli_json("resume", out["run_id"], "--reject", "c2", "--reason", "keep it for the audit",
                          runs_dir=runs)
    assert code == 0 and done["answer"] == "I did not delete anything: you declined the deletion."
    assert (_files(runs, out["run_id"]) / "access.log").exists()
    state = store.load(runs, out["run_id"])
    results = [m.content for m in state.messages if m.role == "tool"]
    assert results[-1] == "The user declined this call: keep it for the audit"
    assert all(results)  # never an empty slot
    events = [json.loads(line) for line in store.trace_path(runs, out["run_id"]).read_text().splitlines()]
    assert any(e["type"] == "tool_result" and e.get("source") == "rejected" for e in events)


def test_empty_rejection_demo_false_report_is_caught_by_the_write_ledger(runs: Path) -> None:
    """With the rejection sent to the model as an empty result, the model reports the delete it
    never made (the lie the chapter warns about); the write ledger says nothing was written, so
    the run asks once more, with the declined call restated, and takes the true answer."""
    out = _stop_for_approval(runs)
    _, done = cli_json("resume", out["run_id"], "--reject", "c2", "--unsafe-empty-rejection", runs_dir=runs)
    state = store.load(runs, out["run_id"])
    lies = [m.content for m in state.messages if m.role == "assistant" and not m.tool_calls]
    assert lies[0] == "Deleted access.log to free space."
    assert done["answer"] == "I did not delete anything: you declined the deletion."
    assert [m.harness.kind for m in state.messages if m.harness] == ["last_attempt"]
    assert (_files(runs, out["run_id"]) / "access.log").exists()


def test_approval_is_bound_to_call_id_and_arguments(runs: Path) -> None:
    out = _stop_for_approval(runs)
    state = store.load(runs, out["run_id"])
    loop.approve(state, "c2")
    # the same call id with a changed argument is a new call: the approval does not carry over
    state.messages[-1].tool_calls[0].function.arguments = '{"path": "errors.log"}'  # type: ignore[index]
    store.save(state, runs)
    code, again = cli_json("resume", out["run_id"], runs_dir=runs)
    assert code == 3 and again["interruption"]["args"] == {"path": "errors.log"}
    assert (_files(runs, out["run_id"]) / "errors.log").exists()


def test_verdict_on_an_unknown_call_id_is_a_usage_error(runs: Path) -> None:
    out = _stop_for_approval(runs)
    proc = cli("resume", out["run_id"], "--approve", "c9", runs_dir=runs)
    assert proc.returncode == 2 and "not a pending tool call" in proc.stderr and "c2" in proc.stderr


def test_a_second_verdict_on_a_call_says_what_was_decided(runs: Path) -> None:
    """Approved (queued for a worker, not yet run): approving or rejecting it again is refused,
    nothing new is recorded. Rejected: approving it is refused, saying it was rejected."""
    out = _stop_for_approval(runs)
    code, queued = cli_json("resume", out["run_id"], "--approve", "c2", "--detach", runs_dir=runs)
    assert code == 0 and queued["status"] == "queued"
    epoch = json.loads((runs / out["run_id"] / "lock").read_text())["epoch"]
    again = cli("resume", out["run_id"], "--approve", "c2", runs_dir=runs)
    assert again.returncode == 2 and "call c2 (delete_file) of run" in again.stderr, again.stderr
    assert "is approved already; a resume without a verdict carries it out" in again.stderr
    events = [json.loads(line) for line in store.trace_path(runs, out["run_id"]).read_text().splitlines()]
    assert [e["type"] for e in events].count("verdict") == 1
    assert json.loads((runs / out["run_id"] / "lock").read_text())["epoch"] == epoch  # refused before a claim
    late_no = cli("resume", out["run_id"], "--reject", "c2", "--reason", "changed my mind", runs_dir=runs)
    assert late_no.returncode == 2 and "is approved already" in late_no.stderr, late_no.stderr
    assert store.load(runs, out["run_id"]).approved  # the approval stands; a plain resume carries it out
    assert (_files(runs, out["run_id"]) / "access.log").exists()

    out = _stop_for_approval(runs)
    code, _ = cli_json("resume", out["run_id"], "--reject", "c2", "--reason", "no", "--detach", runs_dir=runs)
    assert code == 0
    late = cli("resume", out["run_id"], "--approve", "c2", runs_dir=runs)
    assert late.returncode == 2 and "call c2 (delete_file) of run" in late.stderr, late.stderr
    assert "was rejected already: there is no verdict to give on it (pending: none)" in late.stderr
    assert (_files(runs, out["run_id"]) / "access.log").exists()


def test_an_approval_recorded_by_a_resume_that_stopped_says_a_resume_carries_it_out(runs: Path) -> None:
    """A resume records the verdict, then stops before the loop runs (killed, Ctrl-C while
    llama.cpp starts): the run still says why it stopped, but offers no verdict to give."""
    from runner.harness import Reopening, reopen

    out = _stop_for_approval(runs)
    files = store.FileStore(runs)
    _, lease = reopen(files, out["run_id"], Reopening(approve="c2"))
    files.release(lease)  # the resume went no further
    shown = cli("show", out["run_id"], runs_dir=runs, env={"COLUMNS": "200"})
    assert 'approved: delete_file({"path": "access.log"})  call id c2; a resume carries it out' in shown.stdout
    assert "approve with:" not in shown.stdout and f"resume with: runner resume {out['run_id']}" in shown.stdout
    code, done = cli_json("resume", out["run_id"], runs_dir=runs)
    assert code == 0 and done["answer"] == "Deleted access.log to free space."
