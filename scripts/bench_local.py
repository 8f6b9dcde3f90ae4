"""Benchmark: local-model turn time seen over HTTP vs llama.cpp's own compute, and KV reuse.

Runs a 3-turn tool-using conversation against the embedded server (`runner.local.LocalServer`),
`--rounds` times, appending the model's actual replies (as an agent loop does) plus canned tool
results. Per turn it records:

- wall_ms: time of the HTTP call seen by an httpx client, ms;
- llama_ms: llama.cpp's prompt-eval + generation time for the same call (``llama_perf_context``,
  returned by runner's chat handler in the response's ``runner`` field), ms;
- ratio = wall_ms / llama_ms (R13 target: <= 1.15);
- prefix hit = cached_prompt_tokens / prompt_tokens (KV entries reused from the previous call).

Turn 1 of every round after the first also hits the cache: it shares the system and user
messages with the previous round's last call. The hit rate that matters is turns >= 2.

Prints medians per turn index and writes the table as Markdown with ``--markdown PATH``.

Usage: ``python scripts/bench_local.py [--model NAME|PATH] [--rounds 5] [--max-tokens 32]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner import models
from runner.local import LocalServer

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "list_files", "description": "List the workspace files.",
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "read_file", "description": "Read a workspace file.",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
]
TOOL_RESULTS = [
    "errors.log\naccess.log\nnotes.txt",
    "2024-05-01 12:00:03 ERROR worker 7 timed out after 30000 ms\n" * 12,
]
FOLLOW_UPS = ["List the files, please.", "Now read errors.log."]


def turn(client: httpx.Client, url: str, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """One chat call; returns the response body plus the client-side wall time (ms)."""
    began = time.perf_counter()
    reply = client.post(url, json={"model": "bench", "messages": messages, "tools": TOOLS,
                                   "temperature": 0, "max_tokens": max_tokens})
    wall_ms = (time.perf_counter() - began) * 1000.0
    reply.raise_for_status()
    body: dict[str, Any] = reply.json()
    body["wall_ms"] = wall_ms
    return body


def extend(messages: list[dict[str, Any]], body: dict[str, Any], index: int) -> None:
    """Append the model's reply and what the harness would send next."""
    message = body["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    messages.append({"role": "assistant", "content": message.get("content") or "",
                     **({"tool_calls": calls} if calls else {})})
    for call in calls:
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": TOOL_RESULTS[index]})
    if not calls:
        messages.append({"role": "user", "content": FOLLOW_UPS[index]})


def one_round(client: httpx.Client, url: str, max_tokens: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent over a folder of log files. Use the tools."},
        {"role": "user", "content": "Which file mentions a timeout?"},
    ]
    rows = []
    for index in range(3):
        body = turn(client, url, messages, max_tokens)
        timings = body["runner"]
        rows.append({
            "turn": index + 1,
            "wall_ms": body["wall_ms"],
            "llama_ms": timings["prompt_eval_ms"] + timings["eval_ms"],
            "handler_ms": timings["handler_ms"],
            "prompt_tokens": body["usage"]["prompt_tokens"],
            "completion_tokens": body["usage"]["completion_tokens"],
            "cached": timings["cached_prompt_tokens"],
        })
        if index < 2:
            extend(messages, body, index)
    return rows


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    table = []
    for number in (1, 2, 3):
        mine = [r for r in rows if r["turn"] == number]
        wall = statistics.median(r["wall_ms"] for r in mine)
        llama = statistics.median(r["llama_ms"] for r in mine)
        table.append({
            "turn": number,
            "wall_ms": wall,
            "llama_ms": llama,
            "ratio": statistics.median(r["wall_ms"] / r["llama_ms"] for r in mine),
            "prompt_tokens": statistics.median(r["prompt_tokens"] for r in mine),
            "completion_tokens": statistics.median(r["completion_tokens"] for r in mine),
            "prefix_hit": statistics.median(r["cached"] / r["prompt_tokens"] for r in mine),
        })
    return table


def markdown(table: list[dict[str, float]], model: str, rounds: int, later_hit: float) -> str:
    lines = [
        f"Local model turn time, {model}, median of {rounds} rounds",
        "",
        "| turn | wall ms (HTTP) | llama.cpp ms | ratio | prompt tok | completion tok | KV prefix hit |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in table:
        lines.append(f"| {r['turn']:.0f} | {r['wall_ms']:.1f} | {r['llama_ms']:.1f} | {r['ratio']:.3f} | "
                     f"{r['prompt_tokens']:.0f} | {r['completion_tokens']:.0f} | {r['prefix_hit']:.1%} |")
    lines += ["", f"KV prefix hit rate on turns >= 2 (cached / prompt tokens, all rounds): {later_hit:.1%}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="manifest name or .gguf path")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    parser.add_argument("--json", action="store_true", help="print raw per-turn rows as JSON")
    args = parser.parse_args()

    name, path = models.resolve_choice(args.model)
    rows: list[dict[str, Any]] = []
    with LocalServer(path, model_name=name) as server, httpx.Client(timeout=300) as client:
        url = f"{server.base_url}/chat/completions"
        turn(client, url, [{"role": "user", "content": "warm up"}], 1)  # first-call costs out
        for _ in range(args.rounds):
            rows += one_round(client, url, args.max_tokens)
    later = [r for r in rows if r["turn"] >= 2]
    later_hit = sum(r["cached"] for r in later) / sum(r["prompt_tokens"] for r in later)
    text = markdown(summarise(rows), name, args.rounds, later_hit)
    print(json.dumps(rows, indent=1) if args.json else text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
