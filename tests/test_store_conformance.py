"""One conformance suite for both run stores: every test runs on the FileStore and
on PostgreSQL (`backend` fixture). Round trip; state and trace committed together; a second
driver refused; a stale-epoch write refused; an old copy refused; approvals need their
operator event; a killed run shows `died` and resumes; a child's cost counted once.
The kill-anywhere tests on both stores are in test_sigkill_resume.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runner import loop
from runner.harness import workspace_template
from runner.state import Message, TurnRecord
from runner.store import LeaseLost, RunBusy, RunNotFound, RunStore, StaleState, open_store
from runner.tools import deleted_files
from runner.trace import TurnEvent
from tests.conftest import Backend, cli, cli_json, cli_process, one_error, scripted_run


def _turn(state, n: int) -> TurnEvent:  # type: ignore[no-untyped-def]
    """Make one transition on `state` (a reply and its record) and return its event."""
    state.messages.append(Message(role="assistant", content=f"reply {n}"))
    state.per_turn.append(TurnRecord(turn=n, prompt_tokens=10, completion_tokens=2, cost_usd=0.001, ms=1.0))
    state.turns, state.cost_usd = n, state.cost_usd + 0.001
    return TurnEvent(runId=state.run_id, turn=n, promptTokens=10, completionTokens=2, totalTokens=12,
                     costUsd=state.cost_usd, finish="stop", ms=1.0)


def _turns(store: RunStore, run_id: str) -> list[int]:
    return [e.turn for e in store.read_trace(run_id) if e.type == "turn"]


def test_round_trip_and_list_newest_first(backend: Backend) -> None:
    s = backend.store
    state = scripted_run("plan")
    lease = s.create(state, owner="tester")
    assert lease is not None and state.seq == 1 and s.load(state.run_id) == state
    s.save(state, [_turn(state, 1)], lease)
    s.save(state, [_turn(state, 2)], lease)
    assert state.seq == 3 and s.load(state.run_id) == state and _turns(s, state.run_id) == [1, 2]
    state.status, state.reason = "completed", "the model answered"
    s.save(state, [], lease)
    s.release(lease)
    assert s.load(state.run_id) == state

    interrupted, queued = scripted_run("plan", prompt="b"), scripted_run("plan", prompt="c")
    interrupted.created_at, queued.created_at = state.created_at + 1, state.created_at + 2
    lease = s.create(interrupted, owner="tester")
    assert lease is not None
    interrupted.status = "interrupted"
    s.save(interrupted, [], lease)
    s.release(lease)
    assert s.create(queued) is None  # no owner: queued for a worker
    listed = [(i.state.run_id, i.shown_status) for i in s.list_runs()]
    assert listed == [(queued.run_id, "queued"), (interrupted.run_id, "interrupted"), (state.run_id, "completed")]
    assert [i.state.run_id for i in s.list_runs(status="completed")] == [state.run_id]
    assert [i.state.run_id for i in s.list_runs(limit=1, offset=1)] == [interrupted.run_id]


SAVE_THEN_DIE = """
import sys
from runner.store import open_store
from runner.state import Message
from runner.trace import TurnEvent
store = open_store(sys.argv[1])
lease = store.claim(sys.argv[2])
state = store.load(sys.argv[2])
state.messages.append(Message(role="assistant", content="late reply"))
state.turns = 9
store.save(state, [TurnEvent(runId=state.run_id, turn=9, promptTokens=1, completionTokens=1, totalTokens=2,
                             costUsd=0.5, finish="stop", ms=1.0)], lease)
