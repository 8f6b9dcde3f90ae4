"""Benchmark: a local turn through runner vs llama-cpp-python driven raw on the same prompts.

Per model: runner serves it (`runner.local.LocalServer`, its manifest settings) and the six
suite tasks run through the real harness; every model call's engine timings come from the
server (GET /stats). Then the server stops and the same model is loaded in this process with
llama-cpp-python and driven raw: each turn's prompt, rendered exactly as runner rendered it
(`runner.chat_adapter.render_prompt` over the run's saved messages), is given to
``Llama.generate`` (greedy, its own longest-common-prefix KV reuse) for the same number of
generated tokens, no grammar. Reported per model and side:

- prompt-eval tok/s: prompt tokens evaluated / prompt evaluation time;
- generation tok/s: generated tokens / generation time;
- mean and p95 turn ms: runner, the harness's per-turn wall time (HTTP included) and the
  engine's own time (handler ms); raw, the wall time of each replayed turn;
- prompt tokens reused (KV cache) vs evaluated, summed over the turns;
- the ratio of runner's engine time to raw time on the same turns.

Turns that were protocol slips (not kept in the transcript) are not replayed. Both sides run
one after the other in this process's machine; the load average is printed with the table.

Usage: ``python scripts/bench_local_raw.py [--model NAME ...] [--markdown FILE]``
(default: the Qwen2.5-Coder models that are pulled, else SmolLM2).
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

from runner import models, store
from runner.chat_adapter import render_prompt
from runner.endpoints import Endpoint
from runner.harness import drive
from runner.local import LocalServer, LocalSettings
from runner.state import Limits, RunConfig, RunState, new_run
from runner.suite import load_suite, percentile
from runner.trace import TurnEvent, read_trace

DEFAULT_MODELS = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")


def runner_side(name: str, path: Path) -> tuple[list[RunState], list[list[TurnEvent]], list[dict[str, Any]], list[float]]:
    """The six tasks through runner: (states, turn events per run, engine timings per reply,
    harness per-turn wall ms)."""
    entry = models.entry_for(name, path)
    suite = load_suite()
    states, events, turn_ms = [], [], []
    runs = Path(tempfile.mkdtemp(prefix="bench_local_raw-"))
    with LocalServer(LocalSettings(model=path, model_name=path.stem, port=0)) as server:
        for task in suite.tasks:
            config = RunConfig(endpoint=Endpoint(model=path.stem, first_turn_tool_choice=entry.first_turn_tool_choice
                                                 if entry else "auto"),
                               limits=Limits(max_turns=8),
                               answer_after_tool_turns=entry.answer_after_tool_turns if entry else None)
            state = new_run(task.prompt, config, system=suite.system + (entry.system_addendum if entry else ""))
            state = asyncio.run(drive(state, server.base_url, runs))
            seen = [e for e in read_trace(store.trace_path(runs, state.run_id)) if isinstance(e, TurnEvent)]
            states.append(state)
            events.append(seen)
            turn_ms += [t.ms for t in state.per_turn]
        replies = httpx.get(server.base_url.removesuffix("/v1") + "/stats", timeout=10).json()["replies"]
    return states, events, replies, turn_ms


def prompts_of(state: RunState, turns: list[TurnEvent], tools: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(prompt text, generated tokens) of each kept turn of `state`, as runner rendered it."""
    messages = [m.to_api() for m in state.messages]
    kept = [t for t in turns if t.slip is None]
    assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    out = []
    for at, turn in zip(assistant_at, kept):
        offered = [] if turn.toolChoice == "none" else tools
        out.append((render_prompt(messages[:at], offered or None), turn.completionTokens))
    return out


