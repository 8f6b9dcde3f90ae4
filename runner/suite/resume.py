"""Finishing a cancelled suite: the runs its report lists as unfinished or cancelled are
queued again and driven where they stopped (nothing paid twice)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from runner import fanout
from runner.endpoints import Endpoint
from runner.errors import UsageError
from runner.fanout import Batch, Executor, LocalExecutor
from runner.resources import tasks_dir
from runner.store import Durability, RunStore, StoreAt
from runner.suite.format import SuiteDefinition
from runner.suite.jobs import Job, Jobs, drive_jobs
from runner.suite.loading import load_suite
from runner.suite.results import SuiteReport, TaskResult, cancelled
from runner.suite.stats import scores, summarize


def _first_problem(exc: Exception) -> str:
    """A report that does not parse, in one line: pydantic's first complaint and where, else `exc`."""
    if isinstance(exc, ValidationError) and (errors := exc.errors()):
        where = ".".join(str(part) for part in errors[0]["loc"])
        return f"{errors[0]['msg']}{f' (at {where})' if where else ''}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def resume_suite(report_file: Path, runs_root: Path, *, executor: Executor | None = None,
                 on_result: Callable[[TaskResult], None] | None = None, store_location: str | None = None,
                 durability: Durability = "process") -> SuiteReport:
    """Finish a cancelled suite: drive the runs its report lists as unfinished or cancelled
    (each resumed where it stopped, nothing paid twice); returns a report of every run.

    Args:
        report_file: the cancelled suite's JSON report (its .md path works too).
        runs_root, executor, on_result, store_location, durability: as `run_suite` (the runs
            must be in that store).

    Raises:
        UsageError: a file not named as a report, an unreadable report, or one with nothing
            left to run.
        RunNotFound: a run of the report is not in the store.
    """
    if report_file.suffix not in (".json", ".md"):
        raise UsageError(f"--resume {report_file}: not a suite report (give the suite-*.json a suite wrote, or its .md)")
    path = report_file.with_suffix(".json")
    try:
        old = SuiteReport.model_validate_json(path.read_text())
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else _first_problem(exc)
        read = f" (read as {path.name})" if path != report_file else ""
        raise UsageError(f"cannot read the suite report {report_file}{read}: {why}") from None
    todo = [r.run_id for r in old.results if cancelled(r)] + old.unfinished
    if not todo:
        raise UsageError(f"nothing to resume: every run of {path} finished")
    suites = [load_suite(Path(ref.path)) for ref in old.suites] or [load_suite()]
    location = StoreAt(store_location or str(runs_root.resolve()), durability)
    kept = [r for r in old.results if not cancelled(r)]
    jobs = _requeue(fanout._store(location), todo, kept, {r.run_id: r for r in old.results}, suites)
    columns = {job.column.label: job.column for job in jobs.values()}
    executor = executor or LocalExecutor()
    batches = [Batch(c, [rid for rid, job in jobs.items() if job.column.label == c.label]) for c in columns.values()]
    order = {m: i for i, m in enumerate(old.models)}
    task_order = {key: i for i, key in enumerate(_keys(suites))}
    results = kept + drive_jobs(executor, batches, location, jobs, on_result)
    results.sort(key=lambda r: (order.get(r.model, len(order)), task_order.get(r.task, 0), r.repeat))
    finished = {r.run_id for r in results}
    return old.model_copy(update={
        "results": results, "cancelled": executor.cancelled, "summaries": summarize(results), "scores": scores(results),
        "shapes": scores(results, by_shape=True),
        "unfinished": [rid for rid in todo if rid not in finished], "report_path": None})


def _keys(suites: list[SuiteDefinition]) -> list[str]:
    """The key each task of `suites` is reported under, in order (SUITE/ID when several ran)."""
    return [f"{s.name}/{t.id}" if len(suites) > 1 else t.id for s in suites for t in s.tasks]


def _requeue(runs: RunStore, todo: list[str], kept: list[TaskResult], known: dict[str, TaskResult],
             suites: list[SuiteDefinition]) -> Jobs:
    """Queue again the runs Ctrl-C stopped (as they were), and find each run's column, suite,
    task and repeat (the suite by the run's workspace, the task by its prompt; the repeat from
    the old report, or counted after the finished ones)."""
    columns: dict[str, Endpoint] = {}
    jobs: Jobs = {}
    for run_id in todo:
        state = runs.load(run_id)
        if state.status == "interrupted":
            lease = runs.claim(run_id)
            state.status, state.interruption, state.reason = "running", None, None
            runs.save(state, (), lease)
            runs.release(lease, runnable=True)
        endpoint = state.config.endpoint
        column = columns.setdefault(endpoint.label, endpoint.model_copy(update={"model": "scripted"})
                                    if endpoint.scripted else endpoint)
        prompt = next(m.content for m in state.messages if m.role == "user")
        folder = Path(state.config.workspace).parent if state.config.workspace else tasks_dir().resolve()
        suite = next((x for x in suites if x.folder == folder), suites[0])
        task = next(t for t in suite.tasks if t.prompt == prompt)
        key = f"{suite.name}/{task.id}" if len(suites) > 1 else task.id
        done = sum(1 for r in kept if (r.model, r.task) == (column.label, key))
        repeat = known[run_id].repeat if run_id in known else done + 1 + sum(
            1 for j in jobs.values() if (j.column.label, j.key) == (column.label, key))
        jobs[run_id] = Job(column=column, suite=suite, task=task, key=key, repeat=repeat)
    return jobs
