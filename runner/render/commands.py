"""What each remaining command prints at its end, text or `--json` (stdout: the result;
stderr: `say`): `runner run` and `resume`, `trace`, `repair`, `models`, `policies`, `worker`,
`config show`, `export` and `view`; and what a run driven in this terminal shows while it runs."""

from __future__ import annotations

import dataclasses
import json
import shutil
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from runner.render.stop import _shown, result_json, resume_target, run_lines, store_options
from runner.render.terminal import TurnLine, _wrapped, error, print_table, say, terminal_width, wrap
from runner.render.transcript import trace_lines

if TYPE_CHECKING:
    from runner.interactive import Feedback
    from runner.models import ModelStatus
    from runner.otel import ExportReport
    from runner.start import Started
    from runner.state import RunState
    from runner.store import RepairReport, RunInfo, RunStore
    from runner.trace import TraceEvent
    from runner.worker import WorkerReport


def print_policies(as_json: bool) -> None:
    """`runner policies`: each policy and what it does, then the policies of each manifest
    model (with answer_forcing's number of tool turns), then the server policies of `runner
    serve --steer` and each model's default set of them."""
    import json

    from runner import models
    from runner import steering as policies
    from runner.steering.registry import DEFAULT_ANSWER_AFTER_TURNS
    from runner.steering.serve import SERVER_POLICIES

    entries = models.load_manifest().models
    by_model = {entry.name: policies.active_for_entry(entry) for entry in entries}
    forcing = {entry.name: entry.answer_after_tool_turns for entry in entries}
    served = {entry.name: entry.serve_policies for entry in entries}
    if as_json:
        print(json.dumps({"policies": policies.POLICIES, "models": by_model, "answer_after_tool_turns": forcing,
                          "scopes": {p.name: {"hooks": list(p.hooks), "scope": p.scope, "where": list(p.where)}
                                     for p in policies.REGISTRY},
                          "serve_policies": SERVER_POLICIES, "serve_models": served}, indent=2))
        return

    width = min(shutil.get_terminal_size((80, 24)).columns, 100)

    def model_line(model: str, names: str) -> None:
        print(textwrap.fill(f"{model}: {names or 'none'}", width, subsequent_indent="    "))

    for policy in policies.REGISTRY:
        print(policy.name)
        print(textwrap.fill(policy.description, width, initial_indent="    ", subsequent_indent="    "))
        print(textwrap.fill(f"applies to: {policy.scope}; runs in: {', '.join(policy.where)}", width,
                            initial_indent="    ", subsequent_indent="      "))
    print()
    for model, names in by_model.items():
        turns = forcing[model]
        shown = [n + (f" (after {turns} tool turn{'s' if turns != 1 else ''})" if n == "answer_forcing" and turns else "")
                 for n in policies.POLICIES if n in names]
        model_line(model, ", ".join(shown))
    print()
    print(textwrap.fill("runner serve --steer runs the policies above that run in serve on a client's conversation: "
                        "on applies them all, default each model's set below, off none.", width))
    print()
    for model, names in served.items():
        after = forcing[model] or DEFAULT_ANSWER_AFTER_TURNS
        model_line(model, ", ".join(n + (f" (N={after})" if n == "answer_forcing" else "") for n in names))


def repair_lines(report: RepairReport, store_opts: str = "") -> list[str]:
    """What `runner repair` did: the save it rebuilt from, what it dropped, what may have
    happened outside the kept state, and how to continue (`store_opts`: see `store_options`)."""
    if report.kept_seq == report.new_seq:
        return [f"run {report.run_id}: " + "; ".join(report.notes)]
    return [f"repaired run {report.run_id}: rebuilt from save {report.kept_seq} (now save {report.new_seq})",
            f"dropped {len(report.dropped)}:" if report.dropped else "dropped: nothing committed after it",
            *(f"  {line}" for line in report.dropped),
            "may have happened outside the kept state:" if report.outside else "nothing started outside it",
            *(f"  {line}" for line in report.outside),
            *(f"note: {line}" for line in report.notes),
            f"it is {report.status}: nothing to resume" if report.status in ("completed", "failed")
            else f"continue it with: runner resume {report.run_id}{store_opts}"]


def repaired(report: RepairReport, runs: RunStore, as_json: bool) -> None:
    """`runner repair` on `runs`: what it did (see `repair_lines`), or with `as_json` the
    report as JSON."""
    lines = repair_lines(report, store_options(runs.url))
    fitted = (part for line in lines for part in _wrapped(line, max(terminal_width(), 40), "  "))
    print(json.dumps(dataclasses.asdict(report)) if as_json else "\n".join(fitted))


def print_models(rows: Sequence[ModelStatus], as_json: bool = False) -> None:
    """The `runner models list` table, or with `as_json` each model's status."""
    if as_json:
        print(json.dumps([r.model_dump(mode="json") for r in rows]))
        return
    print_table([("name", "id"), ("present", "id"), ("source", "id"), ("size MB", "num")],
                [[r.name, "yes" if r.present else "no", r.source, f"{r.size_bytes / 1e6:.0f}" if r.size_bytes else "-"]
                 for r in rows])
    print("where each is (or goes when pulled):")  # whole: a path cut short says nothing of where
    pad = max((len(r.name) for r in rows), default=0)
    print("".join(f"  {r.name:<{pad}}  {r.path or '-'}\n" for r in rows), end="")


def unkept(state: RunState) -> None:
    """Why a new run that never got a reply from its endpoint was not kept (as `error` prints)."""
    error(state.reason or "no reply")
    say(f"not kept: run {state.run_id} never got a reply; --keep keeps such runs")


