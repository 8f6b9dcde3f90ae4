"""Benchmark: a local model's first turn on a cold server, with and without the saved prefix
KV state (`runner.kvprefix`), against a warm first turn.

Each round takes one suite task X (and the next one, Y) and starts three embedded servers
(`runner.local.LocalServer`, the real llama.cpp server):

    cold, evaluated   prefix cache off: the first request evaluates the whole prompt
    cold, from disk   prefix cache on (a folder primed before the rounds): the first request
                      loads the system turn's KV entries from disk
    warm              prefix cache on; it answers Y's first turn, then X's: the system turn
                      is still in memory (what every task after the first sees on one server)

and times X's first turn through the real harness (HTTP included, server start-up not). The
figures are medians over the rounds; the target is cold-from-disk <= 1.3x warm. Every X reply
is compared across the three servers (they must be identical). The folder's size is printed.

Usage: ``python scripts/bench_prefix.py [--model NAME|PATH ...] [--rounds 6]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner import models
from runner.endpoints import Endpoint
from runner.harness import drive
from runner.local import LocalServer, LocalSettings
from runner.state import Limits, RunConfig, new_run
from runner.suite import SuiteDefinition, load_suite

TARGET_RATIO = 1.3
TOOLS = ["list_files", "read_file", "delete_file", "scan_archive"]


def first_turn(server: LocalServer, name: str, prompt: str, system: str, choice: str) -> tuple[float, str]:
    """One task's first turn through the harness (in memory): (turn ms, the reply as JSON)."""
    config = RunConfig(endpoint=Endpoint(model=name, first_turn_tool_choice=choice),  # type: ignore[arg-type]
                       limits=Limits(max_turns=1), tools=TOOLS)
    state = asyncio.run(drive(new_run(prompt, config, system=system), server.base_url, None))
    reply = next(m for m in state.messages if m.role == "assistant")
    return state.per_turn[0].ms, reply.model_dump_json(exclude={"tool_calls": {"__all__": {"id"}}})


def stats(server: LocalServer) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(server.base_url.removesuffix("/v1") + "/stats", timeout=10).json()
    return body


def measure(name: str, path: Path, suite: SuiteDefinition, choice: str, rounds: int, folder: Path) -> dict[str, Any]:
    def server(**extra: Any) -> LocalServer:
        return LocalServer(LocalSettings(model=path, model_name=name, port=0, prefix_cache_dir=folder, **extra))

    with server() as primer:  # saves the system turn's KV entries
        first_turn(primer, name, suite.tasks[0].prompt, suite.system, choice)
    times: dict[str, list[float]] = {"cold, evaluated": [], "cold, from disk": [], "warm": []}
    starts: dict[str, list[float]] = {k: [] for k in times}
    engine: dict[str, list[dict[str, Any]]] = {k: [] for k in times}
    same = 0
    for r in range(rounds):
        x, y = suite.tasks[r % len(suite.tasks)], suite.tasks[(r + 1) % len(suite.tasks)]
        replies = {}
        for label, extra in (("cold, evaluated", {"prefix_cache_mb": 0}), ("cold, from disk", {}), ("warm", {})):
            began = time.perf_counter()
            with server(**extra) as s:
                starts[label].append((time.perf_counter() - began) * 1000)
                if label == "warm":
                    first_turn(s, name, y.prompt, suite.system, choice)
                ms, replies[label] = first_turn(s, name, x.prompt, suite.system, choice)
                times[label].append(ms)
                engine[label].append(stats(s)["replies"][-1])
                usage = stats(s)["prefix_cache"]
        same += len(set(replies.values())) == 1
    return {"model": name, "times": times, "starts": starts, "engine": engine, "identical": same, "rounds": rounds, "usage": usage}


def render(results: list[dict[str, Any]], load: tuple[tuple[float, ...], tuple[float, ...]]) -> str:
    lines = ["First local turn on a cold server: the saved prefix KV state against a warm first turn "
             "(medians; turn ms through the harness, HTTP included; engine = the server's own prompt "
             "evaluation; server start = process start to healthy, warm-up and prefix load included)",
             f"load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in load[0])}; "
             f"after: {' / '.join(f'{x:.2f}' for x in load[1])}", "",
             "| model | first turn | turn ms | engine prompt ms | prompt tokens evaluated | from disk | "
             "ratio to warm | identical replies | server start ms | prefix folder |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for res in results:
        warm = statistics.median(res["times"]["warm"])
        for label, values in res["times"].items():
            eng = res["engine"][label]
            ratio = statistics.median(values) / warm
            verdict = (f" (target <= {TARGET_RATIO}x: {'meets' if ratio <= TARGET_RATIO else 'MISSES'})"
                       if label == "cold, from disk" else "")
            usage = res["usage"]
            folder = (f"{usage['files']} file(s), {usage['bytes'] / 2**20:.1f} MiB of {usage['max_bytes'] / 2**20:.0f}"
                      if label == "cold, from disk" and usage else "")
            lines.append(
                f"| {res['model']} | {label} | {statistics.median(values):,.0f} | "
                f"{statistics.median(e['prompt_eval_ms'] for e in eng):,.0f} | "
                f"{statistics.median(e['prompt_eval_tokens'] for e in eng):,.0f} | "
                f"{statistics.median(e.get('prefix_disk_tokens', 0) for e in eng):,.0f} | "
                f"**{ratio:.2f}x**{verdict} | {res['identical']}/{res['rounds']} | "
                f"{statistics.median(res['starts'][label]):,.0f} | {folder} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", action="append", default=None,
                        help="manifest name or .gguf path (repeatable; default: the packaged SmolLM2)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()
    suite = load_suite()
    load_before = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory(prefix="kv-prefix-") as tmp:
        for i, choice_name in enumerate(args.model or ["smollm2-135m-instruct"]):
            name, path = models.resolve_choice(choice_name)
            entry = models.entry_for(name, path)
            choice = entry.first_turn_tool_choice if entry else "auto"
            results.append(measure(name, path, suite, choice, args.rounds, Path(tmp) / str(i)))
    text = render(results, (load_before, os.getloadavg()))
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