store.release(lease)
"""


def test_state_and_trace_are_committed_together(backend: Backend) -> None:
    """A process killed in the middle of a save leaves neither the state change nor its event;
    the same save, not killed, leaves both."""
    s = backend.store
    state = scripted_run("plan")
    lease = s.create(state, owner="tester")
    assert lease is not None
    s.release(lease)
    url = str(backend.runs) if backend.kind == "files" else s.url
    env = {**os.environ, "RUNNER_CRASH_AT": "save:1"}
    killed = subprocess.run([sys.executable, "-c", SAVE_THEN_DIE, url, state.run_id], env=env, capture_output=True,
                            text=True)
    assert killed.returncode == -9, killed.stderr
    after = s.load(state.run_id)
    assert after.turns == 0 and after.seq == 1 and len(after.messages) == 1 and _turns(s, state.run_id) == []
    done = subprocess.run([sys.executable, "-c", SAVE_THEN_DIE, url, state.run_id], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    after = s.load(state.run_id)
    assert after.turns == 9 and after.seq == 2 and _turns(s, state.run_id) == [9]


def test_a_second_driver_is_refused(backend: Backend) -> None:
    s = backend.store
    state = scripted_run("plan")
    lease = s.create(state, owner="first driver")
    assert lease is not None
    with pytest.raises(RunBusy, match="being driven by first driver"):
        s.claim(state.run_id)
    with open_store(s.url) as other, pytest.raises(RunBusy):
        other.claim(state.run_id)
    proc = cli("resume", state.run_id, runs_dir=backend.runs, env=backend.env)
    assert proc.returncode == 2
    assert one_error(proc.stderr).startswith(f"error: run {state.run_id} is being driven by first driver since ")
    assert s.info(state.run_id).shown_status == "running"
    s.release(lease)
    s.claim(state.run_id)  # free again


def test_a_stale_epoch_cannot_write(backend: Backend) -> None:
    s = backend.store
    state = scripted_run("plan")
    old = s.create(state, owner="old driver")
    assert old is not None
    s.release(old)
    with open_store(s.url) as other:
        new = other.claim(state.run_id, "new driver")
        assert new.epoch == old.epoch + 1
        with pytest.raises(LeaseLost):
            s.save(state, [_turn(state, 1)], old)
        assert other.load(state.run_id).seq == 1 and _turns(other, state.run_id) == []
        other.release(new)


def test_the_database_fences_a_driver_taken_over(pg_url: str) -> None:
    """PostgreSQL: the takeover happens in another store object (as in another process); the
    old driver's next save is refused by the database, and writes nothing."""
    from runner.store.postgres import PostgresStore

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_owner = f"ghost@{os.uname().nodename} pid {gone.stdout.strip()}"
    with PostgresStore(pg_url, lease_s=30) as a, PostgresStore(pg_url, lease_s=30) as b:
        state = scripted_run("plan")
        lease = a.create(state, owner=dead_owner)  # a driver whose process is gone
        assert lease is not None
        taken = b.claim(state.run_id, "survivor")  # no need to wait 30 s: its pid is dead
        assert taken.epoch == lease.epoch + 1
        with pytest.raises(LeaseLost, match="taken over by survivor"):
            a.save(state, [_turn(state, 1)], lease)
        assert b.load(state.run_id).turns == 0 and _turns(b, state.run_id) == []


def test_an_old_copy_is_refused_unless_forced(backend: Backend) -> None:
    s = backend.store
    state = scripted_run("plan")
    lease = s.create(state, owner="tester")
    assert lease is not None
    s.save(state, [_turn(state, 1)], lease)
    old = s.load(state.run_id)  # a copy taken at seq 2
    s.save(state, [_turn(state, 2)], lease)
    old.status = "interrupted"
    with pytest.raises(StaleState, match="seq 2 but the store holds seq 3"):
        s.save(old, [TurnEvent(runId=old.run_id, turn=2, promptTokens=1, completionTokens=1, totalTokens=2,
                               costUsd=0.1, finish="stop", ms=1.0)], lease)
    assert s.load(state.run_id) == state and _turns(s, state.run_id) == [1, 2]
    s.save(old, [], lease, force=True)
    assert s.load(state.run_id).turns == 1 and old.seq == 4
    forced = [e for e in s.read_trace(state.run_id) if e.type == "state_forced"]
    assert [(e.fromSeq, e.storedSeq) for e in forced] == [(2, 3)]


def _stop_for_approval(b: Backend) -> str:
    code, out = cli_json("run", "--scenario", "destructive", runs_dir=b.runs, env=b.env)
    assert code == 3 and out["interruption"]["call_id"] == "c2", out
    return str(out["run_id"])


