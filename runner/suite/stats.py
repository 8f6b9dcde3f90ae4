"""Statistics over a suite's results: the Wilson interval of a rate, percentiles of turn
times, per-task summaries, per-model scores and totals."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Iterable, Sequence

from runner.suite.results import Score, TaskResult, TaskSummary, cancelled


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion, (low, high); (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def scores(results: list[TaskResult], by_shape: bool = False) -> list[Score]:
    """A `Score` per (model column, split), in the order first seen; with `by_shape`, per
    (model column, split, task shape), and none when every task is a question. Runs Ctrl-C
    stopped are left out."""
    if by_shape and all(r.shape == "question" for r in results):
        return []
    groups: dict[tuple[str, str, str], list[TaskResult]] = {}
    for r in results:
        if not cancelled(r):
            groups.setdefault((r.model, r.split or r.suite or "six-task", r.shape if by_shape else ""), []).append(r)
    out = []
    for (model, split, shape), rs in groups.items():
        verdicts = Counter(r.verdict if r.verdict != "wrong" or not r.correct else "correct" for r in rs)
        low, high = wilson(verdicts["correct"], len(rs))
        graded = [r for r in rs if r.end_state_right is not None]
        out.append(Score(model=model, split=split, n=len(rs), correct=verdicts["correct"], wrong=verdicts["wrong"],
                         abstained=verdicts["abstained"], correct_low=round(low, 3), correct_high=round(high, 3),
                         shape=shape, end_state_graded=len(graded),
                         end_state_right=sum(bool(r.end_state_right) for r in graded),
                         files_damaged=sum(len(r.files_damaged) for r in rs)))
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's
    default); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(results: list[TaskResult]) -> list[TaskSummary]:
    """One `TaskSummary` per (model, task), in the order first seen. A run stopped by Ctrl-C
    is unfinished, not wrong: it counts in no pass rate or mean (the report lists it)."""
    groups: dict[tuple[str, str], list[TaskResult]] = {}
    for r in results:
        if cancelled(r):
            continue
        groups.setdefault((r.model, r.task), []).append(r)
    out = []
    for (model, task), rs in groups.items():
        turn_ms = [ms for r in rs for ms in r.turn_ms]
        passed = sum(r.correct for r in rs)

        def mean(values: Iterable[float]) -> float:
            return round(statistics.fmean(values), 3)

        out.append(TaskSummary(
            model=model, provider=rs[0].provider, task=task, runs=len(rs), passed=passed,
            pass_rate=round(passed / len(rs), 3), statuses=dict(Counter(r.status for r in rs)),
            turns=mean(r.turns for r in rs), tool_runs=mean(r.tool_runs for r in rs),
            prompt_tokens=mean(r.prompt_tokens for r in rs), completion_tokens=mean(r.completion_tokens for r in rs),
            cost_usd=round(statistics.fmean(r.cost_usd for r in rs), 9), wall_ms=round(mean(r.wall_ms for r in rs), 1),
            turn_ms_mean=round(statistics.fmean(turn_ms), 1) if turn_ms else 0.0,
            turn_ms_p50=round(percentile(turn_ms, 50), 1), turn_ms_p95=round(percentile(turn_ms, 95), 1),
        ))
    return out


def totals(results: list[TaskResult]) -> dict[str, float]:
    """Sums over tasks (turns, tool runs, tokens, cost USD, wall ms), the mean turn ms, correct count."""
    turns = sum(r.turns for r in results)
    wall = sum(r.wall_ms for r in results)
    return {
        "turns": turns, "tool_runs": sum(r.tool_runs for r in results),
        "prompt_tokens": sum(r.prompt_tokens for r in results),
        "completion_tokens": sum(r.completion_tokens for r in results),
        "cost_usd": round(sum(r.cost_usd for r in results), 6), "wall_ms": round(wall, 1),
        "mean_turn_ms": round(sum(r.mean_turn_ms * r.turns for r in results) / turns, 1) if turns else 0.0,
        "correct": sum(r.correct for r in results),
        "calls": sum(r.calls for r in results),
        "invalid_calls": sum(r.invalid_calls for r in results),
        "tasks_with_a_call": sum(r.calls > 0 for r in results),
    }
