"""Benchmark: the harness's own overhead per turn over a bare httpx loop,
at each durability setting, beside the in-memory figure.

Workload: the 3-turn `plan` scenario (list_files -> read_file errors.log -> answer) against the
scripted provider on loopback with zero latency. Variants, measured side by side in one
process and one event loop, round-robin (the order rotates every round), after a warm-up, in
three phases, each beside its own `bare` (`PHASES`: disk flushes and a connection per run slow
their neighbours, so harness_power and the client-per-run pair are timed apart):

    bare                the floor: one long-lived `httpx.AsyncClient` (kept-alive connection)
                        making the same three POST /v1/chat/completions with the same messages
                        and tool schemas the harness sends; tool results are replayed.
    bare_fresh          the same loop with a new client (and connection) per run.
    harness             `runner.harness.drive(state, url, FileStore(dir), http=shared)`: the
                        default durability, "process": every transition committed to the OS
                        before the next one starts (survives a kill of the process, SIGKILL
                        included), the trace line written with it. `shared` is one
                        `runner.client.new_http_client()` for all runs, as a worker or the suite
                        keeps one.
    harness_power       the same with `FileStore(dir, durability="power")`: the commits are
                        fdatasync'ed before each effect (a model request, a tool that may
                        write, the run's end; one flush covers every commit since the last, and
                        folders are fsync'ed when a file is created), so what the run did also
                        survives an OS crash or power loss.
    harness_mem         `execute(..., None, http=shared)`: no store, no trace (persistence off).
    harness_own_client  the default store with no shared client: each run opens and closes its
                        own (what a one-off `runner run` does); compared with bare_fresh.

Headline: per-turn overhead = (median harness - median bare) / 3, ms; target <= 0.7 ms. Every
run is verified: the provider counted the same per-turn prompt tokens for every variant (the
same messages and tools went over the wire), and each harness run completed in 3 turns.
The provider runs as its own process by default (`runner.scripted.scripted_provider()`), so its
CPU does not share the client's GIL; `--provider inprocess` serves it from a thread instead.
After the timed loop, an instrumented pass (timing wrappers, never used for the headline)
says where the harness's time goes, and micro-benchmarks time the pieces.

Writes runs/bench/overhead.md and runs/bench/overhead.json (see --out) and prints the Markdown.

    python scripts/bench_overhead.py [--runs 50] [--warmup 5] [--provider subprocess|inprocess|both]
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
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import httpx

import runner
from runner import catalog, harness, scripted, tools
from runner import client as client_mod
from runner.client import new_http_client
from runner.endpoints import Endpoint
from runner.scripted import PROMPTS, ScriptedServer
from runner.state import RunConfig, RunState, new_run
from runner.store import FileStore, RunStore

REPO = Path(__file__).resolve().parent.parent
SCENARIO = "scripted/plan"
TURNS = 3
TARGET_MS_PER_TURN = 0.7
HEADERS = {"Authorization": "Bearer sk-local"}  # what ChatClient sends
HEADLINE = "harness vs bare (durable against a kill: the default)"


@dataclass
class Replay:
    """What the bare loop sends: the first messages, the tool schemas, and the tool result
    message for each call id (all as the harness puts them on the wire)."""

    first: list[dict[str, Any]]
    tool_schemas: list[dict[str, Any]]
    results: dict[str, dict[str, Any]]
    prompt_tokens: list[int]
    """Per-turn prompt tokens the provider counted for the harness's requests."""


def fresh_state(base_url: str) -> RunState:
    return new_run(PROMPTS["plan"], RunConfig(endpoint=Endpoint(model=SCENARIO, base_url=base_url)))


async def make_replay(base_url: str) -> Replay:
    """Run the harness once in memory and keep what the bare loop needs to send the same calls."""
    state = await harness.drive(fresh_state(base_url), base_url, None)
    assert state.status == "completed" and state.turns == TURNS, (state.status, state.reason)
    first = [m.to_api() for m in state.messages[:1]]
    results = {m.tool_call_id or "": m.to_api() for m in state.messages if m.role == "tool"}
    schemas = [t.schema() for t in catalog.build(state.config)]
    return Replay(first, schemas, results, [t.prompt_tokens for t in state.per_turn])


