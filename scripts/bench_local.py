"""Benchmark: local turns with today's engine settings against the new ones, side by side.

Two embedded servers of the same model (`runner.local.LocalServer`) run the same tasks through
the real suite machinery (`runner.suite.run_suite`, the model manifest's harness settings, one
task at a time, the two servers alternating which goes first): the six-task suite and the test
half of the development suites (`runner suite --split test`). The settings compared:

- **today**: the engine as it was: ``tool_choice`` none hides the tools (the conversation is
  evaluated again), the grammar is applied to the whole vocabulary for every token, a reply of
  calls goes on to its closing tag and end of turn, no drafting;
- **new**: the defaults: the tools stay in the prompt under ``tool_choice`` none (the KV cache is
  kept), greedy sampling tries the best token against the grammar first, a reply ends as its
  last allowed call closes, drafting as the manifest (or ``--draft``) says.

Printed: the ratio new / today of the mean and p95 turn time; generation tokens/s of each side
and of llama-cpp-python's own ``Llama.generate`` replaying the new side's turns (same rendered
prompt, greedy, the same number of tokens, no grammar, right after each task), by kind of turn; prompt tokens reused
and evaluated per kind of turn (the forced-answer turn's, ``tool_choice`` none, among them);
whether every reply was identical on both sides, compared turn by turn wherever the two sides
sent the same conversation (a ``tool_choice`` none turn's prompt differs by design, so its reply,
and every turn of that task after a reply that differed, is counted apart); the speculative
acceptance rate; the load average before and after.
``--json FILE`` writes ``{"mean_turn_ratio", "p95_turn_ratio", "identical", "gen_tok_s_vs_raw",
"acceptance_rate", "load_average"}``.

Usage: ``python scripts/bench_local.py [--model NAME] [--six-only] [--limit N] [--draft none|lookup]
[--json FILE]``. On a shared machine every figure moves with the load: read the ratios, and the
load average beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner import models
from runner.chat_adapter import render_prompt
from runner.local import LocalServer, LocalSettings
from runner.state import RunState
from runner.store import FileStore
from runner.suite import SuiteDefinition, load_suite, percentile, run_suite, select_tasks, shipped_suites
from runner.trace import TurnEvent

SIDES: dict[str, dict[str, Any]] = {
    "today": {"none_keeps_tools": False, "grammar_check_first": False, "stop_at_call_end": False, "draft": "none"},
    "new": {},
}


@dataclass
class Turn:
    """One kept turn: its kind (the tool_choice sent), the reply, and its timings."""

    kind: str
    reply: str
    ms: float
    completion_tokens: int
    prompt_tokens: int
    reused: int
    evaluated: int
    gen_ms: float
    draft_accepted: int
    draft_proposed: int
    prompt_text: str = ""
    conversation: str = ""
    """The messages sent for this turn, as JSON (two sides sent the same turn when equal)."""
    new_tokens: int | None = None
    """Prompt tokens added since the run's turn before (None on a run's first turn)."""


@dataclass
class Side:
    turns: list[Turn] = field(default_factory=list)
    tasks_turns: list[list[Turn]] = field(default_factory=list)
    correct: int = 0
    tasks: int = 0


def tasks_of(six_only: bool, limit: int | None) -> list[tuple[SuiteDefinition, str]]:
    """(suite, task id) pairs: the six-task suite's, then the test half's."""
    suites = [load_suite()] + ([] if six_only else [load_suite(p) for p in shipped_suites("test")])
    pairs = [(suite, task.id) for suite in suites for task in suite.tasks]
    return pairs[:limit] if limit else pairs


def turns_of(state: RunState, events: list[TurnEvent], tools: list[dict[str, Any]]) -> list[Turn]:
    """The kept turns of a run, with the prompt each was sent as runner's engine renders it."""
    messages = [m.to_api() for m in state.messages]
    at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    kept = [(e, r) for e, r in zip(events, state.per_turn) if r.slip is None]
    out: list[Turn] = []
    for i, (event, record) in zip(at, kept):
        engine = record.engine
        new_tokens = record.prompt_tokens - out[-1].prompt_tokens if out else None
        out.append(Turn(
            kind=event.toolChoice or "auto", reply=json.dumps(messages[i], sort_keys=True), ms=record.ms,
            completion_tokens=record.completion_tokens, prompt_tokens=record.prompt_tokens,
            reused=engine.prompt_reused if engine else 0, evaluated=engine.prompt_evaluated if engine else 0,
            gen_ms=engine.gen_ms if engine else 0.0, draft_accepted=(engine.draft_accepted or 0) if engine else 0,
            draft_proposed=(engine.draft_proposed or 0) if engine else 0,
            prompt_text=render_prompt(messages[:i], tools or None), new_tokens=new_tokens,
            conversation=json.dumps(messages[:i], sort_keys=True)))
    return out


