"""What a run came to, as data: `RunResult`, built from a stopped `RunState`.

`runner.harness.execute` returns it, `runner run --json` and `runner resume --json` print it,
and the suite records one per task (`runner.suite.TaskResult` extends it with the grading).
The state holds the whole run (messages, per-turn records, tool runs); the result is the part a
caller decides on: how it stopped, what it answered, what it cost.
"""

from __future__ import annotations

from pydantic import BaseModel

from runner.state import FINAL_STATUSES, EngineTimings, Interruption, RunError, RunState, RunStatus


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

    @classmethod
    def of(cls, state: RunState) -> RunResult:
        return cls(
            run_id=state.run_id, parent_run_id=state.parent_run_id, model=state.config.endpoint.model,
            status=state.status, reason=state.reason, interruption=state.interruption, error=state.error,
            answer=state.answer, answer_unsupported=state.answer_unsupported, turns=state.turns, tool_runs=state.tool_run_count,
            prompt_tokens=state.prompt_tokens, completion_tokens=state.completion_tokens,
            cost_usd=round(state.cost_usd, 9), child_cost_usd=round(state.child_cost_usd, 9),
            wall_ms=round(state.wall_ms, 3), per_turn_prompt_tokens=[t.prompt_tokens for t in state.per_turn],
            per_turn_engine=([t.engine for t in state.per_turn] if any(t.engine for t in state.per_turn) else []),
        )

    @property
    def resumable(self) -> bool:
        """True when `runner resume` can continue the run (it did not complete or fail)."""
        return self.status not in FINAL_STATUSES
