"""Running a suite: every task of its suites on every model column, repeated, on the local
executor or Ray (`runner.fanout`); `runner suite` is `run_requested`.

Every (model, task, repeat) is a normal saved run, created in the store before any is driven;
`runner trace` works on each. The report holds pass rates and turn-time percentiles over the
repeats (`runner.render.write_suite_report` writes it as `runs/suite-<timestamp>.json`, `.md`
and `.png`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

from runner import fanout, steering
from runner.endpoints import Endpoint
from runner.errors import UsageError
from runner.fanout import Batch, Executor, LocalExecutor, RayExecutor
from runner.request import SuiteRequest
from runner.store import Durability, FileStore, StoreAt, make_runs_dir
from runner.suite.columns import harness_settings, model_columns, policies_of
from runner.suite.format import SuiteDefinition
from runner.suite.jobs import Jobs, create_runs, drive_jobs
from runner.suite.loading import load_suite, select_tasks, shipped_suites
from runner.suite.results import SuiteRef, SuiteReport, TaskResult, ToolChoiceSetting
from runner.suite.resume import resume_suite
from runner.suite.stats import scores, summarize


def run_suite(provider: str, runs_root: Path, *, models: Sequence[str] = (), base_url: str | None = None,
              max_turns: int = 8, max_tokens: int | None = None, latency_ms: float = 0.0, repeats: int = 1,
              executor: Executor | None = None, columns: list[Endpoint] | None = None,
              on_result: Callable[[TaskResult], None] | None = None, on_note: Callable[[str], None] | None = None,
              store_location: str | None = None, durability: Durability = "process",
              run_settings: dict[str, Any] | None = None, system_addendum: str | None = None,
              suites: Sequence[SuiteDefinition] = (), policy_edits: Sequence[str] = (),
              workspace: str | None = None) -> SuiteReport:
    """Run every task of `suites` (default: the six-task suite) on every model column
    `repeats` times; returns the report (`runner.render.write_suite_report` writes it).

    Every (model, task, repeat) is saved as a run before `executor` drives any.

    Args:
        provider, models, base_url: the columns, as `model_columns`.
        max_turns: turn cap per task.
        max_tokens: cap on each reply, tokens (None: the server's default, 512 for runner serve).
        latency_ms: delay of every scripted reply, ms (the scripted column only); repeats: runs per (task, model).
        executor: a `runner.fanout` executor (`RayExecutor` fans out over a Ray cluster).
        columns: the model columns as endpoints, instead of `provider`, `models`, `base_url`
            and `latency_ms` (e.g. a scripted provider that is already running).
        store_location: where the runs live: a runs directory or a postgresql:// URL (default:
            `runs_root`).
        durability: what each committed transition survives (see `runner.store.Durability`).
        on_result: called with each task's result as its run stops.
        on_note: called with a line about each local model column (which file, which settings).
        run_settings: `RunConfig` fields for every local column's runs, over the manifest's
            (`harness_settings`), e.g. ``{"on_slip": "repeat"}``.
        system_addendum: text added to the suite's system prompt for local columns, instead of
            the manifest's ``system_addendum`` (None: the manifest's; "": none).
        suites: the suites to run, in order (`load_suite`, `select_tasks`); policy_edits:
            `--policy` values (`runner.steering.edited`); workspace: another folder to work over.

    Raises:
        UsageError, models.ModelNotFound: as `model_columns` and `_check_scripted`.
        RuntimeError: a server failed to start.
    """
    suites = list(suites) or [load_suite()]
    columns = columns or model_columns(provider, models, base_url, latency_ms, on_note)
    _check_scripted(suites, columns)
    executor = executor or LocalExecutor()
    local = [c for c in columns if not c.scripted]
    column_policies = {c.label: policies_of(c, *harness_settings(c, run_settings, system_addendum, policy_edits))
                for c in local}
    report = _new_report(suites, columns, executor, column_policies, base_url=base_url, max_turns=max_turns, repeats=repeats)
    location = StoreAt(store_location or str(runs_root.resolve()), durability)
    jobs: Jobs = {}
    batches = [Batch(column, [run_id for suite in suites for run_id in create_runs(
        suite, column, location, jobs, repeats, max_turns, max_tokens, len(suites) > 1,
        *harness_settings(column, run_settings, system_addendum, policy_edits), workspace)]) for column in columns]
    report.results = drive_jobs(executor, batches, location, jobs, on_result)
    finished = {r.run_id for r in report.results}
    report.unfinished = [run_id for batch in batches for run_id in batch.run_ids if run_id not in finished]
    report.summaries, report.scores = summarize(report.results), scores(report.results)
    report.shapes, report.cancelled = scores(report.results, by_shape=True), executor.cancelled
    if local:
        report.load_average = [round(x, 2) for x in os.getloadavg()]
        report.local_turns = executor.server_turns.get(local[0].label, [])
    return report


def _check_scripted(suites: list[SuiteDefinition], columns: list[Endpoint]) -> None:
    """The scripted provider answers a task with the scenario named as the task's id
    (`runner.scripted.SCENARIOS`): it has one for each of the six-task suite's tasks.

    Raises:
        UsageError: a scripted column with a task it has no scenario for.
    """
    from runner.scripted import SCENARIOS

    other = next((s.name for s in suites for t in s.tasks if not s.default and t.id not in SCENARIOS), None)
    if other is not None and any(c.scripted for c in columns):
        raise UsageError(f"the scripted provider answers only the six-task suite, not {other}: "
                         "run it with --provider local (or --model NAME)")


def _new_report(suites: list[SuiteDefinition], columns: list[Endpoint], executor: Executor,
                column_policies: dict[str, list[str]], **settings: Any) -> SuiteReport:
    """The report of a suite about to run: what runs, on which columns, with which policies
    (`column_policies`, per local column), how; no results yet."""
    local = [c for c in columns if not c.scripted]
    first: ToolChoiceSetting = "required" if local and "first_turn_required" in column_policies[local[0].label] else "auto"
    return SuiteReport(suites=[SuiteRef(name=x.name, split=x.split, path=str(x.folder), tasks=len(x.tasks))
                               for x in suites], model=local[0].label if local else None,
                       model_path=local[0].local_model if local else None, results=[],
                       models=[c.label for c in columns], executor="ray" if isinstance(executor, RayExecutor) else "local",
                       first_turn_tool_choice=first, policies=column_policies, **settings)


def run_requested(req: SuiteRequest, runs_root: Path, *, store_location: str | None = None,
                  durability: Durability = "process", on_note: Callable[[str], None] | None = None,
                  on_result: Callable[[TaskResult], None] | None = None,
                  on_runs_dir: Callable[[Path], None] | None = None) -> SuiteReport:
    """Run the suite as `runner suite` asks, or finish the cancelled one whose report
    `req.resume_report` names. The executor and the model columns are checked before anything
    is written; with no `store_location` the runs go to `runs_root`, made if it is missing
    (`on_runs_dir` is called with it then; a resumed suite's runs are there already). `on_note`, `on_result`: as `run_suite`.

    Raises:
        UsageError, models.ModelNotFound: as `runner.fanout.executor` and `model_columns`.
    """
    steering.edited([], req.policies)  # an unknown name is refused even when no column is local
    if req.max_turns < 1:
        raise UsageError(f"--max-turns {req.max_turns}: a suite always caps its tasks' turns; give 1 or more")
    suites = requested_suites(req)
    provider = req.provider or ("both" if len(suites) == 1 and suites[0].default else "local")
    executor = fanout.executor(req.executor, address=req.address, actors=req.actors)
    columns = (None if req.resume_report is not None
               else model_columns(provider, req.models, req.base_url, req.latency_ms, on_note=on_note))
    if req.resume_report is not None:  # its runs are in the store already: nothing to make
        return resume_suite(req.resume_report, runs_root, store_location=store_location, durability=durability,
                            on_result=on_result, executor=executor)
    assert columns is not None
    _check_scripted(suites, columns)
    made_dir = make_runs_dir(FileStore(runs_root)) if store_location is None else None
    if made_dir is not None and on_runs_dir is not None:
        on_runs_dir(made_dir)
    return run_suite(provider, runs_root, models=req.models, base_url=req.base_url, max_turns=req.max_turns,
                     max_tokens=req.max_tokens, repeats=req.repeats, store_location=store_location,
                     durability=durability, on_result=on_result, columns=columns, executor=executor, suites=suites,
                     policy_edits=req.policies, workspace=req.workspace_path)


def requested_suites(req: SuiteRequest) -> list[SuiteDefinition]:
    """The suites `runner suite` asks for: each --suite folder, then the shipped suites of
    --split, cut to the --task ids; the six-task suite when none is named.

    Raises:
        UsageError: as `load_suite` and `select_tasks`; a folder given twice.
    """
    if req.resume_report is not None:
        return []
    folders = [*req.suites, *(shipped_suites(req.split) if req.split else [])]  # type: ignore[arg-type]
    suites = [load_suite(f) for f in folders] or [load_suite()]
    names = [s.name for s in suites]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise UsageError(f"the suite {twice!r} is named twice: give each suite once (a report names tasks SUITE/ID)")
    return select_tasks(suites, req.tasks)