def run_one(server: LocalServer, name: str, suite: SuiteDefinition, task_id: str, runs: Path) -> tuple[list[Turn], bool]:
    """One task through the suite machinery on `server`: its kept turns and whether it was right."""
    report = run_suite("local", runs, models=[name], base_url=server.base_url, suites=select_tasks([suite], [task_id]))
    [result] = report.results
    store = FileStore(runs)
    state = store.load(result.run_id)
    events = [e for e in store.read_trace(result.run_id) if isinstance(e, TurnEvent)]
    tools = _tool_schemas(state)
    return turns_of(state, events, tools), result.correct


def _tool_schemas(state: RunState) -> list[dict[str, Any]]:
    from runner.catalog import build

    return [tool.schema() for tool in build(state.config)]


def raw_model(path: Path) -> Any:
    """The model loaded in this process with llama-cpp-python, as runner's server loads it."""
    from llama_cpp import Llama

    settings = LocalSettings(model=path, port=0)
    return Llama(model_path=str(path), n_ctx=settings.n_ctx, n_threads=settings.n_threads,
                 n_threads_batch=settings.n_threads, n_batch=settings.n_batch, seed=0, verbose=False)


def raw_generation(llm: Any, turns: list[Turn]) -> list[float]:
    """llama-cpp-python's own ``Llama.generate`` on each turn's prompt (greedy, no grammar) for the
    turn's number of tokens: generation ms per turn (wall time after the prompt was evaluated)."""
    import llama_cpp

    out = []
    for turn in turns:
        tokens = llm.tokenize(turn.prompt_text.encode("utf-8"), add_bos=False, special=True)
        llama_cpp.llama_perf_context_reset(llm.ctx)
        began = time.perf_counter()
        for i, _ in enumerate(llm.generate(tokens, temp=0.0, top_k=1, reset=True)):
            if i + 1 >= max(1, turn.completion_tokens):
                break
        wall_ms = (time.perf_counter() - began) * 1000
        out.append(wall_ms - llama_cpp.llama_perf_context(llm.ctx).t_p_eval_ms)
    return out


def tok_s(tokens: float, ms: float) -> float:
    return tokens / ms * 1000 if ms > 0 else 0.0


