"""A run at its stop, as a person reads it: its figures, its answer, where its trace is, and the
commands that continue it (with the options that find its store); its `--json` shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.render.terminal import _wrapped, fit

if TYPE_CHECKING:
    from runner.state import RunState


def run_lines(state: RunState, trace_at: str, width: int = 80, store_opts: str = "") -> list[str]:
    """A stopped run for a person: the figures, the answer, where its trace is, and how to
    continue it when it can be continued (`trace_at`: a path or the command that prints it;
    `store_opts`: see `store_options`).
    Lines longer than `width` wrap, indented; ids, paths and commands are never split."""
    name = state.config.endpoint.model.removeprefix("scripted/")
    lines = [f"{name}  status={state.status}  turns={state.turns}  tools={state.tool_run_count}",
             f"   tokens in={state.prompt_tokens:,} out={state.completion_tokens:,}  cost=${state.cost_usd:.6f}"
             f"  ms={state.wall_ms:,.0f}"]
    if state.answer and "\n" in state.answer.strip():  # paragraphs, lists, code: as written
        lines += ["   answer:", *(f"     {line}".rstrip() for line in state.answer.strip().splitlines())]
    elif state.answer:
        lines.append(f"   answer: {json.dumps(state.answer.strip(), ensure_ascii=False)}")
    if state.answer and state.answer_unsupported:
        lines.append(f"   unsupported: no tool result says {state.answer_unsupported} (runner's review)")
    if state.per_turn:
        counts = [str(t.prompt_tokens) for t in state.per_turn]
        more = ""
        if len(counts) > 8:  # one line: the first and last turns (`runner show` and --json have all)
            counts, more = [*counts[:3], "…", *counts[-3:]], f" ({len(state.per_turn)} turns)"
        lines.append("   per-turn prompt tokens: " + ", ".join(counts) + more)
    lines += [f"   run id: {state.run_id}", f"   trace: {trace_at}"]
    copy = Path(trace_at).parent / "workspace"
    if state.config.workspace and state.config.sandbox == "copy" and copy.is_dir():
        lines.append(f"   the tools worked on a copy of {state.config.workspace} (left unchanged): {copy}")
    if state.status not in ("completed",):
        lines.append(f"   stopped: {state.reason}")
    lines += [f"   {line}" for line in [*writes_line(state), *next_steps(state, store_opts)]]
    return [part for line in lines for part in _wrapped(line, width)] + [
        fit(f"   {line}", width) for line in preview_lines(state)]


def writes_line(state: RunState) -> list[str]:
    """What a run's writes came to, in one line ("writes: 1 done (...); 1 refused (...)", or
    "nothing written" first when none was done); [] for a run that asked for no write."""
    from runner.result import writes_of

    writes = writes_of(state)
    if not writes:
        return []
    done = [w for w in writes if w.outcome == "done"]
    parts = [f"{len(done)} done ({', '.join(f'{w.tool} {w.path}' for w in done)})" if done else "nothing written"]
    for kind in ("refused", "failed"):
        some = [w for w in writes if w.outcome == kind]
        if some:  # each why in its first sentence
            parts.append(f"{len(some)} {kind} (" + "; ".join(f"{w.tool} {w.path}: {w.detail.split('. ')[0]}"
                                                             for w in some) + ")")
    return ["writes: " + "; ".join(parts)]


def preview_lines(state: RunState) -> list[str]:
    """While a write waits for approval, what it would change: the file, the lines it removes
    and adds, and its diff (each line as it is, to be cut, never wrapped); else []."""
    it = state.interruption
    preview = it.preview if it is not None and it.type == "approval" else None
    if preview is None:
        return []
    return [f"{preview.action} {preview.path}: {preview.removed_lines} lines removed, {preview.added_lines} added"
            + ("" if preview.diff else " (too large to show a diff)"), *(f"  {line}" for line in preview.diff.splitlines())]


def store_options(location: str | Path) -> str:
    """See `runner.store.store_options`: the options a printed command needs to find a store."""
    from runner.store import store_options as options

    return options(location)


def _shown(url: str) -> str:
    """A store's URL as it may be printed (its password as ***)."""
    from runner.store import shown_url

    return shown_url(url)


def resume_target(state: RunState, store_opts: str = "") -> str:
    """What follows `runner resume` in a command printed for this run: its id, the options that
    find its store, and `--api-key KEY` for a run given its key on the command line."""
    return state.run_id + store_opts + (" --api-key KEY" if state.config.endpoint.api_key_given else "")


def next_steps(state: RunState, store_opts: str = "") -> list[str]:
    """What a person can do next with a stopped run, one line each (empty when it is final);
    `store_opts` (see `store_options`) goes into every command."""
    rid = resume_target(state, store_opts)
    it = state.interruption
    if it is not None and it.type == "approval" and it.call_id in state.approved:
        return [f"approved: {it.tool_name}({json.dumps(it.args)})  call id {it.call_id}; a resume carries it out",
                f"resume with: runner resume {rid}"]
    if it is not None and it.type == "approval":
        return [f"waiting for approval: {it.tool_name}({json.dumps(it.args)})  call id {it.call_id}"
                + ("  [in doubt: it may already have run]" if it.in_doubt else ""),
                f"approve with: runner resume {rid} --approve {it.call_id}",
                f"reject with:  runner resume {rid} --reject {it.call_id} --reason TEXT"]
    if state.status == "max_turns_exceeded":
        return [f"resume with N > {state.turns} (0: no cap): runner resume {rid} --max-turns N"]
    if state.status == "budget_exceeded":
        budget = it if it is not None and it.type == "max_budget" else None
        if budget is not None and budget.limit_tokens is not None:
            spent = budget.used_tokens if budget.used_tokens is not None else budget.limit_tokens
            least = f"N >= {budget.needs_tokens:,}" if budget.needs_tokens else f"N > {spent:,}"
            return [f"resume with {least} (0: no cap): runner resume {rid} --max-tokens-total N"]
        if budget is not None and budget.limit_wall_s is not None:
            return [f"resume with S > {state.wall_ms / 1000:.1f} (0: no cap): runner resume {rid} --max-wall-s S"]
        needs = budget.needs_usd if budget is not None and budget.needs_usd else None
        least = f"USD >= {needs:.6f}" if needs else f"USD > {state.cost_usd:.6f}"
        return [f"resume with {least} (0: no budget): runner resume {rid} --max-budget USD"]
    if state.status in ("interrupted", "running"):
        moved = it is not None and it.type == "provider_unavailable" and state.config.endpoint.kind == "url"
        return [f"resume with: runner resume {rid}"] + (
            [f"if the provider moved: runner resume {rid} --base-url URL"] if moved else [])
    return []


def result_json(state: RunState) -> dict[str, Any]:
    """The `--json` shape of a run: its `RunResult`."""
    from runner.result import RunResult

    return RunResult.of(state).model_dump(mode="json")
