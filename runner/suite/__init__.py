"""Suites of tasks: the same harness on the scripted provider and on one or more local models,
side by side, each task repeated N times.

A suite is a folder: `suite.json` and `workspace/` (`docs/suite.md` has the format). The
six-task suite of `tasks/` is the default; the suites beside it (`tasks/*/suite.json`) form the
development set, each marked `dev` or `test`. One module per concern:

- `format`: the models of `suite.json`; `loading`: reading and checking it, the shipped suites,
  `--task` selection.
- `grading`: a run graded against its task.
- `jobs`, `running`, `resume`, `columns`: runs created, driven (this process or Ray), finished
  after Ctrl-C; the model columns and their harness settings.
- `results`: what a report holds; `stats`: Wilson intervals, percentiles, summaries, totals.

The names below load their module on first access, so importing one module of the package
(grading, say) loads only what that module needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.suite.columns import model_columns
    from runner.suite.format import SUITE_TOOLS, Check, SuiteDefinition, Task
    from runner.suite.loading import load_suite, select_tasks, shipped_suites
    from runner.suite.results import SuiteReport, TaskResult, TaskSummary
    from runner.suite.running import run_requested, run_suite
    from runner.suite.stats import percentile, scores, summarize, totals, wilson

_EXPORTS = {
    "model_columns": "columns",
    "SUITE_TOOLS": "format", "Check": "format", "SuiteDefinition": "format", "Task": "format",
    "load_suite": "loading", "select_tasks": "loading", "shipped_suites": "loading",
    "SuiteReport": "results", "TaskResult": "results", "TaskSummary": "results",
    "run_requested": "running", "run_suite": "running",
    "percentile": "stats", "scores": "stats", "summarize": "stats", "totals": "stats", "wilson": "stats",
}
__all__ = [
    "SUITE_TOOLS", "Check", "SuiteDefinition", "SuiteReport", "Task", "TaskResult", "TaskSummary",
    "load_suite", "model_columns", "percentile", "run_requested", "run_suite", "scores",
    "select_tasks", "shipped_suites", "summarize", "totals", "wilson",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runner.suite' has no attribute {name!r}")
    return getattr(importlib.import_module(f"runner.suite.{module}"), name)