def test_restored_backup_files_are_refused(tmp_path: Path) -> None:
    """The FileStore: back up a run's files while it waits for approval, approve (the delete
    happens), restore the backup, reject: refused, the trace knows newer history."""
    runs = tmp_path / "runs"
    b = Backend("files", open_store(runs), {"RUNNER_RUNS_DIR": str(runs)}, runs)
    run_id = _stop_for_approval(b)
    backup = tmp_path / "backup"
    backup.mkdir()
    saved = [p.name for p in (runs / run_id).iterdir() if p.name in ("state.json", "journal.jsonl")]
    assert "journal.jsonl" in saved
    for name in saved:
        shutil.copy(runs / run_id / name, backup / name)
    code, done = cli_json("resume", run_id, "--approve", "c2", runs_dir=runs)
    assert code == 0 and done["answer"] == "Deleted access.log to free space."
    for name in saved:
        shutil.copy(backup / name, runs / run_id / name)
    proc = cli("resume", run_id, "--reject", "c2", "--reason", "keep it", runs_dir=runs)
    assert proc.returncode == 1 and "older copy" in proc.stderr and "--force" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    code, forced = cli_json("resume", run_id, "--reject", "c2", "--reason", "keep it", "--force", runs_dir=runs)
    assert code == 0 and forced["status"] == "completed"
    assert [e.type for e in b.store.read_trace(run_id)].count("state_forced") == 1


def test_an_approval_without_its_operator_event_is_refused(backend: Backend) -> None:
    run_id = _stop_for_approval(backend)
    state = backend.store.load(run_id)
    loop.approve(state, "c2")  # an approval written into the state, not given through resume
    backend.store.save(state)
    code, out = cli_json("resume", run_id, runs_dir=backend.runs, env=backend.env)
    assert code == 3 and out["interruption"]["call_id"] == "c2"
    workspace = backend.store.workspace(run_id, workspace_template())
    assert deleted_files(workspace) == []
    code, out = cli_json("resume", run_id, "--approve", "c2", runs_dir=backend.runs, env=backend.env)
    assert code == 0 and out["answer"] == "Deleted access.log to free space."
    verdicts = [e for e in backend.store.read_trace(run_id) if e.type == "verdict"]
    assert len(verdicts) == 1 and verdicts[0].callId == "c2" and verdicts[0].verdict == "approve"
    assert verdicts[0].args == '{"path": "access.log"}' and " pid " in verdicts[0].by
    assert verdicts[0].signature == state.approved["c2"]


def test_two_approvals_at_once_run_the_call_once(backend: Backend) -> None:
    run_id = _stop_for_approval(backend)
    env = {**os.environ, "RUNNER_RUNS_DIR": str(backend.runs), **backend.env}
    cmd = [sys.executable, "-m", "runner", "resume", run_id, "--approve", "c2", "--latency-ms", "300", "--json"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    loser = next(err for p, (_, err) in zip(procs, outs) if p.returncode == 2)
    assert any(said in loser for said in ("being driven by", "nothing to resume", "is approved already", "has run already")), loser
    events = backend.store.read_trace(run_id)
    assert [e.callId for e in events if e.type == "tool_start"].count("c2") == 1
    assert [e.type for e in events].count("verdict") == 1
    assert deleted_files(backend.store.workspace(run_id, workspace_template())) == ["access.log"]


def test_a_killed_run_shows_died_and_resumes(backend: Backend) -> None:
    killed = cli_process("run", "--scenario", "plan", "--json", runs_dir=backend.runs,
                         env={**backend.env, "RUNNER_CRASH_AT": "tool_result:1"})
    assert killed.returncode == -9
    code, listed = cli_json("runs", runs_dir=backend.runs, env=backend.env)
    assert code == 0 and [r["status"] for r in listed] == ["died"]
    run_id = listed[0]["run_id"]
    shown = cli("trace", run_id, runs_dir=backend.runs, env=backend.env)
    assert shown.returncode == 0 and f"died: its process was killed after the last event\nresume with: runner resume {run_id}" in shown.stdout
    transcript = cli("show", run_id, runs_dir=backend.runs, env=backend.env).stdout
    assert transcript.startswith(f"run {run_id}  scripted/plan  died\n") and "running" not in transcript, transcript
    assert transcript.endswith(f"died: its process was killed after the last event\nresume with: runner resume {run_id}\n")
    code, done = cli_json("resume", run_id, runs_dir=backend.runs, env=backend.env)
    assert code == 0 and done["status"] == "completed" and done["turns"] == 3
    code, listed = cli_json("runs", "--status", "completed", runs_dir=backend.runs, env=backend.env)
    assert [r["run_id"] for r in listed] == [run_id]
    lines = cli("show", run_id, runs_dir=backend.runs, env=backend.env).stdout.splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith("── resumed after turn ")]
    assert len(marks) == 1 and lines[marks[0]].startswith("── resumed after turn 1 · ")
    assert lines[marks[0] + 2].startswith("── turn 2 ")
    assert [line[:9] for line in lines if line.startswith("── turn ")] == ["── turn 1", "── turn 2", "── turn 3"]
    assert lines.index(next(line for line in lines if line.startswith("── turn 1 "))) < marks[0]



