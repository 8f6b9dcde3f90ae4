"""Benchmark: what a save costs with each run store, early and late in a run, and
the harness's overhead per turn with each store.

Part 1, save time per transition. One run of 100 turns, each turn two transitions as the loop
makes them (a model reply with a tool call, then the tool's result: ~1.2 KB of file text), each
committed with its trace event. Timed: the two saves of turn 1 and the two saves of turn 100,
per store; repeated `--reps` times with the stores interleaved round-robin. Stores:

    files (before, fsync)  the pre-issue-11 FileStore: the whole state re-serialised (indent=1),
                           written to a temp file, fsync, rename, then the trace line appended
    files            FileStore at the default durability ("process"): one journal line with
                     what changed, then the trace lines (no flush)
    postgres         PostgresStore, "process": one transaction (runs row, new items, events)
                     with synchronous_commit off (the server has it; not yet on its disk)
    files, power     FileStore, "power": the journal fdatasync'ed where the loop would flush it,
                     before the next model request: once per turn, with the tool result's save
                     (timed in a pass of its own)
    files, power (a flush per commit, as before)
                     the same store flushed after every save (2 flushes a turn), beside it
    postgres, power  PostgresStore, "power": synchronous_commit on (each commit waits for the
                     server's WAL flush; the cluster runs with fsync on)

Part 2, harness overhead per turn. The 3-turn `plan` against the scripted provider (separate
process, zero latency), round-robin with a bare httpx loop making the same three calls (the
floor; see scripts/bench_overhead.py): overhead = (median harness - median bare) / 3 turns,
for the harness in memory, on the FileStore, and on PostgreSQL; and the write-ahead log bytes
PostgreSQL wrote per turn (every statement of a run: claim, create, events, saves, release).

PostgreSQL is a throwaway cluster on a Unix socket (tests/pgcluster.py), fsync on. Prints a
Markdown report (with the load average: the machine is shared) and writes runs/bench/store.md
and store.json.

    python scripts/bench_store.py [--reps 15] [--runs 40] [--warmup 5]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runner.client import new_http_client  # noqa: E402
from runner.endpoints import Endpoint  # noqa: E402
from runner.harness import drive  # noqa: E402
from runner.scripted import scripted_provider  # noqa: E402
from runner.state import FunctionCall, Message, RunConfig, RunState, ToolCall, ToolRun, TurnRecord, new_run  # noqa: E402
from runner.store import FileStore, RunStore  # noqa: E402
from runner.store.base import event_line  # noqa: E402
from runner.store.postgres import PostgresStore  # noqa: E402
from runner.trace import ToolResult, TurnEvent, _Event  # noqa: E402
from tests.pgcluster import Cluster, available  # noqa: E402

TURNS = 100
PER_COMMIT = "(a flush per commit, as before)"
"""Suffix of a store variant that flushes after every save (how `power` worked before a flush
covered every commit up to the next effect)."""
FILE_TEXT = (REPO / "tasks" / "workspace" / "errors.log").read_text()[:1200]


def _bench_overhead() -> Any:
    spec = importlib.util.spec_from_file_location("bench_overhead", REPO / "scripts" / "bench_overhead.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_overhead"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class BeforeFiles:
    """The FileStore's save as it was before the journal (full state, temp file, fsync, rename;
    then one trace line appended and flushed), kept here as the baseline."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def create(self, state: RunState) -> None:
        self.save(state, [])

    def save(self, state: RunState, events: list[_Event]) -> None:
        folder = self.root / state.run_id
        folder.mkdir(parents=True, exist_ok=True)
        tmp, target = folder / "state.json.tmp", folder / "state.json"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, state.model_dump_json(indent=1).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        with (folder / "trace.jsonl").open("a", encoding="utf-8") as trace:
            for event in events:
                trace.write(event_line(event) + "\n")
                trace.flush()


def _reply(state: RunState, turn: int) -> list[_Event]:
    call = ToolCall(id=f"c{turn}", function=FunctionCall(name="read_file", arguments='{"path": "errors.log"}'))
    state.messages.append(Message(role="assistant", content="", tool_calls=[call]))
    prompt = 250 + 320 * turn
    state.turns, state.prompt_tokens, state.completion_tokens = turn, state.prompt_tokens + prompt, state.completion_tokens + 20
    state.cost_usd += (prompt * 2 + 20 * 12) / 1e6
    state.per_turn.append(TurnRecord(turn=turn, prompt_tokens=prompt, completion_tokens=20, cost_usd=0.0007, ms=1.0))
    return [TurnEvent(runId=state.run_id, turn=turn, promptTokens=prompt, completionTokens=20,
                      totalTokens=prompt + 20, costUsd=state.cost_usd, finish="tool_calls", ms=1.0)]


