"""The runs of a suite: each (model column, task, repeat) saved as a queued run before any is
driven, then driven by a `runner.fanout` executor, and graded as it stops."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from runner import fanout, policies
from runner.endpoints import Endpoint
from runner.fanout import Batch, Executor
from runner.resources import tasks_dir
from runner.result import RunResult
from runner.state import Limits, RunConfig, RunState, new_run
from runner.store import StoreAt
from runner.suite.format import SUITE_CATALOG, SUITE_TOOLS, SuiteDefinition, Task
from runner.suite.grading import grade
from runner.suite.results import Provider, TaskResult


class Job(BaseModel):
    """What one run of a suite is: its model column, suite, task, the key reports name the
    task by (SUITE/ID when several suites ran), and which repeat."""

    model_config = {"arbitrary_types_allowed": True}
    column: Endpoint
    suite: SuiteDefinition
    task: Task
    key: str
    repeat: int


Jobs = dict[str, Job]
"""Run id -> the job of each run a suite drives."""


def create_runs(suite: SuiteDefinition, column: Endpoint, location: StoreAt, jobs: Jobs, repeats: int, max_turns: int,
                 max_tokens: int | None, qualified: bool, harness: dict[str, Any], addendum: str,
                 workspace: str | None = None) -> list[str]:
    """Save every task x repeat of one suite on one column as a queued run (recorded in
    `jobs`); returns their ids. Each run records how `runner resume` reaches its endpoint
    again, and the folder it works over (`workspace`, else the suite's own) and its tools."""
    run_ids = []
    for task in suite.tasks:
        for repeat in range(1, repeats + 1):
            overrides = dict(harness)  # endpoint settings (e.g. first_turn_tool_choice) go on the endpoint
            moved = {k: overrides.pop(k) for k in list(overrides) if k in Endpoint.model_fields}
            endpoint = column.model_copy(update={"model": _model_for(column, task), **moved})
            where: dict[str, Any] = {} if suite.default else {
                "workspace": str(suite.workspace), "tools": list(suite.tools or SUITE_TOOLS),
                "builtin_tools": suite.catalog or SUITE_CATALOG}
            if suite.tools is not None:
                where["tools"] = list(suite.tools)
            if workspace is not None:
                where["workspace"] = workspace
            config = RunConfig(endpoint=endpoint, limits=Limits(max_turns=max_turns), max_tokens=max_tokens,
                               **overrides, **where)
            state = new_run(task.prompt, config, system=suite.system + addendum)
            if config.steering:
                policies.opening(state, Path(config.workspace) if config.workspace else tasks_dir() / "workspace")
            fanout.create(state, location)
            key = f"{suite.name}/{task.id}" if qualified else task.id
            jobs[state.run_id] = Job(column=column, suite=suite, task=task, key=key, repeat=repeat)
            run_ids.append(state.run_id)
    return run_ids


def drive_jobs(executor: Executor, batches: list[Batch], location: StoreAt, jobs: Jobs,
           on_result: Callable[[TaskResult], None] | None) -> list[TaskResult]:
    """Drive the batches to their stops; each run's graded result, in batch order."""

    def result_of(state: RunState, where: str) -> TaskResult:
        job = jobs[state.run_id]
        return _result("scripted" if job.column.scripted else "local", job.task, state, job.suite, job.key).model_copy(
            update={"model": job.column.label, "repeat": job.repeat, "turn_ms": [round(t.ms, 1) for t in state.per_turn],
                    "driven_by": where})

    def done(state: RunState, where: str) -> None:
        if on_result is not None:
            on_result(result_of(state, where))

    return [result_of(state, where) for state, where in executor.drive(batches, location, done)]


def _result(provider: Provider, task: Task, state: RunState, suite: SuiteDefinition | None = None,
            key: str | None = None) -> TaskResult:
    results = [m.content or "" for m in state.messages if m.role == "tool"]
    found = grade(task, state.answer, state.tool_run_count, results)
    return TaskResult(
        **(RunResult.of(state).model_dump() | {"wall_ms": round(state.wall_ms, 1)}),
        provider=provider, task=key or task.id, suite=suite.name if suite else "", split=suite.split if suite else None,
        mean_turn_ms=round(statistics.fmean(t.ms for t in state.per_turn), 1) if state.per_turn else 0.0,
        correct=found.correct, why_wrong=found.why, verdict=found.verdict,
        calls=sum(len(m.tool_calls or []) for m in state.messages if m.role == "assistant"),
        invalid_calls=sum(1 for r in state.tool_runs if r.source == "invalid"),
    )


def _model_for(column: Endpoint, task: Task) -> str:
    """The model name a run of `task` sends: scripted runs name their scenario (the task id)."""
    return f"scripted/{task.id}" if column.scripted else column.model