async def bare_loop(http: httpx.AsyncClient, base_url: str, replay: Replay) -> list[int]:
    """The floor: three POSTs, append each reply (content null -> "" as the harness sends it)
    and the replayed tool results. Returns the per-turn prompt tokens the provider counted."""
    messages = list(replay.first)
    usage = []
    for _ in range(TURNS):
        body = {"model": SCENARIO, "messages": messages, "temperature": 0, "seed": 0,
                "tools": replay.tool_schemas}
        response = await http.post(base_url + "/chat/completions", json=body, headers=HEADERS)
        response.raise_for_status()
        data = response.json()
        usage.append(data["usage"]["prompt_tokens"])
        message = data["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        if not calls:
            break
        messages = [*messages, {**message, "content": message.get("content") or ""},
                    *(replay.results[c["id"]] for c in calls)]
    return usage


class Bench:
    """Holds what every variant needs; `variants()` maps each name to a one-run coroutine
    function returning its wall ms."""

    def __init__(self, base_url: str, replay: Replay, scratch: Path, shared: httpx.AsyncClient) -> None:
        self.base_url, self.replay, self.scratch, self.shared = base_url, replay, scratch, shared
        self.stores = {"harness": FileStore(scratch / "process"),
                       "harness_power": FileStore(scratch / "power", durability="power"),
                       "harness_own_client": FileStore(scratch / "own-client")}

    async def _bare(self, fresh: bool) -> float:
        began = time.perf_counter()
        if fresh:
            async with httpx.AsyncClient(verify=False) as http:
                usage = await bare_loop(http, self.base_url, self.replay)
        else:
            usage = await bare_loop(self.shared, self.base_url, self.replay)
        ms = (time.perf_counter() - began) * 1000
        assert usage == self.replay.prompt_tokens, (usage, self.replay.prompt_tokens)
        return ms

    async def _harness(self, store: RunStore | None, http: httpx.AsyncClient | None) -> float:
        state = fresh_state(self.base_url)
        began = time.perf_counter()
        state = await harness.drive(state, self.base_url, store, http=http)
        ms = (time.perf_counter() - began) * 1000
        assert state.status == "completed" and state.turns == TURNS, (state.status, state.reason)
        assert [t.prompt_tokens for t in state.per_turn] == self.replay.prompt_tokens
        return ms

    def variants(self) -> dict[str, Callable[[], Awaitable[float]]]:
        h = functools.partial
        return {
            "bare": h(self._bare, False),
            "bare_fresh": h(self._bare, True),
            "harness": h(self._harness, self.stores["harness"], self.shared),
            "harness_mem": h(self._harness, None, self.shared),
            "harness_own_client": h(self._harness, self.stores["harness_own_client"], None),
            "harness_power": h(self._harness, self.stores["harness_power"], self.shared),
        }


PHASES: dict[str, tuple[str, ...]] = {
    "": ("bare", "harness", "harness_mem"),
    "power": ("bare", "harness", "harness_power"),
    "client": ("bare", "bare_fresh", "harness_own_client"),
}
"""Variants timed together, each phase beside its own `bare`. Apart because neighbours change
each other's times on this 2-core machine: harness_power's disk flushes slow every file
operation near them (ext4 journal commits), and a client per run makes the provider accept
and tear down a connection per run. In one round with all of them, `harness` measured
~0.3 ms per turn more. A variant of a later phase is named `<name>@<phase>`."""


async def round_robin(bench: Bench, runs: int, warmup: int) -> dict[str, list[float]]:
    """Per phase (`PHASES`): `warmup` untimed rounds, then `runs` rounds; each round runs every
    variant of the phase once, in an order rotated by one each round so no variant always
    follows the same neighbour. Returns ms per run by variant name."""
    fns = bench.variants()
    times: dict[str, list[float]] = {}
    for phase, names in PHASES.items():
        for name, values in (await rounds({name: fns[name] for name in names}, runs, warmup)).items():
            times[name if name not in times else f"{name}@{phase}"] = values
    return times


async def rounds(fns: dict[str, Callable[[], Awaitable[float]]], runs: int, warmup: int) -> dict[str, list[float]]:
    """`warmup` untimed rounds, then `runs` timed ones; each round awaits every function once
    (each returns its run's ms), the order rotated by one per round. Returns ms by name."""
    names = list(fns)
    times: dict[str, list[float]] = {v: [] for v in names}
    for i in range(warmup + runs):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            ms = await fns[name]()
            if i >= warmup:
                times[name].append(ms)
    return times


def stats(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def overhead(times: dict[str, list[float]], base: str, variant: str) -> dict[str, float]:
    """Per-turn overhead of `variant` over `base`: (median - median) / 3, and the min/median/max
    of the paired per-round differences / 3 (the spread of the same quantity)."""
    paired = [(b - a) / TURNS for a, b in zip(times[base], times[variant])]
    return {"per_turn_ms": (statistics.median(times[variant]) - statistics.median(times[base])) / TURNS,
            "paired_min": min(paired), "paired_median": statistics.median(paired), "paired_max": max(paired)}


# --- where the harness's time goes --------------------------------------------------------

PARTS: dict[str, tuple[Any, str]] = {
    # label: (owner, attribute), wrapped with a timer during the instrumented pass only
    "HTTP round trip (ChatClient._post: httpx send, wait, JSON decode)": (client_mod.ChatClient, "_post"),
    "request messages (client._request_messages)": (client_mod, "_request_messages"),
    "reply parsing (client._parse_choice)": (client_mod, "_parse_choice"),
    "client view (ChatClient.__init__, shared httpx client)": (client_mod.ChatClient, "__init__"),
    "create the run (FileStore.create: folder, lock, trace, first journal line)": (FileStore, "create"),
    "saves (FileStore.save: delta, journal line, trace lines)": (FileStore, "save"),
    "trace lines with no state change (FileStore.emit)": (FileStore, "emit"),
    "release (FileStore.release)": (FileStore, "release"),
    "workspace lookup (FileStore.existing_workspace)": (FileStore, "existing_workspace"),
    "tool runs (Tool.run)": (tools.Tool, "run"),
    "tool argument parsing (Tool.parse)": (tools.Tool, "parse"),
    "tool catalog (catalog.build)": (catalog, "build"),
}
REST = "rest (the loop's bookkeeping, race() per model call, pydantic records, events)"
TOTAL = "= harness run, instrumented (median)"


@contextlib.contextmanager
def instrumented(totals: dict[str, list[float]]) -> Iterator[None]:
    """Wrap each PARTS function with a timer adding [ms, calls] into `totals` (restored on
    exit). Benchmark-only; each wrapper adds about a microsecond per call."""
    saved = []
    for label, (owner, attr) in PARTS.items():
        original = getattr(owner, attr)
        saved.append((owner, attr, original))
        setattr(owner, attr, _timed(original, totals.setdefault(label, [0.0, 0])))
    try:
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


def _timed(fn: Callable[..., Any], cell: list[float]) -> Callable[..., Any]:
    if asyncio.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                cell[0] += (time.perf_counter() - began) * 1000
                cell[1] += 1
        return awrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            cell[0] += (time.perf_counter() - began) * 1000
            cell[1] += 1
    return wrapper


async def breakdown(bench: Bench, runs: int) -> dict[str, dict[str, float]]:
    """Per part: median ms per run and calls per run over `runs` instrumented runs of the
    headline variant; REST is the wall time not inside any part."""
    run = bench.variants()["harness"]
    per_run: dict[str, list[float]] = {label: [] for label in PARTS}
    calls: dict[str, int] = {}
    rest, walls = [], []
    for _ in range(runs):
        totals: dict[str, list[float]] = {}
        with instrumented(totals):
            wall = await run()
        for label, (ms, n) in totals.items():
            per_run[label].append(ms)
            calls[label] = int(n)
        walls.append(wall)
        rest.append(wall - sum(ms for ms, _ in totals.values()))
    out = {label: {"ms": statistics.median(v), "calls": calls[label]} for label, v in per_run.items() if calls[label]}
    out[REST] = {"ms": statistics.median(rest), "calls": 0}
    out[TOTAL] = {"ms": statistics.median(walls), "calls": 0}
    return out


def _median_us(fn: Callable[[], object], reps: int) -> float:
    samples = []
    for _ in range(reps):
        began = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - began) * 1e6)
    return statistics.median(samples)