def _result(state: RunState, turn: int) -> list[_Event]:
    state.messages.append(Message(role="tool", tool_call_id=f"c{turn}", name="read_file", content=FILE_TEXT))
    state.tool_runs.append(ToolRun(call_id=f"c{turn}", tool_name="read_file", signature="read_file:x", ok=True, ms=0.1))
    return [ToolResult(runId=state.run_id, toolName="read_file", callId=f"c{turn}", ms=0.1, ok=True)]


def written_bytes(store: RunStore | BeforeFiles, run_id: str) -> int:
    """Bytes on disk for the run so far: the files under its folder (FileStores), or the
    database's write-ahead log position (PostgreSQL: every change is written there first)."""
    if isinstance(store, BeforeFiles):
        folder = store.root / run_id
        return sum(p.stat().st_size for p in folder.iterdir()) if folder.exists() else 0
    if isinstance(store, FileStore):
        folder = store.run_dir(run_id)
        return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    with store.pool.connection() as conn:  # type: ignore[attr-defined]
        row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')").fetchone()
    return int(row[0])


def one_run(kind: str, store: RunStore | BeforeFiles) -> dict[str, list[float]]:
    """Drive one 100-turn run of saves; returns ms per save at turn 1, at turn 100, and all,
    and the bytes each save at turn 1 and turn 100 added (the "before" store rewrites a whole
    file: its bytes are those of the new state file plus the trace line)."""
    state = new_run("Read errors.log again and again.", RunConfig(endpoint=Endpoint(model="scripted/bench")))
    lease = None
    if isinstance(store, BeforeFiles):
        store.create(state)
    else:
        lease = store.create(state, owner="bench")
    out: dict[str, list[float]] = {"turn 1": [], "turn 100": [], "all": [], "bytes 1": [], "bytes 100": []}
    for turn in range(1, TURNS + 1):
        for step in (_reply, _result):
            events = step(state, turn)
            before = written_bytes(store, state.run_id) if turn in (1, TURNS) else 0
            if isinstance(store, BeforeFiles) and turn in (1, TURNS):
                before -= (store.root / state.run_id / "state.json").stat().st_size  # replaced, not added
            began = time.perf_counter()
            if isinstance(store, BeforeFiles):
                store.save(state, events)
            else:
                store.save(state, events, lease)
                if step is _result or kind.endswith(PER_COMMIT):  # the loop asks the model next: an effect
                    assert lease is not None
                    store.sync(lease)
            ms = (time.perf_counter() - began) * 1000
            out["all"].append(ms)
            if turn in (1, TURNS):
                out[f"turn {turn}"].append(ms)
                out[f"bytes {turn}"].append(written_bytes(store, state.run_id) - before)
    if lease is not None and not isinstance(store, BeforeFiles):
        store.release(lease)
    return out


def save_bench(stores: dict[str, RunStore | BeforeFiles], reps: int) -> dict[str, dict[str, list[float]]]:
    names = list(stores)
    times: dict[str, dict[str, list[float]]] = {
        n: {"turn 1": [], "turn 100": [], "all": [], "bytes 1": [], "bytes 100": []} for n in names}
    one_run(names[0], stores[names[0]])  # warm-up (imports, pool, page cache)
    for i in range(reps):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            for key, values in one_run(name, stores[name]).items():
                times[name][key] += values
    return times


