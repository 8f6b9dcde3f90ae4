"""Benchmark: what persistence costs at turn 100 of the runaway scenario.

`runaway` calls list_files every turn and never answers, so the transcript grows by two
messages a turn. Each run goes to --turns (default 100) + 1 model calls against the scripted
provider (its own process, loopback, zero latency), durable (a runs directory at the default
durability, "process": every transition committed to the OS) and in memory (runs=None),
alternating, --reps times each; then --reps runs at durability "power" (every commit
fdatasync'ed), timed apart because disk flushes slow every file operation near them.

Per turn, from timers wrapped around runner's functions during these runs (benchmark only):

    turn ms         start of model call k to start of model call k+1 (everything the harness
                    does for turn k: the call, the tool run, the saves, the trace)
    provider ms     time inside ChatClient.chat for call k
    persistence ms  time inside the store and the trace writer during turn k, counting only
                    the outermost of nested calls: `store.save` and `Tracer.emit` where the
                    store is a module of functions (main today); every public method of
                    `runner.store.FileStore` and any `Tracer.emit` where the store is a class

Headline (target <= 10%): persistence ms / turn ms at turn --turns, median over the durable
reps, with the same figure over turns 91-100 and the in-memory run's turn time beside it
(durable - in memory = what persistence costs, measured the other way). The script runs
against whatever store is on the branch.

    python scripts/bench_runaway.py [--turns 100] [--reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from runner import harness, store
from runner.client import ChatClient
from runner.endpoints import Endpoint
from runner.scripted import PROMPTS, scripted_provider
from runner.state import Limits, RunConfig, new_run
from runner.store import FileStore
from runner.trace import Tracer

REPO = Path(__file__).resolve().parent.parent
TARGET_SHARE = 0.10


class Clock:
    """Intervals recorded by the wrappers: model calls and (outermost) persistence calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []
        self.persist: list[tuple[float, float]] = []
        self.depth = 0


def persistence_targets() -> list[tuple[Any, str]]:
    out: list[tuple[Any, str]] = [(Tracer, "emit")] if hasattr(Tracer, "emit") else []
    file_store = getattr(store, "FileStore", None)
    if file_store is not None:
        out += [(file_store, a) for a, fn in vars(file_store).items() if callable(fn) and not a.startswith("_")]
    elif hasattr(store, "save"):
        out.append((store, "save"))
    return out