def _popen(b: Backend, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "runner", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **b.env})


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _progress_since(b: Backend, since: str) -> str | None:
    """The only run's id once its trace holds a tool_progress event after its last `since` event."""
    infos = b.store.list_runs()
    if not infos:
        return None
    run_id = infos[0].state.run_id
    kinds = [e.type for e in b.store.read_trace(run_id)] if b.store.has_events(run_id) else []
    return run_id if since in kinds and "tool_progress" in kinds[len(kinds) - kinds[::-1].index(since):] else None


def test_a_resume_killed_mid_tool_shows_died_everywhere_and_resumes_once(backend: Backend) -> None:
    """Stop a slow run with Ctrl-C, resume it, kill -9 the resume while its tool runs: `runs`,
    `runs --json`, `show` and `trace` say `died` (not the earlier stop), and a second resume
    finishes it, paying each turn once."""
    first = _popen(backend, "run", "--scenario", "slow")
    _wait_for(lambda: _progress_since(backend, "run_started") is not None)
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=60)
    assert first.returncode == 3
    run_id = backend.store.list_runs()[0].state.run_id
    resumed = _popen(backend, "resume", run_id)
    _wait_for(lambda: _progress_since(backend, "run_resumed") is not None)
    resumed.kill()
    resumed.communicate(timeout=60)
    assert resumed.returncode == -9

    _wait_for(lambda: backend.store.info(run_id).shown_status == "died")  # PostgreSQL: once the lease lapses
    listed = cli("runs", runs_dir=backend.runs, env=backend.env)
    assert run_id in listed.stdout and " died " in listed.stdout and "interrupted" not in listed.stdout
    _, rows = cli_json("runs", runs_dir=backend.runs, env=backend.env)
    assert rows[0]["status"] == "died"
    shown = cli("show", run_id, runs_dir=backend.runs, env=backend.env).stdout
    assert f"{run_id}  scripted/slow  died" in shown and "stopped by Ctrl-C" not in shown, shown
    assert shown.endswith(f"died: its process was killed after the last event\nresume with: runner resume {run_id}\n")
    traced = cli("trace", run_id, runs_dir=backend.runs, env=backend.env).stdout
    assert "died: its process was killed after the last event" in traced and "stopped: interrupted" not in traced, traced

    code, done = cli_json("resume", run_id, runs_dir=backend.runs, env=backend.env)
    assert (code, done["status"], done["turns"]) == (0, "completed", 2), done
    state = backend.store.load(run_id)
    assert len(state.per_turn) == 2 and state.cost_usd == pytest.approx(sum(t.cost_usd for t in state.per_turn))

def test_a_research_child_killed_mid_run_is_counted_once(backend: Backend) -> None:
    code, ref = cli_json("run", "--scenario", "research", runs_dir=backend.runs, env=backend.env)
    assert code == 0
    # reply 1 is the parent's (it calls research), reply 2 the child's first: die there
    killed = cli_process("run", "--scenario", "research", "--json", runs_dir=backend.runs,
                         env={**backend.env, "RUNNER_CRASH_AT": "reply:2"})
    assert killed.returncode == -9
    parent_id = next(i.state.run_id for i in backend.store.list_runs()
                     if i.state.parent_run_id is None and i.state.run_id != ref["run_id"])
    child = backend.store.load(f"{parent_id}.c1")
    assert child.turns == 1 and child.cost_usd > 0  # the child had spent before the kill
    code, done = cli_json("resume", parent_id, runs_dir=backend.runs, env=backend.env)
    assert code == 0 and done["status"] == "completed"
    parent, child = backend.store.load(parent_id), backend.store.load(f"{parent_id}.c1")
    assert parent.child_costs == {child.run_id: child.cost_usd}
    assert parent.cost_usd == pytest.approx(ref["cost_usd"]) and parent.child_cost_usd == pytest.approx(ref["child_cost_usd"])
    assert json.loads(json.dumps(done))["cost_usd"] == pytest.approx(ref["cost_usd"])