def raw_side(path: Path, prompts: list[tuple[str, int]]) -> list[dict[str, float]]:
    """Replay `prompts` on llama-cpp-python directly; per turn: wall ms, evaluated and reused
    prompt tokens, prompt-eval and generation ms (llama.cpp's own perf counters)."""
    import llama_cpp
    from llama_cpp import Llama

    settings = LocalSettings(model=path, port=0)
    llm = Llama(model_path=str(path), n_ctx=settings.n_ctx, n_threads=settings.n_threads,
                n_threads_batch=settings.n_threads, n_batch=settings.n_batch, seed=0, verbose=False)
    rows = []
    for text, n_generate in prompts:
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        reused = 0
        for a, b in zip(llm._input_ids.tolist(), tokens):
            if a != b:
                break
            reused += 1
        reused = min(reused, len(tokens) - 1)  # llama-cpp-python always evaluates the last prompt token
        llama_cpp.llama_perf_context_reset(llm.ctx)
        began = time.perf_counter()
        for i, _ in enumerate(llm.generate(tokens, temp=0.0, top_k=1, reset=True)):
            if i + 1 >= max(1, n_generate):
                break
        wall_ms = (time.perf_counter() - began) * 1000
        perf = llama_cpp.llama_perf_context(llm.ctx)
        rows.append({"wall_ms": wall_ms, "evaluated": len(tokens) - reused, "reused": reused,
                     "prompt_eval_ms": perf.t_p_eval_ms, "prompt_eval_tokens": perf.n_p_eval,
                     "eval_ms": perf.t_eval_ms, "eval_tokens": perf.n_eval})
    del llm
    return rows


def summary(name: str, replies: list[dict[str, Any]], turn_ms: list[float], raw: list[dict[str, float]]) -> list[str]:
    """Two Markdown table rows (runner, raw) for one model."""
    handler = [r["handler_ms"] for r in replies]
    runner_row = (
        f"| {name} | runner | {len(replies)} "
        f"| {sum(r['prompt_eval_tokens'] for r in replies) / max(1e-9, sum(r['prompt_eval_ms'] for r in replies) / 1000):,.0f} "
        f"| {sum(r['eval_tokens'] for r in replies) / max(1e-9, sum(r['eval_ms'] for r in replies) / 1000):,.1f} "
        f"| {statistics.fmean(turn_ms):,.0f} / {percentile(turn_ms, 95):,.0f} "
        f"| {statistics.fmean(handler):,.0f} / {percentile(handler, 95):,.0f} "
        f"| {sum(r['cached_prompt_tokens'] for r in replies):,} / {sum(r['prompt_eval_tokens'] for r in replies):,} |")
    wall = [r["wall_ms"] for r in raw]
    raw_row = (
        f"| {name} | llama-cpp-python raw | {len(raw)} "
        f"| {sum(r['prompt_eval_tokens'] for r in raw) / max(1e-9, sum(r['prompt_eval_ms'] for r in raw) / 1000):,.0f} "
        f"| {sum(r['eval_tokens'] for r in raw) / max(1e-9, sum(r['eval_ms'] for r in raw) / 1000):,.1f} "
        f"| {statistics.fmean(wall):,.0f} / {percentile(wall, 95):,.0f} | — "
        f"| {sum(int(r['reused']) for r in raw):,} / {sum(int(r['evaluated']) for r in raw):,} |")
    return [runner_row, raw_row]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="manifest name or .gguf path (repeatable)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()
    names = args.model or [n for n in DEFAULT_MODELS if any(r.present for r in models.list_models() if r.name == n)]
    names = names or ["smollm2-135m-instruct"]
    from runner.state import DEFAULT_TOOLS
    from runner.tools import BASIC_TOOLS

    tools = [cls().schema() for cls in BASIC_TOOLS if cls.name in DEFAULT_TOOLS]
    load_before = os.getloadavg()
    lines = ["| model | driven by | turns | prompt eval tok/s | generation tok/s | turn ms mean / p95 "
             "| engine ms mean / p95 | prompt tokens reused / evaluated |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    ratios = []
    for name in names:
        shown, path = models.resolve_choice(name)
        print(f"bench_local_raw: {shown}: the six tasks through runner", file=sys.stderr, flush=True)
        states, events, replies, turn_ms = runner_side(shown, path)
        prompts = [p for state, turns in zip(states, events) for p in prompts_of(state, turns, tools)]
        print(f"bench_local_raw: {shown}: {len(prompts)} turns replayed on llama-cpp-python", file=sys.stderr, flush=True)
        raw = raw_side(path, prompts)
        lines += summary(shown, replies, turn_ms, raw)
        kept = [r for r, e in zip(replies, [t for ts in events for t in ts]) if e.slip is None]
        engine_ms = sum(r["handler_ms"] for r in kept)
        ratios.append(f"{shown}: runner's engine time / raw time on the same {len(raw)} turns = "
                      f"{engine_ms / max(1e-9, sum(r['wall_ms'] for r in raw)):.2f}")
    load_after = os.getloadavg()
    text = "\n".join([
        f"load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in load_before)}; "
        f"after: {' / '.join(f'{x:.2f}' for x in load_after)} (2 cores)", "", *lines, "", *ratios]) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
