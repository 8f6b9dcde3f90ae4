"""The durability setting: "process" (the default) commits every transition to the
OS, which a SIGKILL cannot undo; "power" also flushes each commit to the disk. What each
setting does is checked where it happens: the flush calls a FileStore makes (counted by
wrapping `os.fsync`/`os.fdatasync`, the OS calls, never runner's code), the session setting
PostgreSQL commits with, and a real SIGKILL in the middle of a run at each setting.
The kill-anywhere cases of test_sigkill_resume.py run at the default setting.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from runner.scripted import ScriptedServer
from runner.store import FileStore, open_store
from tests.conftest import cli, cli_json, cli_process, drive, one_error, scripted_run


def _count_flushes(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    counts: Counter[str] = Counter()
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def counted(fd: int, _real: Any = real, _name: str = name) -> None:
            counts[_name] += 1
            _real(fd)

        monkeypatch.setattr(os, name, counted)
    return counts


def test_process_durability_never_flushes_and_power_flushes_every_commit(
    provider: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts = _count_flushes(monkeypatch)
    done = drive(scripted_run("plan"), provider, FileStore(tmp_path / "process"))
    assert done.status == "completed" and counts == Counter()

    done = drive(scripted_run("plan"), provider, FileStore(tmp_path / "power", durability="power"))
    assert done.status == "completed"
    # 7 commits (the new run, 3 replies, 2 tool results, the stop), flushed before each effect:
    # before each of the 3 paid model requests, and when the run stops (its lease released):
    # 4 flushes of the journal; the first also flushes the run's folder and the runs directory
    # (new names). Read-only tools are no effect: a reply and its tool result share a flush.
    # The snapshot written at creation (the new run's state again) is flushed once.
    assert counts["fdatasync"] == 4 and counts["fsync"] == 3
    assert done.seq == 7


def test_power_flushes_every_commit_before_the_effect_that_follows_it(
    provider_server: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`destructive`, auto-approved: list, delete (a tool that writes), answer. Before each
    model request and before the delete, every journal line written so far was flushed; one
    flush covers all the commits since the one before (coalesced), never one per commit.
    Flushes and the delete are seen by wrapping the OS calls (`os.fdatasync`, `os.unlink`)."""
    runs = tmp_path / "runs"
    flushes: list[tuple[int, int]] = []  # (journal bytes flushed, requests answered by then)
    deletes: list[tuple[int, int]] = []  # (journal bytes written, bytes flushed) at the delete
    real_fdatasync, real_unlink = os.fdatasync, os.unlink
    before = len(provider_server.requests)

    def fdatasync(fd: int) -> None:
        real_fdatasync(fd)
        flushes.append((os.fstat(fd).st_size, len(provider_server.requests) - before))

    def unlink(path: Any, *args: Any, **kw: Any) -> None:
        if str(path).endswith("access.log"):
            deletes.append((_journal_bytes(runs), flushes[-1][0] if flushes else 0))
        real_unlink(path, *args, **kw)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "unlink", unlink)
    done = drive(scripted_run("destructive", auto_approve=True), provider_server.base_url,
                 FileStore(runs, durability="power"))
    assert done.status == "completed" and done.answer == "Deleted access.log to free space.", done.reason
    assert len(provider_server.requests) - before == 3

    journal = (runs / done.run_id / "journal.jsonl").read_bytes()
    starts, pos = {}, 0  # turn number -> where the record of its reply starts (the bytes before the request)
    for line in journal.splitlines(keepends=True):
        record = json.loads(line.rsplit(b"\t", 1)[0])
        for event in record.get("events", []):
            if event["type"] == "turn":
                starts[event["turn"]] = pos
        pos += len(line)
    for turn, offset in starts.items():
        sent_after = [size for size, answered in flushes if answered == turn - 1]
        assert sent_after and sent_after[-1] == offset, f"request {turn}: journal flushed to {sent_after}, written to {offset}"
    assert len(deletes) == 1 and deletes[0][0] == deletes[0][1]  # the start mark was flushed before the delete
    sizes = [size for size, _ in flushes]
    assert sizes == sorted(set(sizes)) and sizes[-1] == len(journal)  # each flush had something new; the stop too
    assert len(flushes) == 5 and done.seq == 8  # 8 commits, 5 flushes: 3 requests, the delete, the stop


def _journal_bytes(runs: Path) -> int:
    (journal,) = runs.glob("*/journal.jsonl")
    return journal.stat().st_size


def test_the_setting_comes_from_the_flag_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert open_store(tmp_path).durability == "process"
    monkeypatch.setenv("RUNNER_DURABILITY", "power")
    assert open_store(tmp_path).durability == "power"
    assert open_store(tmp_path, durability="process").durability == "process"
    assert open_store(tmp_path, durability="Power").durability == "power"
    proc = cli("run", "--scenario", "plan", "--durability", "disk", runs_dir=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "--durability (or $RUNNER_DURABILITY) must be one of process, power; got 'disk'" in one_error(proc.stderr)


def test_a_run_whose_creation_was_killed_is_not_listed_and_hides_no_other(provider: str, tmp_path: Path) -> None:
    """A kill between creating the journal and writing its first line leaves an empty file:
    that run was never committed; `runs` lists the others."""
    store = FileStore(tmp_path)
    done = drive(scripted_run("plan"), provider, store)
    half = tmp_path / "20261201-000000-abcdef"
    half.mkdir()
    (half / "journal.jsonl").write_bytes(b"")
    (half / "lock").write_bytes(b"")
    assert [i.state.run_id for i in store.list_runs()] == [done.run_id] and store.problems == []


def test_postgres_commits_asynchronously_only_at_process_durability(pg_url: str) -> None:
    from runner.store.postgres import PostgresStore

    for durability, expected in (("process", "off"), ("power", "on")):
        store = PostgresStore(pg_url, durability=durability)  # type: ignore[arg-type]
        try:
            with store.pool.connection() as conn:
                row = conn.execute("SHOW synchronous_commit").fetchone()
            assert row is not None and row[0] == expected
        finally:
            store.close()


@pytest.mark.parametrize("durability", ["process", "power"])
def test_sigkill_mid_run_then_resume_at_each_setting(
    durability: str, provider_server: ScriptedServer, runs: Path,
) -> None:
    """A real SIGKILL right after the second reply is committed; the resumed run never asks
    for a recorded turn again and ends as an uninterrupted run does."""
    env = {"RUNNER_DURABILITY": durability, "RUNNER_CRASH_AT": "reply:2"}
    before = len(provider_server.requests)
    killed = cli_process("run", "--scenario", "plan", "--base-url", provider_server.base_url, runs_dir=runs, env=env)
    assert killed.returncode == -9
    (run_id,) = [p.name for p in runs.iterdir() if not p.name.startswith(".")]
    code, out = cli_json("resume", run_id, runs_dir=runs, env={"RUNNER_DURABILITY": durability})
    assert code == 0 and out["status"] == "completed" and out["turns"] == 3
    asked = Counter(turn for _, turn in provider_server.requests[before:])
    assert asked == {1: 1, 2: 1, 3: 1}
