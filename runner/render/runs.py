"""Lists of runs (`runner runs`): the table with each model's distinguishing name, the sums per
model, day or status (`--totals`), and what `--prune` did."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runner.render.stop import _shown, result_json, resume_target, store_options
from runner.render.terminal import console, print_table, say, when, wrap

if TYPE_CHECKING:
    from runner.state import RunState
    from runner.store import RunInfo, RunStore


_QUANT = re.compile(r"[.\-_](?:i?q\d[\w]*|f16|f32|bf16)$", re.IGNORECASE)
_TUNE = re.compile(r"[.\-_](?:instruct|chat|it)$", re.IGNORECASE)


def short_model(name: str) -> str:
    """The part of a model name that tells models apart in a narrow column: no folder, no
    ".gguf", no quantization or "-instruct" suffix ("…/SmolLM2-135M-Instruct.Q4_1.gguf" ->
    "SmolLM2-135M"); a scripted scenario by its name ("scripted/plan" -> "plan")."""
    if name.startswith("scripted/"):
        return name.removeprefix("scripted/")
    base = name.rsplit("/", 1)[-1].removesuffix(".gguf")
    for pattern in (_QUANT, _TUNE):
        base = pattern.sub("", base)
    return base or name


def short_models(names: Sequence[str]) -> dict[str, str]:
    """`short_model` of each name, keeping a name whole where two would look the same."""
    shorts = {n: short_model(n) for n in names}
    taken: dict[str, int] = {}
    for short in shorts.values():
        taken[short] = taken.get(short, 0) + 1
    return {n: s if taken[s] == 1 else n for n, s in shorts.items()}


GROUPINGS = ("model", "day", "status")


@dataclass
class Total:
    """Sums over a group of runs: counts, tokens, USD."""

    group: str
    runs: int = 0
    turns: int = 0
    tool_runs: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, state: RunState) -> None:
        self.runs += 1
        self.turns += state.turns
        self.tool_runs += state.tool_run_count
        self.prompt_tokens += state.prompt_tokens
        self.completion_tokens += state.completion_tokens
        self.cost_usd += state.cost_usd - state.child_cost_usd  # each child run is a row of its own


def run_totals(states: Sequence[tuple[RunState, str]], by: str | None) -> list[Total]:
    """Sums per group (`by`: "model", "day" (UTC, of the start) or "status" (as shown)), in
    order of first appearance, then a TOTAL row; one "all runs" row when `by` is None. When
    some runs are unpriced (a model on this machine, no price given: $0), a "priced" and an
    "unpriced" row come before the last, so $0 is never read as a cheap hosted run.
    `states` holds (state, shown status) pairs. Every run counts its own spend: a research
    child's cost, which its parent's `cost_usd` includes, is counted once, with the child.
    """
    from runner.models import known_name

    groups: dict[str, Total] = {}
    overall = Total("TOTAL" if by else "all runs")
    kinds = {True: Total("priced"), False: Total("unpriced")}
    known = {m: known_name(m) for m in {s.config.endpoint.model for s, _ in states}} if by == "model" else {}
    names = short_models(sorted(set(known.values())))
    for state, shown in states:
        model = known.get(state.config.endpoint.model, state.config.endpoint.model)
        key = {"model": names.get(model, model),
               "day": time.strftime("%Y-%m-%d", time.gmtime(state.created_at)), "status": shown}.get(by or "", "")
        if by:
            groups.setdefault(key, Total(key)).add(state)
        kinds[state.config.priced].add(state)
        overall.add(state)
    split = [k for k in kinds.values() if k.runs] if kinds[False].runs else []  # runs at $0: said apart
    return [*groups.values(), *split, overall]


def print_runs(infos: Sequence[RunInfo], store_opts: str = "") -> None:
    """The `runner runs` table: id, start, status, turns, cost, the model's distinguishing
    name, and, where the terminal has room for them, the prompt's first line and the reason
    (`runner show` has it all); `store_opts` (see `store_options`) goes into the commands it
    suggests."""

    def reason(i: RunInfo) -> str:
        if i.shown_status == "died":
            return "its process died; resume it with: runner resume " + resume_target(i.state, store_opts)
        if i.shown_status == "damaged":
            return i.damage or "damaged; repair it with: runner repair " + i.state.run_id + store_opts
        return f"driven by {i.driver}" if i.shown_status == "running" else i.state.reason or ""

    names = short_models(sorted({i.state.config.endpoint.model for i in infos}))
    wide = console().width >= 100
    print_table([("run id", "id"), ("started", "id"), ("status", "id"), ("turns", "num"),
                 ("cost USD", "num"), ("model", "text"), *([("prompt", "text"), ("reason", "text")] if wide else [])],
                [[i.state.run_id, when(i.state.created_at)[5:], i.shown_status, str(i.state.turns),
                  own_cost(i.state), names[i.state.config.endpoint.model],
                  *([first_line(i.state), reason(i)] if wide else [])] for i in infos])


def first_line(state: RunState) -> str:
    """The first line of a run's prompt (`steering.question`: its first user message)."""
    from runner.steering import question

    return next((line.strip() for line in question(state).splitlines() if line.strip()), "")