@contextlib.contextmanager
def timed(clock: Clock) -> Iterator[None]:
    saved: list[tuple[Any, str, Any]] = []

    def wrap_persist(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            clock.depth += 1
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                clock.depth -= 1
                if clock.depth == 0:
                    clock.persist.append((began, time.perf_counter()))
        return wrapper

    original_chat = ChatClient.chat

    @functools.wraps(original_chat)
    async def chat(self: ChatClient, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await original_chat(self, *args, **kwargs)
        finally:
            clock.calls.append((began, time.perf_counter()))

    saved.append((ChatClient, "chat", original_chat))
    ChatClient.chat = chat  # type: ignore[method-assign]
    for owner, attr in persistence_targets():
        original = getattr(owner, attr)
        if asyncio.iscoroutinefunction(original):
            continue  # async store methods would need an async wrapper; none on the branches so far
        saved.append((owner, attr, original))
        setattr(owner, attr, wrap_persist(original))
    try:
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


def per_turn(clock: Clock) -> list[dict[str, float]]:
    """turn k (1-based) for every k that has a following call: turn, provider, persistence ms."""
    rows = []
    for k in range(len(clock.calls) - 1):
        start, end = clock.calls[k][0], clock.calls[k + 1][0]
        persist = sum(min(b, end) - max(a, start) for a, b in clock.persist if b > start and a < end)
        rows.append({"turn": k + 1, "turn_ms": (end - start) * 1000,
                     "provider_ms": (clock.calls[k][1] - clock.calls[k][0]) * 1000, "persist_ms": persist * 1000})
    return rows


async def one_run(url: str, runs: Path | FileStore | None, turns: int) -> list[dict[str, float]]:
    state = new_run(PROMPTS["runaway"], RunConfig(endpoint=Endpoint(model="scripted/runaway", base_url=url), limits=Limits(max_turns=turns + 1)))
    clock = Clock()
    with timed(clock):
        state = await harness.drive(state, url, runs)
    assert state.status == "max_turns_exceeded" and state.turns == turns + 1, (state.status, state.turns)
    return per_turn(clock)


def summarize(runs: list[list[dict[str, float]]], turn: int) -> dict[str, float]:
    at = [r[turn - 1] for r in runs]
    window = [row for r in runs for row in r[turn - 10:turn]]
    med = statistics.median
    return {
        "turn_ms": med(x["turn_ms"] for x in at), "provider_ms": med(x["provider_ms"] for x in at),
        "persist_ms": med(x["persist_ms"] for x in at),
        "share": med(x["persist_ms"] / x["turn_ms"] for x in at),
        "share_of_harness": med(x["persist_ms"] / max(x["turn_ms"] - x["provider_ms"], 1e-9) for x in at),
        "window_share": med(x["persist_ms"] / x["turn_ms"] for x in window),
        "window_turn_ms": med(x["turn_ms"] for x in window),
        "turn1_turn_ms": med(r[0]["turn_ms"] for r in runs), "turn1_persist_ms": med(r[0]["persist_ms"] for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="runaway-", dir=args.out))
    tempfile.tempdir = str(scratch)  # in-memory runs copy the workspace to a temp folder: keep it here
    durable: list[list[dict[str, float]]] = []
    power: list[list[dict[str, float]]] = []
    memory: list[list[dict[str, float]]] = []
    try:
        with scripted_provider() as url:
            asyncio.run(one_run(url, None, 3))  # warm-up: provider loaded, imports done
            load_before = os.getloadavg()[0]
            for i in range(args.reps):
                durable.append(asyncio.run(one_run(url, scratch / f"runs{i}", args.turns)))
                memory.append(asyncio.run(one_run(url, None, args.turns)))
            for i in range(args.reps):  # apart: its disk flushes slow every file operation near them
                power.append(asyncio.run(one_run(url, FileStore(scratch / f"power{i}", durability="power"), args.turns)))
            load_after = os.getloadavg()[0]
    finally:
        tempfile.tempdir = None
        shutil.rmtree(scratch, ignore_errors=True)
    d, m, pw = summarize(durable, args.turns), summarize(memory, args.turns), summarize(power, args.turns)
    verdict = "meets" if d["share"] <= TARGET_SHARE else "MISSES"
    wrapped = ", ".join(f"{getattr(owner, '__name__', owner)}.{attr}" for owner, attr in persistence_targets())
    text = "\n".join([
        "# Persistence at turn 100 of `runaway`", "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; runner from "
        f"`{Path(harness.__file__).parent}`; load average (1 min) before / after: {load_before:.2f} / {load_after:.2f}",
        f"- {args.reps} durable and {args.reps} in-memory runs of {args.turns + 1} model calls, alternating; "
        f"persistence = time inside {wrapped}",
        "",
        f"**Turn {args.turns}: persistence {d['persist_ms']:.2f} ms of a {d['turn_ms']:.2f} ms turn = "
        f"{d['share']:.1%}** (target ≤ {TARGET_SHARE:.0%}: {verdict}); of the turn minus the model call "
        f"({d['turn_ms'] - d['provider_ms']:.2f} ms): {d['share_of_harness']:.1%}", "",
        "| | turn 1 ms | turn 1 persistence ms | turn N ms | provider ms (turn N) | persistence ms (turn N) | "
        "share at N | share, turns N-9..N |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| durable | {d['turn1_turn_ms']:.2f} | {d['turn1_persist_ms']:.2f} | {d['turn_ms']:.2f} | {d['provider_ms']:.2f} | "
        f"{d['persist_ms']:.2f} | {d['share']:.1%} | {d['window_share']:.1%} |",
        f"| durable, power (fsync; timed after the others) | {pw['turn1_turn_ms']:.2f} | {pw['turn1_persist_ms']:.2f} | "
        f"{pw['turn_ms']:.2f} | {pw['provider_ms']:.2f} | {pw['persist_ms']:.2f} | {pw['share']:.1%} | {pw['window_share']:.1%} |",
        f"| in memory | {m['turn1_turn_ms']:.2f} | {m['turn1_persist_ms']:.2f} | {m['turn_ms']:.2f} | {m['provider_ms']:.2f} | "
        f"{m['persist_ms']:.2f} | {m['share']:.1%} | {m['window_share']:.1%} |",
        "",
        f"Durable − in memory at turn {args.turns}: {d['turn_ms'] - m['turn_ms']:.2f} ms (the same cost, measured "
        "by difference).", "",
    ])
    (args.out / "runaway.md").write_text(text, encoding="utf-8")
    (args.out / "runaway.json").write_text(json.dumps({"durable": durable, "power": power, "memory": memory, "summary": {
        "durable": d, "power": pw, "memory": m}}, indent=1), encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
