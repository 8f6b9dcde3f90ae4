"""Workers: several `runner worker` processes on one store drive every queued run
exactly once (4 x 200 on PostgreSQL; a small queue on both stores), a worker killed with
SIGKILL mid-run has its run finished by another once its lease expires, and a verdict given
with `--detach` is carried out by a worker. Real processes, a real database, the real scripted provider
(in-process: it counts the requests it answers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from runner.harness import workspace_template
from runner.scripted import ScriptedServer
from runner.store.postgres import PostgresStore
from runner.tools import deleted_files
from tests.conftest import LEASE_S, Backend, cli_json, scripted_run


def _worker(url: str, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "runner", "worker", "--store", url, "--lease-s", str(LEASE_S), "--poll", "0.1", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(pg_url, lease_s=LEASE_S)
    try:
        yield store
    finally:
        store.close()


def test_four_workers_drive_200_runs_each_exactly_once(pg_store: PostgresStore, provider_server: ScriptedServer) -> None:
    ids = []
    for i in range(200):
        state = scripted_run("plan", base_url=provider_server.base_url)
        state.created_at += i * 1e-6  # a stable queue order
        assert pg_store.create(state) is None  # queued
        ids.append(state.run_id)
    before = len(provider_server.requests)
    workers = [_worker(pg_store.url, "--concurrency", "2", "--idle-exit", "3") for _ in range(4)]
    outputs = [w.communicate(timeout=900) for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0, 0], [err[-2000:] for _, err in outputs]

    infos = pg_store.list_runs()
    assert len(infos) == 200 and {i.shown_status for i in infos} == {"completed"}
    drivers: Counter[str] = Counter()
    for run_id in ids:
        rows = pg_store.trace_rows(run_id)
        types = [event["type"] for _, _, _, event in rows]
        assert types.count("run_started") == 1 and types.count("run_resumed") == 0 and types.count("run_stopped") == 1
        assert [event["turn"] for _, _, _, event in rows if event["type"] == "turn"] == [1, 2, 3]
        assert {epoch for _, epoch, _, _ in rows} == {1}  # claimed once, never taken over
        owners = {owner for _, _, owner, _ in rows}
        assert len(owners) == 1  # one driver wrote every event of the run
        drivers[owners.pop().split(" pid ")[1].split()[0]] += 1
    # every turn of every run was asked for exactly once: none driven twice
    asked = Counter(turn for _, turn in provider_server.requests[before:])
    assert asked == {1: 200, 2: 200, 3: 200}
    assert sum(drivers.values()) == 200 and len(drivers) >= 2  # the work was shared
    assert set(drivers) <= {str(w.pid) for w in workers}


def test_a_killed_workers_run_is_finished_by_another_after_its_lease(
    pg_store: PostgresStore, provider_server: ScriptedServer,
) -> None:
    state = scripted_run("slow", base_url=provider_server.base_url)  # scan_archive runs ~3 s
    pg_store.create(state)
    first = _worker(pg_store.url, "--concurrency", "1")
    deadline = time.monotonic() + 60
    while not any(e["type"] == "tool_progress" for _, _, _, e in pg_store.trace_rows(state.run_id)):
        assert time.monotonic() < deadline and first.poll() is None, "the first worker never started the scan"
        time.sleep(0.05)
    second = _worker(pg_store.url, "--concurrency", "1", "--idle-exit", "8")  # waiting for runnable runs
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert pg_store.info(state.run_id).shown_status == "died"  # its pid is gone (workers still wait for the lease)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err

    done = pg_store.load(state.run_id)
    assert done.status == "completed" and "errors.log: 4 errors" in done.answer
    rows = pg_store.trace_rows(state.run_id)
    epochs = [epoch for _, epoch, _, _ in rows]
    assert epochs == sorted(epochs) and set(epochs) == {1, 2}  # the first driver's events, then the second's
    owners = {epoch: owner for _, epoch, owner, _ in rows}
    assert f"pid {first.pid} " in owners[1] and f"pid {second.pid} " in owners[2]
    taken_over = [e["type"] for _, epoch, _, e in rows if epoch == 2]
    assert taken_over[0] == "run_resumed" and taken_over[-1] == "run_stopped"
    assert [e["type"] for _, epoch, _, e in rows if epoch == 1].count("run_stopped") == 0  # killed, never stopped


def test_workers_on_either_store_drive_queued_runs_once(backend: Backend, provider: str) -> None:
    """`runner run --detach` queues; two workers share the queue; FileStore workers claim with
    flock, PostgreSQL workers with SKIP LOCKED."""
    queued = []
    for _ in range(6):
        code, out = cli_json("run", "--scenario", "plan", "--base-url", provider, "--detach",
                             runs_dir=backend.runs, env=backend.env)
        assert code == 0 and out["status"] == "queued"
        queued.append(out["run_id"])
    assert {i.shown_status for i in backend.store.list_runs()} == {"queued"}
    env = {**os.environ, "RUNNER_RUNS_DIR": str(backend.runs), **backend.env}
    workers = [subprocess.Popen([sys.executable, "-m", "runner", "worker", "--idle-exit", "0.5", "--poll", "0.1"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = [w.communicate(timeout=300)[1] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], errors
    for run_id in queued:
        events = [e.type for e in backend.store.read_trace(run_id)]
        assert events.count("run_started") == 1 and events.count("turn") == 3 and events[-1] == "run_stopped"
        assert backend.store.load(run_id).status == "completed"


def test_a_verdict_given_with_detach_is_carried_out_by_a_worker(backend: Backend) -> None:
    code, out = cli_json("run", "--scenario", "destructive", runs_dir=backend.runs, env=backend.env)
    assert code == 3 and out["interruption"]["call_id"] == "c2"
    run_id = out["run_id"]
    code, queued = cli_json("resume", run_id, "--approve", "c2", "--detach", runs_dir=backend.runs, env=backend.env)
    assert code == 0 and queued["status"] == "queued"
    assert backend.store.info(run_id).shown_status == "queued"
    env = {**os.environ, "RUNNER_RUNS_DIR": str(backend.runs), **backend.env}
    worker = subprocess.run([sys.executable, "-m", "runner", "worker", "--idle-exit", "0.5", "--poll", "0.1"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert worker.returncode == 0, worker.stderr
    done = backend.store.load(run_id)
    assert done.status == "completed" and done.answer == "Deleted access.log to free space."
    assert deleted_files(backend.store.workspace(run_id, workspace_template())) == ["access.log"]
    events = backend.store.read_trace(run_id)
    assert [e.type for e in events].index("verdict") < [e.type for e in events].index("run_resumed")


def test_a_bug_one_run_meets_does_not_stop_the_worker(provider: str, tmp_path: Path) -> None:
    """A queued run whose recorded base URL no client can use (written by hand or by an older
    runner): the worker reports it as not driven and goes on to the next run."""
    from runner.state import Endpoint, RunConfig, new_run
    from runner.store import FileStore

    runs = tmp_path / "runs"
    broken = new_run("Go.", RunConfig(endpoint=Endpoint(model="scripted/plan", base_url="http://[::1")))
    FileStore(runs).create(broken)  # queued
    code, out = cli_json("run", "--scenario", "plan", "--base-url", provider, "--detach", runs_dir=runs)
    assert code == 0 and out["status"] == "queued"
    env = {**os.environ, "RUNNER_RUNS_DIR": str(runs)}
    worker = subprocess.run([sys.executable, "-m", "runner", "worker", "--idle-exit", "0.5", "--poll", "0.1"],
                            env=env, capture_output=True, text=True, timeout=120)
    said = worker.stdout + worker.stderr
    assert worker.returncode == 1 and "drove 1 run(s): 1 completed; 1 error(s)" in said, said  # an error to report, after both
    assert f"{broken.run_id}: not driven: internal error (" in said and "Traceback" not in said
    assert FileStore(runs).load(out["run_id"]).status == "completed"


SCAN_TOOL = '''\
from pydantic import BaseModel
from runner import Tool


class Scan(Tool):
    name = "scan"
    description = "Scan the archive."
    read_only = True

    class Params(BaseModel):
        pass

    def run_sync(self, args, ctx):
        return "nothing found"
'''


def test_a_run_the_worker_cannot_drive_is_set_aside_and_a_stop_still_stops_it(
        backend: Backend, provider: str, tmp_path: Path) -> None:
    """A queued run whose tool file is gone: the worker says so once, drives the runs queued
    after it, leaves it queued for later, exits when idle, and stops at SIGTERM while the
    broken run is all that is left."""
    tools = tmp_path / "gone.py"
    tools.write_text(SCAN_TOOL)
    code, bad = cli_json("run", "--scenario", "plan", "--tool", f"{tools}:Scan", "--detach",
                         runs_dir=backend.runs, env=backend.env)
    assert code == 0 and bad["status"] == "queued"
    tools.unlink()
    code, good = cli_json("run", "--scenario", "plan", "--base-url", provider, "--detach",
                          runs_dir=backend.runs, env=backend.env)
    assert code == 0 and good["status"] == "queued"
    env = {**os.environ, "RUNNER_RUNS_DIR": str(backend.runs), **backend.env}
    worker = subprocess.run([sys.executable, "-m", "runner", "worker", "--idle-exit", "1", "--poll", "0.1"],
                            env=env, capture_output=True, text=True, timeout=120)
    said = worker.stdout + worker.stderr
    assert worker.returncode == 1 and said.count("not driven") == 1, said
    assert f"{bad['run_id']}: not driven: tool(s) not found: scan (" in said and "trying it again in 30 s" in said
    assert backend.store.load(good["run_id"]).status == "completed"
    assert backend.store.info(bad["run_id"]).shown_status == "queued"
    assert not backend.store.read_trace(bad["run_id"])  # never started: nothing was done

    began = time.monotonic()
    waiting = subprocess.Popen([sys.executable, "-m", "runner", "worker", "--poll", "0.1"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    waiting.send_signal(signal.SIGTERM)
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode is not None and time.monotonic() - began < 20, out + err
    assert (out + err).count("not driven") == 1, out + err
    assert backend.store.info(bad["run_id"]).shown_status == "queued"


def test_a_stopped_worker_says_what_it_waits_for(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    code, queued = cli_json("run", "--scenario", "slow", "--detach", runs_dir=runs)
    assert code == 0
    env = {**os.environ, "RUNNER_RUNS_DIR": str(runs)}
    worker = subprocess.Popen([sys.executable, "-m", "runner", "worker", "--poll", "0.1"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    trace = runs / queued["run_id"] / "trace.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (trace.exists() and "tool_progress" in trace.read_text()):
        time.sleep(0.05)
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=60)
    assert "stopping: 1 run(s) being driven stop at their next step" in out + err, out + err
    from runner.store import FileStore

    assert FileStore(runs).load(queued["run_id"]).status == "interrupted"
