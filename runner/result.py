"""What a run came to, as data: `RunResult`, built from a stopped `RunState`.

`runner.harness.execute` returns it, `runner run --json` and `runner resume --json` print it,
and the suite records one per task (`runner.suite.TaskResult` extends it with the grading).
The state holds the whole run (messages, per-turn records, tool runs); the result is the part a
caller decides on: how it stopped, what it answered, what it cost, and what its writes did.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from runner.state import FINAL_STATUSES, EngineTimings, Interruption, RunError, RunState, RunStatus


class WriteOutcome(BaseModel, defer_build=True):
    """One call of a write tool of runner's (`write_file`, `edit_file`, `delete_file`: the tools
    that keep the write ledger) and what came of it."""

    call_id: str
    tool: str
    path: str | None = None
    """The file it named (None: its arguments named none)."""
    outcome: Literal["done", "refused", "failed"]
    """done: the tool wrote (its ledger holds it); refused: it did not run, declined by the
    user, refused by the tool before running (a file that exists without overwrite, a delete of
    a file that is not there), invalid arguments, or a limit reached first; failed: it ran and
    raised."""
    detail: str = ""
    """What the tool said it did (done), or why not."""


def writes_of(state: RunState) -> list[WriteOutcome]:
    """The calls of runner's own write tools in `state`, in order, with what came of each. A
    tool of one's own or an MCP server's is not among them, whatever it does: runner keeps no
    ledger of its writes."""
    import json

    from runner import catalog

    table = catalog.table(state.config)
    writers = {name for name in state.config.tools if name in table and not table[name].read_only
               and name not in state.config.tool_refs}
    calls = {c.id: c for m in state.messages if m.role == "assistant" for c in m.tool_calls or []}
    said = {m.tool_call_id: m.content or "" for m in state.messages if m.role == "tool"}
    out = []
    for record in state.tool_runs:
        call = calls.get(record.call_id)
        if record.tool_name not in writers or call is None or record.source == "cache":
            continue
        try:
            args = json.loads(call.function.arguments or "{}")
        except ValueError:
            args = {}
        path = args.get("path") if isinstance(args, dict) and isinstance(args.get("path"), str) else None
        outcome: Literal["done", "refused", "failed"] = (
            ("done" if record.ok else "failed") if record.source == "run" else "refused")
        out.append(WriteOutcome(call_id=record.call_id, tool=record.tool_name, path=path, outcome=outcome,
                                detail=said.get(record.call_id, "") if record.ok else record.error or ""))
    return out


class RunResult(BaseModel, defer_build=True):
    """One run at its stop. Tokens are counts, money USD, times ms."""

    run_id: str
    parent_run_id: str | None = None
    model: str
    """The model name the run sent."""
    status: RunStatus
    reason: str | None = None
    """Why the run stopped, in words."""
    interruption: Interruption | None = None
    """What a resumable stop waits for (an approval, a higher cap, the provider)."""
    error: RunError | None = None
    """The typed cause of a `failed` run."""
    answer: str = ""
    """The model's final prose when completed, else empty."""
    answer_unsupported: str | None = None
    """Set when the run's own review found the answer unsupported by any tool result: what it
    says that nothing returned."""
    turns: int = 0
    tool_runs: int = 0
    """Tool calls that really executed (cache hits and rejections excluded)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    """Total spend, child runs included."""
    child_cost_usd: float = 0.0
    wall_ms: float = 0.0
    """Wall time summed over every process that worked on the run."""
    per_turn_prompt_tokens: list[int] = []
    per_turn_engine: list[EngineTimings | None] = []
    """Each turn's local-engine account (prompt tokens reused and evaluated, prompt and
    generation ms, drafts), None for a turn without one; [] when no turn has one."""
    writes: list[WriteOutcome] = []
    """Every call of runner's write tools, in order: done, refused or failed (`writes_of`)."""
    files_changed: list[str] = []
    """The files a write of runner's changed, in order, each once: [] when every write was
    refused or failed (whatever the answer says)."""

    @classmethod
    def of(cls, state: RunState) -> RunResult:
        writes = writes_of(state)
        return cls(
            run_id=state.run_id, parent_run_id=state.parent_run_id, model=state.config.endpoint.model,
            status=state.status, reason=state.reason, interruption=state.interruption, error=state.error,
            answer=state.answer, answer_unsupported=state.answer_unsupported, turns=state.turns, tool_runs=state.tool_run_count,
            prompt_tokens=state.prompt_tokens, completion_tokens=state.completion_tokens,
            cost_usd=round(state.cost_usd, 9), child_cost_usd=round(state.child_cost_usd, 9),
            wall_ms=round(state.wall_ms, 3), per_turn_prompt_tokens=[t.prompt_tokens for t in state.per_turn],
            per_turn_engine=([t.engine for t in state.per_turn] if any(t.engine for t in state.per_turn) else []),
            writes=writes, files_changed=list(dict.fromkeys(w.path or "?" for w in writes if w.outcome == "done")),
        )

    @property
    def resumable(self) -> bool:
        """True when `runner resume` can continue the run (it did not complete or fail)."""
        return self.status not in FINAL_STATUSES
