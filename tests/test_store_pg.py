"""PostgreSQL on any database and through outages, against real clusters: a SQL_ASCII
database (`initdb --no-locale`, a C-locale machine's default) and a UTF8 one hold non-ASCII
runs and list them; `pg_ctl restart -m fast` while 4 workers drive 100 runs loses no commit,
doubles none and drives each run once (checked from the traces and the provider's request
log); a server unreachable for 10 s holds a save up, then it commits once; a fresh 3-turn run
takes 11 statements in 4 round trips with its trace in order."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from runner.scripted import ScriptedServer
from runner.store import StoreError
from runner.store.postgres import PostgresStore
from tests.conftest import cli, cli_json, cli_process, one_error, scripted_run
from tests.test_store_conformance import _turn, _turns

WORKER_LEASE_S = 10.0
"""Long enough that a restart (about a second) never costs a lease: a lease lost would make a
second driver, which this test must not see."""


@pytest.fixture(scope="module")
def ascii_cluster() -> Iterator[Any]:
    """A cluster of its own, SQL_ASCII (restarted and stopped by the tests here)."""
    from tests.pgcluster import Cluster, available

    missing = available()
    if missing:
        pytest.skip(missing)
    with Cluster(encoding="SQL_ASCII") as cluster:
        yield cluster


@pytest.mark.parametrize("encoding", ["SQL_ASCII", "UTF8"])
def test_runs_on_a_sql_ascii_and_a_utf8_database(encoding: str, request: pytest.FixtureRequest,
                                                 provider: str, tmp_path: Any) -> None:
    cluster = request.getfixturevalue("ascii_cluster" if encoding == "SQL_ASCII" else "pg_cluster")
    url = cluster.new_database()
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_encoding").fetchone()
    assert row is not None and row[0] in (encoding, encoding.encode())
    env = {"RUNNER_STORE": url}
    prompt = "Café ✓: which log mentions a timeout? 日本"
    code, out = cli_json("run", prompt, "--scenario", "plan", "--base-url", provider, runs_dir=tmp_path, env=env)
    assert code == 0 and out["status"] == "completed"
    code, listed = cli_json("runs", runs_dir=tmp_path, env=env)
    assert code == 0 and [(r["run_id"], r["status"]) for r in listed] == [(out["run_id"], "completed")]
    table = cli("runs", "--status", "completed", runs_dir=tmp_path, env=env)
    assert table.returncode == 0 and out["run_id"] in table.stdout, table.stderr
    shown = cli("trace", out["run_id"], runs_dir=tmp_path, env=env)
    assert shown.returncode == 0 and "stopped: completed" in shown.stdout, shown.stderr
    events = [json.loads(line) for line in cli("trace", out["run_id"], "--json", runs_dir=tmp_path, env=env).stdout.splitlines()]
    assert events[0]["type"] == "run_started" and events[0]["prompt"] == prompt
    with PostgresStore(url) as store:
        assert [m.content for m in store.load(out["run_id"]).messages if m.role == "user"] == [prompt]


def _worker(url: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "runner", "worker", "--store", url, "--lease-s", str(WORKER_LEASE_S), "--poll", "0.1",
           "--concurrency", "2", "--idle-exit", "3"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_fast_restart_while_4_workers_drive_100_runs(ascii_cluster: Any, provider_server: ScriptedServer) -> None:
    url = ascii_cluster.new_database()
    store = PostgresStore(url)
    ids = []
    for i in range(100):
        state = scripted_run("plan", base_url=provider_server.base_url)
        state.created_at += i * 1e-6
        assert store.create(state) is None
        ids.append(state.run_id)
    before = len(provider_server.requests)
    workers = [_worker(url) for _ in range(4)]
    try:
        deadline = time.monotonic() + 120
        while len(store.list_runs(status="completed")) < 25:
            assert time.monotonic() < deadline and all(w.poll() is None for w in workers), "the workers stalled"
            time.sleep(0.05)
        ascii_cluster.server("restart", "-m", "fast")  # runs are in flight: saves meet dead connections
        restarted_with = len(store.list_runs(status="completed"))
        outputs = [w.communicate(timeout=300) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    assert [w.returncode for w in workers] == [0, 0, 0, 0], [err[-2000:] for _, err in outputs]
    assert restarted_with < 100  # the restart happened mid-way
    infos = store.list_runs()
    assert len(infos) == 100 and {i.shown_status for i in infos} == {"completed"}
    for run_id in ids:
        rows = store.trace_rows(run_id)
        types = [event["type"] for _, _, _, event in rows]
        assert types.count("run_started") == 1 and types.count("run_resumed") == 0, (run_id, types)
        assert types.count("run_stopped") == 1, (run_id, types)
        assert [event["turn"] for _, _, _, event in rows if event["type"] == "turn"] == [1, 2, 3], run_id
        assert {epoch for _, epoch, _, _ in rows} == {1}  # claimed once, never taken over
        assert len({owner for _, _, owner, _ in rows}) == 1  # one driver wrote every event
        assert store.load(run_id).seq == 7  # 7 commits, none lost, none made twice
    asked = Counter(turn for _, turn in provider_server.requests[before:])
    assert asked == {1: 100, 2: 100, 3: 100}  # no turn paid twice
    store.close()


def test_a_server_unreachable_for_10_s_holds_a_save_up_then_it_commits_once(ascii_cluster: Any) -> None:
    url = ascii_cluster.new_database()
    with PostgresStore(url, lease_s=60) as store:
        state = scripted_run("plan")
        lease = store.create(state, owner="tester")
        assert lease is not None
        store.save(state, [_turn(state, 1)], lease)
        ascii_cluster.server("stop", "-m", "fast")
        restart = threading.Timer(10.0, ascii_cluster.server, ("start",))
        restart.start()
        began = time.monotonic()
        try:
            store.save(state, [_turn(state, 2)], lease)  # waits for the server, then commits
        finally:
            restart.join()
        assert time.monotonic() - began >= 9.5
        assert state.seq == 3 and store.load(state.run_id) == state and _turns(store, state.run_id) == [1, 2]
        store.save(state, [_turn(state, 3)], lease)
        assert _turns(store, state.run_id) == [1, 2, 3]
        store.release(lease)


def test_a_server_gone_longer_than_retry_s_is_one_clear_error(ascii_cluster: Any) -> None:
    url = ascii_cluster.new_database()
    store = PostgresStore(url, retry_s=2.0)
    state = scripted_run("plan")
    lease = store.create(state, owner="tester")
    assert lease is not None
    ascii_cluster.server("stop", "-m", "fast")
    try:
        with pytest.raises(StoreError, match=r"lost the run store at .* for 2 s"):
            store.save(state, [_turn(state, 1)], lease)
        assert state.seq == 1
    finally:
        ascii_cluster.server("start")
    store.save(state, [_turn(state, 1)], lease)
    assert store.load(state.run_id).seq == 2
    store.close()


def test_no_workspace_folder_is_left_behind(pg_url: str, provider: str, tmp_path: Any) -> None:
    """Every command that touches a PostgreSQL run's workspace (a run stopped for approval,
    the approved resume that deletes, a killed resume, the resume after it) leaves no
    runner-ws-* folder in the temp directory once it exits."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {"RUNNER_STORE": pg_url, "TMPDIR": str(scratch)}
    code, out = cli_json("run", "--scenario", "destructive", "--base-url", provider, runs_dir=tmp_path, env=env)
    assert code == 3
    killed = cli_process("resume", out["run_id"], "--approve", "c2", runs_dir=tmp_path,
                         env={**env, "RUNNER_CRASH_AT": "tool_result:1"})
    assert killed.returncode == -9
    assert [p.name for p in scratch.iterdir() if p.name.startswith("runner-ws-")]  # a SIGKILL leaves one...
    code, done = cli_json("resume", out["run_id"], runs_dir=tmp_path, env=env)
    assert code == 0 and done["answer"] == "Deleted access.log to free space."
    assert cli("runs", runs_dir=tmp_path, env=env).returncode == 0
    assert [p.name for p in scratch.iterdir() if p.name.startswith("runner-ws-")] == []  # ...the next one sweeps it