def test_prune_deletes_final_runs_never_one_being_driven(backend: Backend) -> None:
    _, done = cli_json("run", "--scenario", "plan", runs_dir=backend.runs, env=backend.env)
    _, waiting = cli_json("run", "--scenario", "destructive", runs_dir=backend.runs, env=backend.env)
    driven = scripted_run("plan")
    lease = backend.store.create(driven, owner="a live driver")
    assert lease is not None
    code, dry = cli_json("runs", "--prune", "--dry-run", runs_dir=backend.runs, env=backend.env)
    assert code == 0 and dry == {"would_delete": [done["run_id"]], "skipped": []}
    assert len(backend.store.list_runs()) == 3  # a dry run deletes nothing
    code, pruned = cli_json("runs", "--prune", runs_dir=backend.runs, env=backend.env)
    assert code == 0 and pruned["deleted"] == [done["run_id"]]
    left = {i.state.run_id: i.shown_status for i in backend.store.list_runs()}
    assert left == {waiting["run_id"]: "interrupted", driven.run_id: "running"}
    with pytest.raises(RunNotFound):
        backend.store.load(done["run_id"])
    code, dry = cli_json("runs", "--prune", "--status", "running", "--dry-run", runs_dir=backend.runs, env=backend.env)
    assert code == 0 and dry["would_delete"] == [] and "being driven by a live driver" in dry["skipped"][0]
    code, busy = cli_json("runs", "--prune", "--status", "running", runs_dir=backend.runs, env=backend.env)
    assert code == 0 and busy["deleted"] == [] and "being driven by a live driver" in busy["skipped"][0]
    assert backend.store.info(driven.run_id).shown_status == "running"
    proc = cli("runs", "--dry-run", runs_dir=backend.runs, env=backend.env)
    assert proc.returncode == 2 and "--dry-run goes with --prune" in proc.stderr


def test_prune_deletes_only_the_runs_listed(backend: Backend) -> None:
    ids = [cli_json("run", "--scenario", "plan", runs_dir=backend.runs, env=backend.env)[1]["run_id"]
           for _ in range(4)]
    newest_first = [i.state.run_id for i in backend.store.list_runs()]
    assert sorted(newest_first) == sorted(ids)
    code, dry = cli_json("runs", "--prune", "--limit", "2", "--offset", "1", "--dry-run", runs_dir=backend.runs,
                         env=backend.env)
    assert code == 0 and dry["would_delete"] == newest_first[1:3]
    code, pruned = cli_json("runs", "--prune", "--limit", "2", runs_dir=backend.runs, env=backend.env)
    assert code == 0 and pruned["deleted"] == newest_first[:2]
    assert [i.state.run_id for i in backend.store.list_runs()] == newest_first[2:]


def test_a_refused_resume_leaves_the_run_as_it_was(backend: Backend) -> None:
    """A resume refused for what the run is (final, waiting for a verdict none was given, a
    limit not raised) neither claims it nor changes it: the next claim's epoch follows the last
    real one, and the run reads the same."""
    code, out = cli_json("run", "--scenario", "destructive", runs_dir=backend.runs, env=backend.env)
    assert code == 3 and out["status"] == "interrupted", out
    waiting = out["run_id"]
    code, out = cli_json("run", "--scenario", "plan", runs_dir=backend.runs, env=backend.env)
    finished = out["run_id"]
    code, out = cli_json("run", "--scenario", "runaway", "--max-turns", "2", runs_dir=backend.runs, env=backend.env)
    capped = out["run_id"]
    epochs = {}
    for run_id in (waiting, finished, capped):
        lease = backend.store.claim(run_id)
        epochs[run_id] = lease.epoch
        backend.store.release(lease)
    before = {run_id: backend.store.load(run_id) for run_id in epochs}
    for run_id, args, said in [(waiting, (), "waits for a verdict"), (finished, (), "nothing to resume"),
                               (capped, ("--max-turns", "2"), "give --max-turns larger than 2")]:
        proc = cli("resume", run_id, *args, runs_dir=backend.runs, env=backend.env)
        assert proc.returncode == 2 and said in one_error(proc.stderr), proc.stderr
    for run_id, epoch in epochs.items():
        assert backend.store.load(run_id) == before[run_id]
        lease = backend.store.claim(run_id)
        assert lease.epoch == epoch + 1, (run_id, lease.epoch, epoch)
        backend.store.release(lease)
