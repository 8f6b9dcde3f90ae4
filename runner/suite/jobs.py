"""The runs of a suite: each (model column, task, repeat) saved as a queued run before any is
driven, then driven by a `runner.fanout` executor, and graded as it stops."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from runner import fanout, steering
from runner.endpoints import Endpoint
from runner.fanout import Batch, Executor
from runner.resources import tasks_dir
from runner.result import RunResult
from runner.state import Limits, RunConfig, RunState, new_run
from runner.store import RunStore, StoreAt
from runner.suite.format import SUITE_CATALOG, SUITE_TOOLS, SuiteDefinition, Task
from runner.suite.grading import grade, grade_end_state
from runner.suite.results import TaskResult


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
            where = {} if suite.default else offered(suite)
            if workspace is not None:
                where["workspace"] = workspace
            if task.approve:
                where["auto_approve_tools"] = ["*"] if task.approve == "all" else list(task.approve)
            config = RunConfig(endpoint=endpoint, limits=Limits(max_turns=max_turns), max_tokens=max_tokens,
                               **overrides, **where)
            state = new_run(task.prompt, config, system=suite.system + addendum)
            if config.steering:
                steering.opening(state, Path(config.workspace) if config.workspace else tasks_dir() / "workspace")
            fanout.create(state, location)
            key = f"{suite.name}/{task.id}" if qualified else task.id
            jobs[state.run_id] = Job(column=column, suite=suite, task=task, key=key, repeat=repeat)
            run_ids.append(state.run_id)
    return run_ids


def offered(suite: SuiteDefinition) -> dict[str, Any]:
    """The `RunConfig` fields of what a suite's runs work with: its workspace, its built-in
    tools and their catalog, its own tools (by name and where each is imported from) and its
    MCP servers (their tools under their own names)."""
    import shlex

    from runner.state import McpServer
    from runner.suite.loading import installed_program

    servers = []
    for name, server in suite.mcp.items():
        program, *args = shlex.split(server.command)
        servers.append(McpServer(name=name, command=[installed_program(program) or program, *args], prefix="",
                                 tools=list(server.tools), allow=list(server.allow)))
    return {"workspace": str(suite.workspace), "tools": [*(suite.tools or SUITE_TOOLS), *suite.own_tools],
            "builtin_tools": suite.catalog or SUITE_CATALOG,
            "tool_refs": {name: suite.tool_ref(name) for name in suite.own_tools}, "mcp": servers}


REFUSED_WRITE = "this task does not allow that call"
"""The reason a suite gives the model when it rejects a call the task does not approve."""


def drive_jobs(executor: Executor, batches: list[Batch], location: StoreAt, jobs: Jobs,
               on_result: Callable[[TaskResult], None] | None) -> list[TaskResult]:
    """Drive the batches to their stops; each run's graded result, in batch order. A run that
    stops for approval of a call its task does not approve gets the call rejected (the model
    reads `REFUSED_WRITE`) and is driven on, until it stops otherwise (its turn cap ends it)."""
    runs = fanout._store(location)

    def result_of(state: RunState, where: str) -> TaskResult:
        job = jobs[state.run_id]
        return graded(job, state, runs.existing_workspace(state.run_id)).model_copy(update={"driven_by": where})

    def done(state: RunState, where: str) -> None:
        if on_result is not None and not _waits_for_verdict(state):
            on_result(result_of(state, where))

    stopped = executor.drive(batches, location, done)
    while not executor.cancelled:
        waiting = {state.run_id for state, _ in stopped if _waits_for_verdict(state)}
        if not waiting:
            break
        for run_id in waiting:
            _reject_pending(runs, run_id)
        again = executor.drive([Batch(b.endpoint, [r for r in b.run_ids if r in waiting]) for b in batches
                                if waiting & set(b.run_ids)], location, done)
        latest = {state.run_id: (state, where) for state, where in again}
        stopped = [latest.get(state.run_id, (state, where)) for state, where in stopped]
    return [result_of(state, where) for state, where in stopped]


def _waits_for_verdict(state: RunState) -> bool:
    """True if the run stopped to ask for approval of a call (a suite has no one to ask)."""
    return state.status == "interrupted" and state.interruption is not None and state.interruption.type == "approval"


def _reject_pending(runs: RunStore, run_id: str) -> None:
    """Reject the call the run waits on, with `REFUSED_WRITE`, and queue the run to go on."""
    from runner.harness import give_verdict

    lease = runs.claim(run_id)
    try:
        state = runs.load(run_id)
        it = state.interruption
        assert it is not None and it.type == "approval"
        give_verdict(runs, lease, state, it.call_id, "reject", REFUSED_WRITE)
        state.status, state.interruption, state.reason = "running", None, None
        runs.save(state, (), lease)
    finally:
        runs.release(lease, runnable=True)


def graded(job: Job, state: RunState, copy: Path | None) -> TaskResult:
    """The run's result and its grade: the reply, and the files afterwards (`copy`, the run's
    own copy of the workspace; None when no tool wrote) when the task grades them."""
    task = job.task
    results = [m.content or "" for m in state.messages if m.role == "tool"]
    offered = [*state.config.tools, *(name for server in state.config.mcp for name in server.listing)]
    reply = grade(task, state.answer, state.tool_run_count, results, offered)
    before = Path(state.config.workspace) if state.config.workspace else job.suite.workspace
    end = grade_end_state(task, before, copy or before)
    correct = reply.correct and (end is None or end.right)
    why = reply.why if not reply.correct else None if end is None or end.right else f"end state: {end.why}"
    return TaskResult(
        **(RunResult.of(state).model_dump() | {"wall_ms": round(state.wall_ms, 1), "model": job.column.label}),
        provider="scripted" if job.column.scripted else "local", task=job.key, suite=job.suite.name,
        split=job.suite.split, mean_turn_ms=round(statistics.fmean(t.ms for t in state.per_turn), 1) if state.per_turn else 0.0,
        correct=correct, why_wrong=why, verdict=reply.verdict if end is None or end.right else "wrong",
        shape=task.shape, reply_verdict=reply.verdict, end_state_right=None if end is None else end.right,
        end_state_why=None if end is None else end.why, files_damaged=[] if end is None else end.damaged,
        calls=sum(len(m.tool_calls or []) for m in state.messages if m.role == "assistant"),
        invalid_calls=sum(1 for r in state.tool_runs if r.source == "invalid"),
        repeat=job.repeat, turn_ms=[round(t.ms, 1) for t in state.per_turn],
    )


def _model_for(column: Endpoint, task: Task) -> str:
    """The model name a run of `task` sends: scripted runs name their scenario (the task id)."""
    return f"scripted/{task.id}" if column.scripted else column.model
