"""Benchmark: local turn time on the suite's own workload, server settings side by side.

Starts one embedded server per setting (`runner.local.LocalServer`, each a `LocalSettings`)
and runs the six suite tasks through the real harness on each, interleaved task by task so
that load from other processes falls on every setting alike. Per setting it reports:

- mean turn ms: the harness's per-turn wall time (HTTP included), ms;
- prompt ms / turn and gen ms / token: the engine's own prompt evaluation and generation time
  (GET /stats), ms;
- evaluated / reused: prompt tokens evaluated vs served from the KV cache, summed over turns;
- calls: tasks whose first turn was a tool call; ratio = mean turn ms / the first setting's.

The settings compared: 2 threads with OMP_WAIT_POLICY PASSIVE (the default), ACTIVE, 1 thread,
smaller n_batch, no prefix reuse, and no jump-forward over grammar-forced text. The machine's load average is printed beside the table.

Usage: ``python scripts/bench_local.py [--model NAME|PATH] [--rounds 1] [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner import models
from runner.endpoints import Endpoint
from runner.harness import drive
from runner.local import LocalServer, LocalSettings
from runner.state import Limits, RunConfig, new_run
from runner.suite import load_suite

SETTINGS: dict[str, dict[str, Any]] = {
    "2 threads PASSIVE n_batch 512": {},
    "2 threads ACTIVE": {"omp_wait_policy": "ACTIVE"},
    "1 thread": {"n_threads": 1},
    "n_batch 128": {"n_batch": 128},
    "n_batch 32": {"n_batch": 32},
    "no prefix reuse": {"reuse_prefix": False},
    "no jump-forward": {"jump_forward": False},
}


async def run_task(base_url: str, name: str, prompt: str, system: str, choice: str, max_turns: int) -> list[float]:
    """One suite task through the real harness (in memory); returns its per-turn ms."""
    config = RunConfig(endpoint=Endpoint(model=name, first_turn_tool_choice=choice),  # type: ignore[arg-type]
                       limits=Limits(max_turns=max_turns), tools=["list_files", "read_file", "delete_file", "scan_archive"])
    state = await drive(new_run(prompt, config, system=system), base_url, None)
    return [t.ms for t in state.per_turn]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="manifest name or .gguf path")
    parser.add_argument("--rounds", type=int, default=1, help="passes over the six tasks")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--only", nargs="*", default=None, help="setting names to run (default: all)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()

    name, path = models.resolve_choice(args.model)
    entry = models.entry_for(name, path)
    choice = entry.first_turn_tool_choice if entry else "auto"
    chosen = {k: v for k, v in SETTINGS.items() if not args.only or k in args.only}
    suite = load_suite()
    servers = {label: LocalServer(LocalSettings(model=path, model_name=name, port=0, **extra))
               for label, extra in chosen.items()}
    load_before = os.getloadavg()
    turn_ms: dict[str, list[float]] = {label: [] for label in chosen}
    first_call: dict[str, int] = {label: 0 for label in chosen}
    try:
        for server in servers.values():
            server.start()
        for _ in range(args.rounds):
            for task in suite.tasks:
                for label, server in servers.items():
                    ms = asyncio.run(run_task(server.base_url, name, task.prompt, suite.system, choice, args.max_turns))
                    turn_ms[label] += ms
        stats = {label: httpx.get(s.base_url.removesuffix("/v1") + "/stats", timeout=10).json()["replies"]
                 for label, s in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    load_after = os.getloadavg()
    rows = []
    for label in chosen:
        replies = stats[label]
        first_call[label] = sum(1 for r in replies if r.get("finish_reason") == "tool_calls")
        gen_tokens = sum(r["eval_tokens"] for r in replies)
        rows.append({
            "setting": label,
            "turns": len(turn_ms[label]),
            "mean_turn_ms": statistics.fmean(turn_ms[label]),
            "prompt_ms_per_turn": statistics.fmean(r["prompt_eval_ms"] for r in replies),
            "gen_ms_per_token": sum(r["eval_ms"] for r in replies) / max(1, gen_tokens),
            "evaluated": sum(r["prompt_eval_tokens"] for r in replies),
            "reused": sum(r["cached_prompt_tokens"] for r in replies),
            "tool_call_turns": first_call[label],
        })
    base = rows[0]["mean_turn_ms"]
    lines = [f"Local turn time on the six suite tasks, {name}, first turn tool_choice={choice}, "
             f"{args.rounds} round(s), settings interleaved task by task",
             f"load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in load_before)}; "
             f"after: {' / '.join(f'{x:.2f}' for x in load_after)}", "",
             "| setting | turns | mean turn ms | ratio | prompt ms / turn | gen ms / token | prompt tok evaluated | reused | turns ending in a call |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['setting']} | {r['turns']} | {r['mean_turn_ms']:,.0f} | {r['mean_turn_ms'] / base:.2f} | "
                     f"{r['prompt_ms_per_turn']:,.0f} | {r['gen_ms_per_token']:.1f} | {r['evaluated']:,} | "
                     f"{r['reused']:,} | {r['tool_call_turns']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    print(json.dumps(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