async def _median_us_async(fn: Callable[[], Awaitable[object]], reps: int) -> float:
    samples = []
    for _ in range(reps):
        began = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - began) * 1e6)
    return statistics.median(samples)


async def micro(folder: Path, reps: int = 200) -> dict[str, float]:
    """Median µs of the pieces the variants differ by, on this machine's disk."""
    from runner.cancel import CancelToken, race

    folder.mkdir(parents=True, exist_ok=True)
    line = b'{"seq":2,"trace_at":0,"rest":{},"added":{},"start":{},"events":[]}' + b" " * 1900 + b"\n"
    fd = os.open(folder / "journal.bench", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    copies = iter(range(10**6))

    def append_flushed() -> None:
        os.write(fd, line)
        os.fdatasync(fd)

    sync: dict[str, tuple[Callable[[], object], int]] = {
        "append a 2 KB journal line (durability process)": (lambda: os.write(fd, line), reps),
        "append a 2 KB journal line + fdatasync (durability power)": (append_flushed, reps),
        "copy the 3-file task workspace (shutil.copytree)": (
            lambda: shutil.copytree(harness.workspace_template(), folder / f"ws{next(copies)}"), 50),
        "httpx.AsyncClient(verify=False) (a client per run)": (lambda: httpx.AsyncClient(verify=False), reps),
    }
    out = {label: _median_us(fn, n) for label, (fn, n) in sync.items()}
    os.close(fd)
    out["asyncio.to_thread(no-op) (what a blocking tool's thread hop costs)"] = await _median_us_async(
        lambda: asyncio.to_thread(lambda: None), reps)
    out["race(no-op coroutine, token) (per model call)"] = await _median_us_async(
        lambda: race(asyncio.sleep(0), CancelToken()), reps)
    return out


# --- driving it ---------------------------------------------------------------------------

@contextlib.contextmanager
def provider(kind: str) -> Iterator[str]:
    if kind == "subprocess":
        with scripted.scripted_provider() as url:
            yield url
    else:
        with ScriptedServer() as server:
            yield server.base_url


async def measure(base_url: str, runs: int, warmup: int, scratch: Path, instrumented_runs: int) -> dict[str, Any]:
    replay = await make_replay(base_url)
    async with new_http_client(base_url) as shared:
        bench = Bench(base_url, replay, scratch, shared)
        load_before = os.getloadavg()[0]
        times = await round_robin(bench, runs, warmup)
        load_after = os.getloadavg()[0]
        parts = await breakdown(bench, instrumented_runs)
    return {
        "times_ms": times,
        "stats_ms": {v: stats(t) for v, t in times.items()},
        "overhead": {
            HEADLINE: overhead(times, "bare", "harness"),
            "harness_power vs bare (durable against power loss; its own phase)": overhead(
                times, "bare@power", "harness_power"),
            "harness_mem vs bare (in memory)": overhead(times, "bare", "harness_mem"),
            "harness_own_client vs bare_fresh (a client per run on both sides; its own phase)": overhead(
                times, "bare_fresh", "harness_own_client"),
            "persistence, kill-safe: harness - harness_mem": overhead(times, "harness_mem", "harness"),
            "the disk flush: harness_power - harness (both in its phase)": overhead(
                times, "harness@power", "harness_power"),
            "a client per run: bare_fresh - bare (in its phase)": overhead(times, "bare@client", "bare_fresh"),
        },
        "breakdown_per_run": parts,
        "prompt_tokens_per_turn": replay.prompt_tokens,
        "loadavg_before_after": [load_before, load_after],
    }


def render(report: dict[str, Any]) -> str:
    first = report["modes"][report["headline_mode"]]
    lines = [
        "# Harness overhead per turn", "",
        f"- workload: `{SCENARIO}`, {TURNS} turns, scripted provider on loopback, zero latency; the same "
        f"messages and tools on the wire for every variant (per-turn prompt tokens, checked every run: "
        f"{first['prompt_tokens_per_turn']})",
        f"- {report['runs']} timed rounds after {report['warmup']} warm-up rounds; each round runs every "
        f"variant of its phase once, order rotated; one process, one event loop. Phases, each beside its "
        f"own bare (later ones suffixed `@phase`): " + "; ".join(", ".join(v) for v in PHASES.values())
        + ". Apart because a neighbour's disk flushes or new connections slow the others",
        f"- machine: {report['machine']}", f"- runner {report['runner_version']} from `{report['runner_path']}`",
        "",
    ]
    for mode, res in report["modes"].items():
        head = res["overhead"][HEADLINE]
        verdict = ("meets" if head["per_turn_ms"] <= TARGET_MS_PER_TURN
                   else f"MISSES by {head['per_turn_ms'] - TARGET_MS_PER_TURN:.3f} ms")
        lines += [
            f"## Provider as {mode}" + (" (headline)" if mode == report["headline_mode"] else ""), "",
            f"Load average (1 min) before / after the timed loop: {res['loadavg_before_after'][0]:.2f} / "
            f"{res['loadavg_before_after'][1]:.2f}", "",
            f"**Per-turn overhead, every transition durable against a kill = (median harness − median bare) / 3 "
            f"= {head['per_turn_ms']:.3f} ms** (target ≤ {TARGET_MS_PER_TURN} ms: {verdict}; paired per-round "
            f"min / median / max = {head['paired_min']:.3f} / {head['paired_median']:.3f} / {head['paired_max']:.3f} ms)",
            "",
            "| variant | min ms | median ms | max ms | n |", "|---|---:|---:|---:|---:|",
        ]
        for v, st in res["stats_ms"].items():
            lines.append(f"| {v} | {st['min']:.2f} | {st['median']:.2f} | {st['max']:.2f} | {st['n']} |")
        lines += ["", "| difference per turn | (median − median) / 3 ms | paired min | paired median | paired max |",
                  "|---|---:|---:|---:|---:|"]
        for name, o in res["overhead"].items():
            lines.append(f"| {name} | {o['per_turn_ms']:.3f} | {o['paired_min']:.3f} | "
                         f"{o['paired_median']:.3f} | {o['paired_max']:.3f} |")
        lines += ["", f"Where a `harness` run spends its time (median over {report['instrumented_runs']} "
                  "instrumented runs; each wrapper adds about 1 µs per call):", "",
                  "| part | calls per run | ms per run | ms per turn |", "|---|---:|---:|---:|"]
        for label, part in res["breakdown_per_run"].items():
            lines.append(f"| {label} | {part['calls'] or ''} | {part['ms']:.3f} | {part['ms'] / TURNS:.3f} |")
        lines.append("")
    lines += ["## Micro-benchmarks (median µs per call)", "", "| operation | µs |", "|---|---:|"]
    for label, us in report["micro_us"].items():
        lines.append(f"| {label} | {us:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="timed rounds (>= 30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    parser.add_argument("--instrumented-runs", type=int, default=30)
    parser.add_argument("--provider", choices=["subprocess", "inprocess", "both"], default="subprocess")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench")
    args = parser.parse_args()
    if args.runs < 30:
        parser.error("--runs must be >= 30")
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="overhead-runs-", dir=args.out))
    modes = ["subprocess", "inprocess"] if args.provider == "both" else [args.provider]
    report: dict[str, Any] = {
        "runs": args.runs, "warmup": args.warmup, "instrumented_runs": args.instrumented_runs,
        "target_ms_per_turn": TARGET_MS_PER_TURN, "headline_mode": modes[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                   f"httpx {httpx.__version__}; runs saved under {scratch.parent} ({_fs_type(scratch)})",
        "runner_version": runner.__version__, "runner_path": str(Path(runner.__file__).parent), "modes": {},
    }
    try:
        for mode in modes:
            with provider(mode) as url:
                report["modes"][mode] = asyncio.run(
                    measure(url, args.runs, args.warmup, scratch / mode, args.instrumented_runs))
        report["micro_us"] = asyncio.run(micro(scratch / "micro"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    head = report["modes"][modes[0]]["overhead"][HEADLINE]
    report["headline"] = {"provider": modes[0], **head, "meets_target": head["per_turn_ms"] <= TARGET_MS_PER_TURN}
    text = render(report)
    (args.out / "overhead.md").write_text(text, encoding="utf-8")
    (args.out / "overhead.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(text)
    print(f"wrote {args.out / 'overhead.md'} and {args.out / 'overhead.json'}", file=sys.stderr)


def _fs_type(path: Path) -> str:
    """The filesystem type `path` is on (from /proc/mounts; the flush cost depends on it)."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "filesystem unknown"
    best = max((m for m in mounts if str(path.resolve()).startswith(m[1])), key=lambda m: len(m[1]), default=None)
    return f"{best[2]} on {best[0]}" if best else "filesystem unknown"


if __name__ == "__main__":
    main()