def _protocol_counts(trace: str) -> tuple[int, int]:
    """(statements, round trips) in a libpq protocol trace of one connection: an Execute or a
    simple Query is a statement; a round trip is the client turning from sending (F lines) to
    reading what the server sent back (B lines). libpq writes a B line when the client reads
    the message, so the count is the driver's own waits, whatever the server's speed."""
    statements = round_trips = 0
    last = ""
    for line in trace.splitlines():
        side, _, message = (line.split("\t") + ["", "", ""])[:3]
        if side == "F" and message in ("Execute", "Query"):
            statements += 1
        if side == "B" and last == "F":
            round_trips += 1
        last = side or last
    return statements, round_trips


def _counted_plan_run(url: str, provider: str, monkeypatch: pytest.MonkeyPatch,
                      tmp_path: Path) -> tuple[list[tuple[int, int]], list[Any]]:
    """A second fresh `plan` run on one store (the first prepares the statements on its
    connections): (statements, round trips) per connection from libpq's own protocol trace of
    every connection, and the run's trace rows."""
    import asyncio

    import psycopg
    from psycopg import pq

    from runner.endpoints import Endpoint
    from runner.harness import drive
    from runner.state import RunConfig, new_run

    conns: list[Any] = []
    tracing: list[Any] = []  # (connection, trace file) while counting

    def trace(conn: Any) -> None:
        out = open(tmp_path / f"conn{len(tracing)}.trace", "w")
        tracing.append((conn, out))
        conn.pgconn.trace(out.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

    connect = psycopg.Connection.connect

    def traced(*args: Any, **kwargs: Any) -> Any:
        conn = connect(*args, **kwargs)
        conns.append(conn)
        if tracing:
            trace(conn)
        return conn

    monkeypatch.setattr(psycopg.Connection, "connect", traced)  # the pool's connections
    monkeypatch.setattr(psycopg, "connect", traced)  # the pipeline's
    store = PostgresStore(url, lease_s=600)  # no lease renewal while counting
    try:
        def plan_run() -> Any:
            state = new_run("Which log file mentions a timeout?", RunConfig(endpoint=Endpoint(model="scripted/plan")))
            return asyncio.run(drive(state, provider, store))

        plan_run()
        for conn in conns:
            if not conn.closed:
                trace(conn)
        state = plan_run()
        for conn, out in tracing:
            conn.pgconn.untrace()  # flushes libpq's buffer
            out.close()
        assert state.status == "completed"
        return [_protocol_counts(Path(out.name).read_text()) for _, out in tracing], store.trace_rows(state.run_id)
    finally:
        store.close()


def test_a_fresh_plan_run_takes_eleven_statements_each_answered_before_the_next_and_its_trace_keeps_its_order(
        pg_url: str, provider: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A new 3-turn run: create (no claim that misses first), run_started, 6 saves, the two
    read-only tools' tool_start (each sent before its tool runs, no seq of its own), release.
    Each statement's answer is read before the next is sent (a server whose client was killed
    runs the one statement in flight, never two); over this Unix socket, when the next one
    goes or before an effect, so the run moves on while the server works."""
    counts, rows = _counted_plan_run(pg_url, provider, monkeypatch, tmp_path)
    assert sum(c[0] for c in counts) == 11, counts
    assert sum(c[1] for c in counts) == 11, counts
    types = [event["type"] for _, _, _, event in rows]
    assert types == ["run_started", "turn", "tool_start", "tool_result", "turn", "tool_start", "tool_result", "turn",
                     "run_stopped"], types
    seqs = {event["type"]: seq for seq, _, _, event in rows}
    assert seqs["run_started"] is None and seqs["tool_start"] is None and seqs["run_stopped"] == 7


def _address_of_this_machine() -> str | None:
    """An address of this machine that is not a loopback one (the route out), if it has one."""
    import ipaddress

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))  # nothing is sent: this only picks the route
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if ipaddress.ip_address(address).is_loopback or address == "0.0.0.0" else address


def test_over_a_network_address_each_commit_is_read_when_sent(
        provider: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """To a server reached over TCP (where a kill with an answer unread resets the connection),
    the same 11 statements, each answered before the next is sent, a commit's as soon as it is
    sent. The server listens on TCP and is reached at this machine's own non-loopback address,
    as a server on another machine would be."""
    from tests.pgcluster import Cluster, available

    missing = available()
    if missing:
        pytest.skip(missing)
    address = _address_of_this_machine()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with Cluster(tcp_port=port) as cluster:
        name = cluster.new_database().split("///")[1].split("?")[0]
        counts, rows = _counted_plan_run(cluster.url(name, host=address), provider, monkeypatch, tmp_path)
    assert sum(c[0] for c in counts) == 11, counts
    assert sum(c[1] for c in counts) == 11, counts
    assert [event["type"] for _, _, _, event in rows][-1] == "run_stopped"


def test_a_lease_length_in_the_environment_that_is_no_number_is_one_clear_line(pg_url: str) -> None:
    for bad in ("abc", "-1", "0", "nan"):
        proc = cli("runs", "--store", pg_url, runs_dir=None, env={"RUNNER_LEASE_S": bad})
        assert proc.returncode == 2, proc.stderr
        assert one_error(proc.stderr) == (f"error: $RUNNER_LEASE_S must be a lease length in seconds, at least 0.1; "
                                          f"got {bad!r}")
    assert cli("runs", "--store", pg_url, runs_dir=None, env={"RUNNER_LEASE_S": "2.5"}).returncode == 0


def test_a_killed_driver_not_yet_reaped_is_taken_over_at_once(pg_url: str, tmp_path: Path) -> None:
    """A driver killed with SIGKILL whose parent has not reaped it yet (a zombie) holds a
    lease that has not run out: a resume on the same machine sees the process is gone and
    takes the run over, instead of waiting out the lease."""
    import os
    import signal

    env = {**os.environ, "RUNNER_STORE": pg_url, "RUNNER_LEASE_S": "60"}
    driver = subprocess.Popen([sys.executable, "-m", "runner", "run", "--scenario", "slow", "--json"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = PostgresStore(pg_url)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            infos = store.list_runs()
            if infos and any(e.type == "tool_progress" for e in store.read_trace(infos[0].state.run_id)):
                break
            time.sleep(0.05)
        os.kill(driver.pid, signal.SIGKILL)  # not waited for: a zombie until the end of this test
        time.sleep(0.3)
        run_id = infos[0].state.run_id
        code, done = cli_json("resume", run_id, runs_dir=tmp_path / "unused", env={"RUNNER_STORE": pg_url})
        assert code == 0 and done["status"] == "completed", done
    finally:
        store.close()
        driver.wait(timeout=30)