def worker_done(report: WorkerReport) -> None:
    """The worker's last line: how many runs it drove, how they stopped, and its errors."""
    from collections import Counter

    stops = ", ".join(f"{n} {status}" for status, n in Counter(report.driven.values()).most_common())
    say(f"worker: drove {len(report.driven)} run(s){': ' + stops if stops else ''}; {len(report.errors)} error(s)")


def created_runs_dir(path: Path) -> None:
    say(f"created runs directory {path}")


def live_feedback(show_progress: bool = True, runs: RunStore | None = None) -> Feedback:
    """What a run driven in this terminal shows on stderr: the local model it starts, the live
    turn line and each tool's progress (only with `show_progress`), each retry of a failed
    request, a Ctrl-C while it runs (what stopping waits for), and a Ctrl-C that stopped it
    before the loop ran (how to continue it, with the options that find `runs`)."""
    from runner.interactive import Feedback

    turn_line = TurnLine()

    def on_progress(tool: str, label: str, ms: float) -> None:
        say(f"  progress: {tool}: {label}  (t+{ms:,.0f} ms)")

    def on_retry(attempt: int, most: int, error: str, wait_s: float) -> None:
        turn_line.close()
        say(wrap(f"  retry {attempt}/{most} in {wait_s:.1f} s: {' '.join(error.split())}"))

    def on_stopping(presses: int) -> None:
        turn_line.close()
        say(wrap("stopping at the run's next step: a model request is cut off; a running tool is asked to stop, "
                 "and one that does not check finishes first" if presses == 1 else
                 "still stopping: waiting for the running step to end (a kill -9 leaves the run resumable too)"))

    def on_stopped_early(state: RunState) -> None:
        again = resume_target(state, store_options(runs.url) if runs is not None else "")
        say(f"{state.status}: run {state.run_id}; continue it with: runner resume {again}")

    if not show_progress:
        return Feedback(on_retry=on_retry, on_stopping=on_stopping, on_stopped_early=on_stopped_early,
                        on_end=turn_line.close)
    return Feedback(on_note=say, on_progress=on_progress, on_turn=turn_line, on_retry=on_retry,
                    on_stopping=on_stopping, on_stopped_early=on_stopped_early, on_end=turn_line.close)


def started(started: Started, runs: RunStore, as_json: bool) -> None:
    """The end of `runner run` and `runner resume`: the run at its stop, a queued run and how
    a worker gets it, or why a new run was not kept (stderr); with `as_json`, its `RunResult`
    (with status "queued", or "kept": false)."""
    from runner.store import FileStore

    state, store_opts = started.state, store_options(runs.url)
    if as_json:
        marks = {"status": "queued"} if started.queued else {} if started.kept else {"kept": False}
        print(json.dumps({**result_json(state), **marks}))
        if not started.kept:
            unkept(state)  # on stderr, as without --json: the id printed names no stored run
    elif started.queued:
        print(f"queued run {state.run_id}; a worker drives it: runner worker{store_opts}")
    elif not started.kept:
        unkept(state)
    else:
        trace_at = (str(runs.trace_path(state.run_id)) if isinstance(runs, FileStore)
                    else f"runner trace {state.run_id}{store_opts}")
        print("\n".join(run_lines(state, trace_at, terminal_width(), store_opts)))


def trace(events: Sequence[TraceEvent], info: RunInfo | None, runs: RunStore, as_json: bool) -> None:
    """`runner trace`: a warning on stderr per problem reading it in `runs`, then the trace
    (see `trace_lines`), or with `as_json` each event as a line of JSON."""
    for problem in getattr(runs, "problems", []):
        say(f"warning: {problem}")
    if as_json:
        print("".join(e.model_dump_json(exclude_none=True) + "\n" for e in events), end="")
    else:
        print("\n".join(trace_lines(events, info, terminal_width(), store_options(runs.url))))


def settings(rows: Sequence[tuple[str, str, str]], files: Sequence[Path], user_file: Path, as_json: bool) -> None:
    """`runner config show`: the config files read, then each setting's (name, value, source)."""
    if as_json:
        print(json.dumps({"files": [str(p) for p in files],
                          "settings": [{"name": n, "value": v, "source": src} for n, v, src in rows]}))
        return
    print("config files read: " + (", ".join(map(str, files)) if files else f"none (./runner.toml or {user_file})"))
    print_table([("setting", "id"), ("value", "text"), ("source", "path")], [list(r) for r in rows])


def exported(report: ExportReport, as_json: bool) -> None:
    """What `runner export` sent: each run's trace id (and whether it is unfinished), then the
    spans sent; or with `as_json` the report as JSON."""
    if as_json:
        print(json.dumps(dataclasses.asdict(report)))
        return
    waits = "  (not stopped: its invoke_agent span waits)"
    for run_id, trace_id in report.traces.items():
        print(f"{run_id}  trace {trace_id}" + (waits if run_id in report.unfinished else ""))
    again = " (all were sent before)" if not report.spans_sent else ""
    print(f"sent {report.spans_sent} span(s) to {report.endpoint}{again}")


def view_ready(where: str, token: str | None) -> Callable[[str], None]:
    """What `runner view` prints once it listens: its URL, the store, how to stop it."""
    how = "; open it once as URL?token=TOKEN" if token else ""
    return lambda url: print(f"runner view: {url}  (store: {_shown(where)}; Ctrl-C stops{how})", flush=True)
