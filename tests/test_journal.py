"""The FileStore journal under damage: every record carries a checksum; a torn tail is
dropped, a bad record in the middle makes the run `damaged` (listed, refused by resume) until
`runner repair` rebuilds it from the last good record and says what was dropped; journals
written before checksums still load; `runner trace` rebuilds from the journal when the trace
file is gone. The real CLI (in a child process where it is killed), the real scripted provider
over loopback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from runner.errors import CorruptState
from runner.harness import workspace_template
from runner.scripted import ScriptedServer, ScriptedSettings
from runner.state import RunConfig, new_run
from runner.store import FileStore
from runner.tools import deleted_files
from tests.conftest import cli, cli_json, cli_process, one_error


def _killed_after_two_replies(server: ScriptedServer, runs: Path) -> str:
    """A `plan` run SIGKILLed right after its second reply was committed: the journal holds
    the header and saves 1 (new run), 2 (reply 1), 3 (result 1), 4 (reply 2)."""
    killed = cli_process("run", "--scenario", "plan", "--base-url", server.base_url, runs_dir=runs,
                         env={"RUNNER_CRASH_AT": "reply:2"})
    assert killed.returncode == -9, killed.stderr
    (run_id,) = [p.name for p in runs.iterdir() if not p.name.startswith(".")]
    return run_id


def _flip_a_byte(journal: Path, line_no: int) -> None:
    lines = journal.read_bytes().split(b"\n")
    line = bytearray(lines[line_no - 1])
    line[len(line) // 2] ^= 0x01
    lines[line_no - 1] = bytes(line)
    journal.write_bytes(b"\n".join(lines))


def test_every_record_carries_a_checksum(provider: str, runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "plan", "--base-url", provider, runs_dir=runs)
    assert code == 0
    lines = (runs / out["run_id"] / "journal.jsonl").read_bytes().splitlines()
    assert len(lines) == 8  # the header and 7 saves
    assert all(re.fullmatch(rb"\{.*\}\t[0-9a-f]{8}", line) for line in lines), lines[0]


def test_a_flipped_byte_in_a_middle_record_is_listed_damaged_then_repaired(
    provider_server: ScriptedServer, runs: Path,
) -> None:
    run_id = _killed_after_two_replies(provider_server, runs)
    journal = runs / run_id / "journal.jsonl"
    _flip_a_byte(journal, 4)  # save 3: the first tool result

    code, listed = cli_json("runs", runs_dir=runs)
    assert code == 0 and [(r["run_id"], r["status"]) for r in listed] == [(run_id, "damaged")]
    assert listed[0]["turns"] == 1  # as of its last good record, save 2
    assert listed[0]["damage"] == f"journal line 4: the record fails its checksum; repair: runner repair {run_id}"
    table = cli("runs", runs_dir=runs)
    assert table.returncode == 0 and "damaged" in table.stdout and "skipped" not in table.stderr

    shown = cli("trace", run_id, runs_dir=runs)
    assert shown.returncode == 0 and shown.stdout.splitlines()[-2:] == [
        "damaged: journal line 4: the record fails its checksum", f"repair with: runner repair {run_id}"]
    for args in (("resume", run_id), ("resume", run_id, "--force")):
        refused = cli(*args, runs_dir=runs)
        assert refused.returncode == 1, refused.stderr
        message = one_error(refused.stderr)
        assert message == (f"error: the run is damaged at journal line 4: the record fails its checksum "
                           f"(last good: save 2); repair with: runner repair {run_id}"), message

    before = len(provider_server.requests)
    repaired = cli("repair", run_id, runs_dir=runs)
    assert repaired.returncode == 0, repaired.stderr
    out = repaired.stdout
    assert f"repaired run {run_id}: rebuilt from save 2" in out
    assert "save 3: tool_result list_files (call c1)" in out and "save 4: turn 2" in out
    assert "turn 2 was paid" in out and "list_files (call c1) was started after save 2" in out
    assert len((runs / run_id / "journal.jsonl.damaged-2").read_bytes().splitlines()) == 5  # kept as found
    code, listed = cli_json("runs", runs_dir=runs)
    assert [r["status"] for r in listed] == ["interrupted"]  # stopped by the repair, not a driver that died
    assert listed[0]["reason"] == "repaired from save 2 of a damaged journal; resume to go on"
    assert listed[0]["interruption"] == {"type": "repaired", "kept_seq": 2, "dropped": 2}

    code, done = cli_json("resume", run_id, runs_dir=runs)
    assert code == 0 and done["status"] == "completed" and done["turns"] == 3
    assert len(provider_server.requests) - before == 2  # turn 2 asked again (dropped), then turn 3
    events = [json.loads(line) for line in (runs / run_id / "trace.jsonl").read_text().splitlines()]
    (fix,) = [e for e in events if e["type"] == "run_repaired"]
    assert fix["keptSeq"] == 2 and len(fix["dropped"]) == 2


def test_a_damaged_write_call_is_in_doubt_after_repair(provider: str, runs: Path) -> None:
    """destructive: approve the delete, die right after the write started; damage the
    record that marked it started (the last whole one: damaged, never dropped silently): the
    repair, reading the trace, still says it may have run and marks it in doubt; delete_file is
    idempotent, so the resume runs it again under its key and the file is deleted once."""
    code, out = cli_json("run", "--scenario", "destructive", "--base-url", provider, runs_dir=runs)
    assert code == 3
    run_id = out["run_id"]
    killed = cli_process("resume", run_id, "--approve", "c2", runs_dir=runs, env={"RUNNER_CRASH_AT": "tool_start:1"})
    assert killed.returncode == -9
    journal = runs / run_id / "journal.jsonl"
    _flip_a_byte(journal, len(journal.read_bytes().splitlines()))
    store = FileStore(runs)
    assert store.info(run_id).shown_status == "damaged"
    report = store.repair(run_id)
    assert any("delete_file (call c2) was started" in line and "in doubt" in line for line in report.outside)
    assert list(store.load(run_id).started) == ["c2"]
    code, out = cli_json("resume", run_id, runs_dir=runs)
    assert code == 0 and out["answer"] == "Deleted access.log to free space."
    assert deleted_files(store.workspace(run_id, workspace_template())) == ["access.log"]


def test_a_torn_tail_is_dropped_and_old_journals_without_checksums_load(provider: str, runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "plan", "--base-url", provider, runs_dir=runs)
    assert code == 0
    run_id = out["run_id"]
    store = FileStore(runs)
    whole = store.load(run_id)
    journal = runs / run_id / "journal.jsonl"
    sealed = journal.read_bytes()
    journal.write_bytes(b"".join(line[:-9] + b"\n" for line in sealed.splitlines()))  # as written before
    assert store.load(run_id) == whole
    journal.write_bytes(sealed + sealed.splitlines()[-1][:40])  # a torn last line: never committed
    assert store.load(run_id) == whole and store.info(run_id).shown_status == "completed"


def test_a_damaged_first_record_hides_nothing(provider: str, runs: Path) -> None:
    """The first record holds the whole new run; the snapshot written at creation holds it
    too, so the records after a damaged first one still follow: the run is listed damaged
    with all its saves, and a repair loses nothing."""
    code, out = cli_json("run", "--scenario", "plan", "--base-url", provider, runs_dir=runs)
    assert code == 0
    _flip_a_byte(runs / out["run_id"] / "journal.jsonl", 2)
    code, listed = cli_json("runs", runs_dir=runs)
    assert [(r["run_id"], r["status"], r["turns"]) for r in listed] == [(out["run_id"], "damaged", 3)]
    report = FileStore(runs).repair(out["run_id"])
    assert report.kept_seq == 7 and report.dropped == [] and report.status == "completed"
    code, listed = cli_json("runs", runs_dir=runs)
    assert listed[0]["status"] == "completed" and listed[0]["answer"] == out["answer"]


def test_trace_is_rebuilt_from_the_journal_when_its_file_is_gone(provider: str, runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "plan", "--base-url", provider, runs_dir=runs)
    run_id = out["run_id"]
    (runs / run_id / "trace.jsonl").unlink()
    shown = cli("trace", run_id, runs_dir=runs)
    assert shown.returncode == 0, shown.stderr
    assert "rebuilt from journal.jsonl" in shown.stderr
    assert shown.stdout.count(" turn ") == 3 and "stopped: completed" in shown.stdout
    code, listed = cli_json("runs", runs_dir=runs)
    assert code == 0 and listed[0]["status"] == "completed"


def test_a_cut_off_last_line_is_damaged_everywhere_and_repair_fixes_it(provider: str, runs: Path) -> None:
    """A journal whose last line was cut by hand (the trace witnessed that save): every
    command calls the run damaged in a short message, `trace` still prints its events,
    `repair` rebuilds it, and a resume finishes it without paying a turn again."""
    code, out = cli_json("run", "--scenario", "plan", "--base-url", provider, runs_dir=runs)
    assert code == 0
    run_id, journal = out["run_id"], runs / out["run_id"] / "journal.jsonl"
    journal.write_bytes(journal.read_bytes()[:-40])
    problem = "the trace records save 7, the journal ends at save 6"

    code, listed = cli_json("runs", "--status", "damaged", runs_dir=runs)
    assert [(r["run_id"], r["status"]) for r in listed] == [(run_id, "damaged")], listed
    assert listed[0]["damage"].startswith(problem) and listed[0]["damage"].count(run_id) == 1
    table = cli("runs", runs_dir=runs)
    assert "damaged" in table.stdout and table.stderr == ""
    shown = cli("show", run_id, runs_dir=runs)
    assert shown.returncode == 0 and f"{run_id}  scripted/plan  damaged" in shown.stdout
    assert f"damaged: {problem}" in shown.stdout and f"repair with: runner repair {run_id}" in shown.stdout and all(len(line) <= 80 for line in shown.stdout.splitlines())
    traced = cli("trace", run_id, runs_dir=runs)
    assert traced.returncode == 0 and traced.stdout.count("  turn  ") == 3 and f"damaged: {problem}" in traced.stdout
    refused = cli("resume", run_id, runs_dir=runs)
    message = one_error(refused.stderr)
    assert refused.returncode == 1 and message.startswith(f"error: {problem}")
    assert f"runner repair {run_id}" in message and message.count(run_id) == 1 and len(message) < 200, message

    repaired = cli("repair", run_id, runs_dir=runs)
    assert repaired.returncode == 0 and "nothing to repair" not in repaired.stdout, repaired.stdout
    assert "save 7: run_stopped completed" in repaired.stdout
    assert cli("repair", run_id, runs_dir=runs).stdout.endswith("nothing to repair\n")
    code, done = cli_json("resume", run_id, runs_dir=runs)
    assert (code, done["status"], done["turns"], done["cost_usd"]) == (0, "completed", 3, out["cost_usd"]), done


def test_a_damaged_state_file_is_rebuilt_from_the_journal_by_repair(provider: str, runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "plan", "--base-url", provider, runs_dir=runs)
    assert code == 0
    run_id, folder = out["run_id"], runs / out["run_id"]
    cut = (folder / "state.json").read_bytes()[:100]  # a torn copy, as a bad disk or an editor leaves it
    (folder / "state.json").write_bytes(cut)

    code, listed = cli_json("runs", runs_dir=runs)
    assert code == 0 and [(r["run_id"], r["status"], r["turns"]) for r in listed] == [(run_id, "damaged", 3)]
    assert listed[0]["damage"] == f"state.json: not a JSON object; repair: runner repair {run_id}"
    shown = cli("show", run_id, runs_dir=runs)  # the journal holds the whole run: shown as it ended
    assert shown.returncode == 0 and out["answer"] in shown.stdout and "damaged: state.json" in shown.stdout
    refused = cli("resume", run_id, runs_dir=runs)
    assert refused.returncode == 1 and one_error(refused.stderr) == (
        f"error: the run is damaged at state.json: not a JSON object (last good: save 7); repair with: "
        f"runner repair {run_id}")
    assert (folder / "state.json").read_bytes() == cut  # refusing overwrites nothing

    repaired = cli("repair", run_id, runs_dir=runs)
    assert repaired.returncode == 0 and "nothing committed after it" in repaired.stdout, repaired.stdout
    assert "note: the damaged state.json is kept as" in repaired.stdout
    assert (folder / "state.json.damaged-7").read_bytes() == cut
    state = FileStore(runs).load(run_id)
    assert (state.status, state.answer, state.turns) == ("completed", out["answer"], 3)
    assert cli("repair", run_id, runs_dir=runs).stdout.count("nothing to repair") == 1


def test_a_deleted_journal_is_damage_everywhere_and_repair_keeps_what_state_json_holds(
        provider: str, runs: Path) -> None:
    code, out = cli_json("run", "--scenario", "plan", "--base-url", provider, runs_dir=runs)
    assert code == 0
    run_id = out["run_id"]
    (runs / run_id / "journal.jsonl").unlink()  # state.json holds save 1, the trace saves up to 7

    code, listed = cli_json("runs", runs_dir=runs)
    assert code == 0 and [(r["run_id"], r["status"]) for r in listed] == [(run_id, "damaged")]
    why = "journal.jsonl is missing: the trace records save 7, state.json holds save 1"
    assert listed[0]["damage"].startswith(why)
    refused = cli("resume", run_id, runs_dir=runs)
    assert refused.returncode == 1 and one_error(refused.stderr).startswith(f"error: {why}; repair with:")

    repaired = cli("repair", run_id, runs_dir=runs)
    assert repaired.returncode == 0 and "journal is kept" not in repaired.stdout, repaired.stdout
    state = FileStore(runs).load(run_id)
    assert (state.status, state.reason) == ("interrupted", "repaired from save 1 (the saves after it were lost); "
                                                           "resume to go on")
    code, resumed = cli_json("resume", run_id, "--base-url", provider, runs_dir=runs)
    assert code == 0 and resumed["answer"] == out["answer"]


def test_a_damaged_state_file_after_compaction_cannot_be_rebuilt_and_says_why(runs: Path) -> None:
    store = FileStore(runs)
    state = new_run("q", RunConfig.model_validate({"model": "scripted/plan"}))
    lease = store.create(state, owner="tester")
    assert lease is not None
    store.save(state, [], lease, force=True)  # folded into state.json: the journal starts after it
    store.release(lease)
    (runs / state.run_id / "state.json").write_text("{")
    with pytest.raises(CorruptState, match=r"not a JSON object, and its journal starts after save 2: nothing else "
                                           r"holds the saves before"):
        store.load(state.run_id)


def test_repairing_a_finished_run_does_not_offer_a_resume(provider: str, runs: Path) -> None:
    """Garbage appended after a completed run's last record: repair keeps the completed state
    and says there is nothing to resume, rather than offering a resume that would be refused."""
    code, out = cli_json("run", "--scenario", "plan", "--base-url", provider, runs_dir=runs)
    assert code == 0
    run_id = out["run_id"]
    with open(runs / run_id / "journal.jsonl", "ab") as journal:
        journal.write(b"{garbage\n")
    repaired = cli("repair", run_id, runs_dir=runs)
    assert repaired.returncode == 0, repaired.stderr
    assert repaired.stdout.endswith("it is completed: nothing to resume\n"), repaired.stdout
    assert "runner resume" not in repaired.stdout
    assert cli_json("runs", runs_dir=runs)[1][0]["status"] == "completed"


def test_a_killed_process_counts_its_wall_time_up_to_its_last_commit(runs: Path) -> None:
    """wall_ms sums every process that worked on a run, the killed one included: each commit
    records the time so far."""
    with ScriptedServer(ScriptedSettings(latency_ms=300)) as slow:
        run_id = _killed_after_two_replies(slow, runs)
        killed_ms = FileStore(runs).load(run_id).wall_ms
        assert killed_ms >= 600, killed_ms  # two replies, 300 ms each, committed before the kill
        code, out = cli_json("resume", run_id, "--runs-dir", str(runs), runs_dir=runs)
    assert code == 0 and out["status"] == "completed"
    assert FileStore(runs).load(run_id).wall_ms >= killed_ms + 300  # and the third reply, in the resume