def own_cost(state: RunState) -> str:
    """A run's own spend for a list of runs, in USD: a research parent's without its children's
    (each child is a row of its own, so the column adds up)."""
    return f"{state.cost_usd - state.child_cost_usd:.6f}"


def print_totals(rows: Sequence[Total], by: str | None) -> None:
    """The `runner runs --totals` table."""
    print_table([(by or "", "text"), ("runs", "num"), ("turns", "num"), ("tools", "num"),
                 ("in tokens", "num"), ("out tokens", "num"), ("cost USD", "num")],
                [[r.group, str(r.runs), str(r.turns), str(r.tool_runs), f"{r.prompt_tokens:,}",
                  f"{r.completion_tokens:,}", f"{r.cost_usd:.6f}"] for r in rows])


def runs_list(infos: Sequence[RunInfo], where: RunStore, as_json: bool, status: str | None = None,
              offset: int = 0) -> None:
    """`runner runs`: a warning on stderr per unreadable run skipped, then the table (or that
    there are none), or with `as_json` each run's `RunResult` (without its per-turn prompt
    tokens) with its shown status, its driver and any damage."""
    for problem in getattr(where, "problems", []):
        say(f"warning: skipped an unreadable run: {problem}")
    if as_json:
        print(json.dumps([{**{k: v for k, v in result_json(i.state).items() if k != "per_turn_prompt_tokens"},
                           "status": i.shown_status, "driver": i.driver, **({"damage": i.damage} if i.damage else {})}
                          for i in infos]))
    elif infos:
        print_runs(infos, store_options(where.url))
    elif said := _missing(where):
        print(said)
    else:
        print(f"no runs in {_shown(where.url)}" + (f" with status {status}" if status else "")
              + (f" past the first {offset} (--offset)" if offset else ""))


def runs_totals(infos: Sequence[RunInfo], where: RunStore, by: str | None, as_json: bool) -> None:
    """`runner runs --totals`: the sums (see `run_totals`) as a table, or as JSON rows."""
    rows = run_totals([(i.state, i.shown_status) for i in infos], by)
    if as_json:
        print(json.dumps([{**dataclasses.asdict(r), "cost_usd": round(r.cost_usd, 9)} for r in rows]))
    elif said := _missing(where):
        print(said)
    else:
        print_totals(rows, by)


def _missing(where: RunStore) -> str:
    """What to say for a runs directory that does not exist ('' for one that does, or a database)."""
    root = getattr(where, "root", None)
    return f"no runs: {_shown(where.url)} does not exist (yet)" if isinstance(root, Path) and not root.exists() else ""


def pruned(deleted: Sequence[str], skipped: Sequence[str], dry_run: bool, url: str, as_json: bool) -> None:
    """What `runner runs --prune` did: one line per run deleted (or that would be, with
    `dry_run`), each run skipped and why (stderr), then a count."""
    if as_json:
        print(json.dumps({"deleted" if not dry_run else "would_delete": list(deleted), "skipped": list(skipped)}))
        return
    verb = "would delete" if dry_run else "deleted"
    print("".join(f"{verb} {run_id}\n" for run_id in deleted), end="", flush=True)
    print("".join(wrap(f"skipped {line}") + "\n" for line in skipped), end="", file=sys.stderr, flush=True)
    print(f"{verb} {len(deleted)} run(s) from {_shown(url)}" + (f", skipped {len(skipped)}" if skipped else ""))
