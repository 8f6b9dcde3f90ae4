"""Everything runner shows a person, one module per kind of output: `terminal` (tables fitted
to the terminal, lines on stderr, the live turn and pull lines), `stop` (a run at its stop and
how to continue it), `transcript` (`runner show`, `runner trace`), `runs` (`runner runs`, its
totals and prunes), `suite_report` (the suite's table, Markdown report and plot) and `commands`
(what each other command prints at its end).

The library never prints: it returns data or reports through callbacks, and the CLI hands what
it gets to the functions here. Its names are re-exported here, so a caller writes
`render.say(...)` without knowing which module holds it.
"""

from __future__ import annotations

from runner.render.commands import (
    created_runs_dir,
    exported,
    live_feedback,
    print_models,
    print_policies,
    repaired,
    settings,
    started,
    trace,
    view_ready,
    worker_done,
)
from runner.render.runs import Total, own_cost, pruned, run_totals, runs_list, runs_totals
from runner.render.stop import store_options
from runner.render.suite_report import engine_summary, markdown, progress_line, suite_done, write_suite_report
from runner.render.terminal import PullLine, error, say, terminal_width, wrap
from runner.render.transcript import ANSWER_LINES, RESULT_LINES, gen_tok_s, trace_lines, transcript, transcript_lines

__all__ = [
    "ANSWER_LINES", "RESULT_LINES", "PullLine", "Total", "created_runs_dir", "engine_summary", "error",
    "exported", "gen_tok_s", "live_feedback", "markdown", "own_cost", "print_models", "print_policies",
    "progress_line", "pruned", "repaired", "run_totals", "runs_list", "runs_totals", "say", "settings",
    "started", "store_options", "suite_done", "terminal_width", "trace", "trace_lines", "transcript",
    "transcript_lines", "view_ready", "worker_done", "wrap", "write_suite_report",
]