async def overhead_bench(base_url: str, stores: dict[str, RunStore | None], runs: int, warmup: int) -> dict[str, list[float]]:

    bo = _bench_overhead()
    replay = await bo.make_replay(base_url)

    wal_bytes: dict[str, list[int]] = {}

    async def harness_run(store: RunStore | None) -> float:
        state = bo.fresh_state(base_url)
        wal = written_bytes(store, "") if isinstance(store, PostgresStore) else None
        began = time.perf_counter()
        state = await drive(state, base_url, store, http=shared)
        ms = (time.perf_counter() - began) * 1000
        if wal is not None:
            assert store is not None
            wal_bytes.setdefault(store.url, []).append(written_bytes(store, "") - wal)
        assert state.status == "completed" and [t.prompt_tokens for t in state.per_turn] == replay.prompt_tokens
        return ms

    async with new_http_client(base_url) as shared:  # one kept-alive client, as a worker keeps
        async def bare() -> float:
            began = time.perf_counter()
            usage = await bo.bare_loop(shared, base_url, replay)
            assert usage == replay.prompt_tokens
            return (time.perf_counter() - began) * 1000

        variants: dict[str, Callable[[], Awaitable[float]]] = {"bare": bare}
        for name, store in stores.items():
            variants[f"harness ({name})"] = functools.partial(harness_run, store)
        times: dict[str, list[float]] = await bo.rounds(variants, runs, warmup)
    for url, values in wal_bytes.items():
        name = next(n for n, st in stores.items() if st is not None and st.url == url)
        times[f"wal bytes ({name})"] = [float(v) for v in values]
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=15, help="100-turn runs per store (part 1)")
    parser.add_argument("--runs", type=int, default=40, help="timed rounds (part 2)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench")
    args = parser.parse_args(argv)
    missing = available()
    if missing:
        print(f"bench_store: {missing}", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    # The runs folders go where the reports do, as in the other benchmarks: on this VM a file
    # created under /tmp (a folder tests create and delete in all day) took 0.2-0.6 ms, against
    # ~8 us anywhere else on the same disk, and that is the disk's figure, not the store's.
    with tempfile.TemporaryDirectory(prefix="bench-store-", dir=args.out) as tmp, Cluster(fsync=True) as pg:
        pg_store, pg_power = PostgresStore(pg.new_database()), PostgresStore(pg.new_database(), durability="power")
        stores: dict[str, RunStore | BeforeFiles] = {
            "files (before, fsync)": BeforeFiles(Path(tmp) / "before"), "files": FileStore(Path(tmp) / "files"),
            "postgres": pg_store}
        saves = save_bench(stores, args.reps)
        # apart: disk flushes slow every file operation near them
        saves |= save_bench({"files, power": FileStore(Path(tmp) / "files-power", durability="power"),
                             f"files, power {PER_COMMIT}": FileStore(Path(tmp) / "files-power-each", durability="power"),
                             "postgres, power": pg_power}, args.reps)
        with scripted_provider() as base_url:
            pg_harness = PostgresStore(pg.new_database())
            overhead = asyncio.run(overhead_bench(base_url, {
                "memory": None, "files": FileStore(Path(tmp) / "harness"), "postgres": pg_harness},
                args.runs, args.warmup))
            pg_harness.close()
        pg_store.close()
        pg_power.close()
    load_after = os.getloadavg()

    med = statistics.median
    lines = ["# Run store benchmark", "",
             f"{platform.node()}, Python {platform.python_version()}, {os.cpu_count()} CPUs; "
             f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after (shared machine: noisy).",
             f"Command: `python scripts/bench_store.py --reps {args.reps} --runs {args.runs} --warmup {args.warmup}`", "",
             f"## Save time per transition (median ms over {args.reps} runs x 2 saves; the state and its trace events)", "",
             "| store | turn 1 ms | turn 100 ms | turn 100 / turn 1 | mean ms, all 200 saves "
             "| bytes per save, turn 1 | bytes per save, turn 100 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    table: dict[str, Any] = {}
    for name, t in saves.items():
        first, last = med(t["turn 1"]), med(t["turn 100"])
        b1, b100 = med(t["bytes 1"]), med(t["bytes 100"])
        table[name] = {"turn1_ms": first, "turn100_ms": last, "ratio": last / first,
                       "mean_all_ms": statistics.fmean(t["all"]), "n": len(t["turn 1"]),
                       "bytes_turn1": b1, "bytes_turn100": b100}
        lines.append(f"| {name} | {first:.3f} | {last:.3f} | {last / first:.2f}x | {statistics.fmean(t['all']):.3f} "
                     f"| {b1:,.0f} | {b100:,.0f} |")
    bare = med(overhead["bare"])
    lines += ["", f"## Harness overhead per turn over a bare httpx loop (3-turn `plan`, median of {args.runs} rounds)", "",
              "| variant | median ms per run | overhead ms per turn |", "|---|---:|---:|",
              f"| bare httpx loop (floor) | {bare:.2f} | - |"]
    over: dict[str, Any] = {"bare_ms": bare}
    for name, values in overhead.items():
        if name == "bare" or name.startswith("wal bytes"):
            continue
        per_turn = (med(values) - bare) / 3
        over[name] = {"median_ms": med(values), "overhead_ms_per_turn": per_turn}
        lines.append(f"| {name} | {med(values):.2f} | {per_turn:.3f} |")
    for name, values in overhead.items():
        if name.startswith("wal bytes"):
            per_turn_bytes = med(values) / 3
            over[name] = {"median_bytes_per_run": med(values), "bytes_per_turn": per_turn_bytes}
            lines.append(f"\nPostgreSQL write-ahead log per turn ({name.removeprefix('wal bytes ')}, every statement "
                         f"of a run, median of {len(values)} runs / 3 turns): **{per_turn_bytes:,.0f} bytes**")
    lines += ["", "Bytes: what one save adds on disk (files: the run's folder; \"before\": the new state file "
              "plus the trace line; postgres: write-ahead log bytes, all of the cluster's writes). "
              "Times of the rows that flush (before, power) are dominated by the flush on this shared disk and vary "
              "run to run; bytes do not."]
    report = "\n".join(lines) + "\n"
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "store.md").write_text(report)
    (args.out / "store.json").write_text(json.dumps({"saves": table, "overhead": over, "load_before": load_before,
                                                     "load_after": load_after, "args": vars(args) | {"out": str(args.out)}},
                                                    indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