def report(sides: dict[str, Side], raw_ms: list[float], load: list[list[float]], name: str) -> tuple[str, dict[str, Any]]:
    today, new = sides["today"], sides["new"]
    t_ms, n_ms = [t.ms for t in today.turns], [t.ms for t in new.turns]
    mean_ratio = statistics.fmean(n_ms) / statistics.fmean(t_ms) if t_ms and n_ms else float("nan")
    p95_ratio = percentile(n_ms, 95) / percentile(t_ms, 95) if t_ms and n_ms else float("nan")
    pairs = [(a, b) for a_task, b_task in zip(today.tasks_turns, new.tasks_turns) for a, b in zip(a_task, b_task)]
    same = [(a, b) for a, b in pairs if a.conversation == b.conversation and a.kind == b.kind != "none"]
    identical_other = all(a.reply == b.reply for a, b in same)
    identical_none = sum(1 for a, b in pairs if a.kind == b.kind == "none" and a.reply == b.reply)
    n_none = sum(1 for a, b in pairs if a.kind == b.kind == "none")
    gen_new = tok_s(sum(t.completion_tokens for t in new.turns), sum(t.gen_ms for t in new.turns))
    gen_today = tok_s(sum(t.completion_tokens for t in today.turns), sum(t.gen_ms for t in today.turns))
    gen_raw = tok_s(sum(t.completion_tokens for t in new.turns), sum(raw_ms))
    proposed = sum(t.draft_proposed for t in new.turns)
    accepted = sum(t.draft_accepted for t in new.turns)
    lines = [f"Local turns of {name}: today's engine settings vs the new ones, alternating task by task",
             f"load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in load[0])}; "
             f"after: {' / '.join(f'{x:.2f}' for x in load[1])}", "",
             "| side | tasks | correct | turns | mean turn ms | p95 turn ms | gen tok/s | prompt tok reused | evaluated |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, side in sides.items():
        ms = [t.ms for t in side.turns]
        lines.append(f"| {label} | {side.tasks} | {side.correct} | {len(ms)} | {statistics.fmean(ms) if ms else 0:,.0f} | "
                     f"{percentile(ms, 95) if ms else 0:,.0f} | "
                     f"{tok_s(sum(t.completion_tokens for t in side.turns), sum(t.gen_ms for t in side.turns)):.1f} | "
                     f"{sum(t.reused for t in side.turns):,} | {sum(t.evaluated for t in side.turns):,} |")
    lines += ["", "Per kind of turn (tool_choice sent): mean prompt tokens reused / evaluated, and re-evaluated "
              "(evaluated beyond what is new since the turn before), mean turn ms, gen tok/s:", "",
              "| side | kind | turns | reused | evaluated | re-evaluated | turn ms | gen tok/s | raw gen tok/s |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    raw_by_turn = dict(zip(map(id, new.turns), raw_ms))
    for label, side in sides.items():
        for kind in sorted({t.kind for t in side.turns}):
            group = [t for t in side.turns if t.kind == kind]
            again = [min(t.evaluated, max(0, t.evaluated - t.new_tokens)) for t in group if t.new_tokens is not None]
            raw = (f"{tok_s(sum(t.completion_tokens for t in group), sum(raw_by_turn.get(id(t), 0) for t in group)):.1f}"
                   if label == "new" and raw_ms else "")
            lines.append(f"| {label} | {kind} | {len(group)} | {statistics.fmean(t.reused for t in group):,.0f} | "
                         f"{statistics.fmean(t.evaluated for t in group):,.0f} | "
                         f"{statistics.fmean(again) if again else 0:,.0f} | "
                         f"{statistics.fmean(t.ms for t in group):,.0f} | "
                         f"{tok_s(sum(t.completion_tokens for t in group), sum(t.gen_ms for t in group)):.1f} | {raw} |")
    lines += ["", f"mean turn ratio (new / today): {mean_ratio:.2f}; p95: {p95_ratio:.2f}",
              f"generation tok/s: new {gen_new:.1f}, today {gen_today:.1f}, llama-cpp-python raw {gen_raw:.1f} "
              f"(new / raw {gen_new / gen_raw if gen_raw else float('nan'):.2f})",
              f"replies identical on every turn both sides sent the same conversation: "
              f"{sum(a.reply == b.reply for a, b in same)}/{len(same)} ({'yes' if identical_other else 'no'}); "
              f"tool_choice none turns identical: {identical_none}/{n_none} (their prompts differ by design); "
              f"{len(new.turns) - len(same) - sum(t.kind == 'none' for t in new.turns)} other turns of the new "
              f"side not compared (they came after a reply that differed)",
              f"drafts accepted: {accepted}/{proposed}" + (f" ({accepted / proposed:.0%})" if proposed else " (no drafting)")]
    numbers = {"mean_turn_ratio": round(mean_ratio, 3), "p95_turn_ratio": round(p95_ratio, 3),
               "identical": identical_other, "gen_tok_s_vs_raw": round(gen_new / gen_raw, 3) if gen_raw else None,
               "acceptance_rate": round(accepted / proposed, 3) if proposed else None,
               "load_average": {"before": [round(x, 2) for x in load[0]], "after": [round(x, 2) for x in load[1]]}}
    return "\n".join(lines) + "\n", numbers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="It takes minutes: --six-only took 4 min at rest on 2 cores "
                                            "(2026-12-05); the test half has ten times as many tasks.")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct",
                        help="manifest name or .gguf path (default: %(default)s)")
    parser.add_argument("--six-only", action="store_true", help="the six-task suite only (not the test half)")
    parser.add_argument("--limit", type=int, default=None, help="the first N tasks only (default: all)")
    parser.add_argument("--draft", choices=["auto", "none", "lookup"], default="auto",
                        help="the new side's drafting (default: auto, the manifest's)")
    parser.add_argument("--no-raw", action="store_true", help="skip the llama-cpp-python replay")
    parser.add_argument("--json", type=Path, default=None, help="write the headline numbers here")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the tables here")
    args = parser.parse_args()

    name, path = models.resolve_choice(args.model)
    runs = Path(tempfile.mkdtemp(prefix="bench_local-"))
    sides = {label: Side() for label in SIDES}
    extra = {"today": SIDES["today"], "new": {"draft": args.draft}}
    servers = {label: LocalServer(LocalSettings(model=path, model_name=name, port=0, **extra[label])) for label in SIDES}
    load_before = list(os.getloadavg())
    raw_ms: list[float] = []
    llm = None if args.no_raw else raw_model(path)
    try:
        for server in servers.values():
            server.start()
        for i, (suite, task_id) in enumerate(tasks_of(args.six_only, args.limit)):
            order = list(SIDES) if i % 2 == 0 else list(reversed(SIDES))
            for label in order:
                turns, correct = run_one(servers[label], name, suite, task_id, runs)
                side = sides[label]
                side.turns += turns
                side.tasks_turns.append(turns)
                side.correct += correct
                side.tasks += 1
                if label == "new" and llm is not None:  # raw replay of the same turns, right after them
                    raw_ms += raw_generation(llm, turns)
            print(f"{suite.name}/{task_id}: today {sum(t.ms for t in sides['today'].turns):,.0f} ms, "
                  f"new {sum(t.ms for t in sides['new'].turns):,.0f} ms so far", file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    load_after = list(os.getloadavg())
    text, numbers = report(sides, raw_ms, [load_before, load_after], name)
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
