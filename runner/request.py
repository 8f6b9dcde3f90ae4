"""What a person asks a command for, as data: `RunRequest` (`runner run`), `ResumeRequest`
(`runner resume`), `SuiteRequest` (`runner suite`), `RunsRequest` (`runner runs`),
`WorkerRequest` (`runner worker`), `ServeRequest` (`runner serve`), `ScriptedServeRequest`
(`runner scripted serve`), `ViewRequest` (`runner view`) and `ExperimentsRequest` (`runner
experiments`).

Each field is one command-line option and carries its help text, its flags and click's settings
(`min`, `metavar`, ...) as field metadata, so an option is declared once: the CLI builds the
command's options from the fields, and the library (`runner.start.prepare`,
`runner.start.resume`, `runner.suite.run_requested`, `runner.local.serve_settings`, ...) takes
the request whole. A request whose options contradict each other raises `UsageError` when
made. Standard library only: `runner --help` reads these without loading pydantic. Every
command's start-up defines all nine classes, so they are made cheaply: requests are never
compared or printed (no generated `__eq__`, `__hash__` or `__repr__`: each is Python source the
dataclass compiles; a frozen request hashes by identity), and the annotations are evaluated as
the module runs (no `from __future__ import annotations`: the CLI reads every field's type).
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from runner.errors import UsageError

DEFAULT_MAX_TURNS = 20
"""= runner.state.DEFAULT_MAX_TURNS, for the help text (a test checks they agree): importing
runner.state here would load pydantic for `runner --help`."""


def option(default: Any, help: str, *flags: str, **click: Any) -> Any:
    """A field that is a command-line option: its default, its help text, its flags (none
    given: --the-field-name, with --no-the-field-name for a bool) and click's own settings of
    it (`min`, `max`, `metavar`, `hidden`, `envvar`)."""
    metadata = {"help": help, "flags": flags, **click}
    if isinstance(default, list):
        return field(default_factory=list, metadata=metadata)
    return field(default=default, metadata=metadata)


def choice(*choices: str) -> Any:
    """A parser (an option's `parser=`) that takes one of `choices`; anything else is a usage
    error in click's words (a ValueError would reach the user in pydantic's: "Value error, ...")."""

    def parse(value: str) -> str:
        if value not in choices:
            import typer

            raise typer.BadParameter(f"{value!r} is not one of {', '.join(map(repr, choices))}.")
        return value

    return parse


def usd(value: str) -> float:
    """A parser for an amount of USD: a finite number, zero or more (click's float range lets
    ``inf`` and ``nan`` through)."""
    import math

    import typer

    try:
        amount = float(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a number of USD.") from None
    if not math.isfinite(amount) or amount < 0:
        raise typer.BadParameter(f"{value!r} is not a finite amount of USD (0 or more; 0: no budget).")
    return amount


def argument(help: str, **click: Any) -> Any:
    """A field that is the command's one optional positional argument."""
    return field(default=None, metadata={"help": help, "argument": True, **click})


def _max_turns() -> Any:
    return option(None, f"Stop before turn N+1 (a new run's default: {DEFAULT_MAX_TURNS}; 0: no turn cap).",
                  "--max-turns", min=0)


def _max_budget() -> Any:
    return option(None, "Stop once spend reaches this many USD (0: no budget). Checked before each turn, so spend "
                        "can pass the cap by at most one turn's cost (use --cap-max-tokens to keep it under).",
                  "--max-budget", min=0.0, metavar="USD", parser=usd)


def _max_tokens_total() -> Any:
    return option(None, "Stop once the run's prompt and completion tokens reach N (0: no cap); the budget of a "
                        "run at $0 (a local model). Checked before each turn, so a run can pass it by at most one turn's "
                        "tokens (use --cap-max-tokens to keep it under).", "--max-tokens-total", min=0)


def _max_wall_s() -> Any:
    return option(None, "Stop once the run has taken this many seconds, over every process that drove it (0: no "
                        "cap). Checked before each turn.", "--max-wall-s", min=0.0)


def _sandbox(help: str) -> Any:
    return option(None, help, "--sandbox", metavar="copy|none", parser=choice("copy", "none"))


def _latency_ms(default: float | None, note: str = "") -> Any:
    return option(default, f"Scripted provider: delay every reply by this many ms{note}.", min=0.0, max=3_600_000.0)


@dataclass(frozen=True, eq=False, repr=False)
class RunRequest:
    """The options of `runner run`; None means "not given" (the config file or a default
    decides). Units as in `RunConfig`."""

    prompt: str | None = argument("The user's task (default: the scenario's own); - reads it from stdin.",
                                  metavar="PROMPT")
    scenario: str | None = option(
        None, "A scripted scenario: plan, runaway, stuck, recover, destructive, repeat, double_delete, denied, "
              "slow, research, quirks, unknown_tool, bad_arguments, or a suite task (timeout_file, count_files, "
              "read_notes, read_each, largest_file, rotate_logs).")
    base_url: str | None = option(
        None, "Any OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1 [env RUNNER_BASE_URL, "
              "OPENAI_BASE_URL; config base_url]; with --scenario, only this option counts.", "--base-url")
    model: str | None = option(
        None, "Model name sent to --base-url; with no base URL, a local model (a name from `runner models list`, "
              "a unique start of one, or a .gguf path) that runner serves with llama.cpp for this run "
              "[env RUNNER_MODEL; config model].")
    prompt_file: Path | None = option(None, "Read the prompt from this file.", "--prompt-file")
    api_key: str | None = option(
        None, "API key for --base-url (never saved; a resume needs it again). Prefer an environment variable: "
              "$RUNNER_API_KEY, the one the config's api_key_env names, or $OPENAI_API_KEY.", "--api-key")
    api_key_env: str | None = option(
        None, "NAME of the environment variable that holds the key (recorded, so resume finds it).", "--api-key-env")
    tools: list[str] = option(
        [], "Offer a tool of your own (repeatable): MODULE:NAME (an importable module; MODULE.py in the "
            "current folder is found too), PATH/TO/FILE.py:NAME (a Python file, relative or absolute), or the name "
            "of an installed plugin (entry point group runner.tools); NAME is a runner.Tool subclass or instance "
            "[config tools].", "--tool", metavar="MODULE:NAME|FILE.py:NAME")
    no_builtin_tools: bool = option(False, "Offer only the --tool and MCP tools, not the built-in workspace tools.",
                                    "--no-builtin-tools")
    mcp: list[str] = option(
        [], "Offer an MCP server's tools as NAME__TOOL (repeatable): NAME=COMMAND [ARGS...] starts a stdio server "
            "(split as a shell would; ${VAR} expanded from the environment at start), NAME=URL reaches a "
            "streamable HTTP one [config: [mcp.servers.NAME] tables].", "--mcp", metavar="NAME=COMMAND|NAME=URL")
    mcp_config: Path | None = option(
        None, "Offer the servers of a Claude-Desktop-style JSON file ({\"mcpServers\": {NAME: {command, args, env} "
              "or {url, headers}}}); values without ${VAR} are secrets, never saved.", "--mcp-config", metavar="FILE")
    mcp_tools: list[str] = option(
        [], "Offer only the tools of server NAME matching GLOB (repeatable), e.g. fs:read_*.", "--mcp-tools",
        metavar="NAME:GLOB")
    tool_choice: str | None = option(
        None, "tool_choice of the first turn [default: the local model's manifest value, else auto].",
        "--tool-choice", metavar="auto|required|none")
    max_turns: int | None = _max_turns()
    max_budget_usd: float | None = _max_budget()
    max_tokens_total: int | None = _max_tokens_total()
    max_wall_s: float | None = _max_wall_s()
    workspace: Path | None = option(
        None, "The folder the tools work over [default: for a PROMPT, the current folder (config workspace); for a "
              "scenario, the packaged demo workspace].", "--workspace", "--folder", metavar="DIR")
    sandbox: str | None = _sandbox(
        "copy: the run works on its own copy of the folder (the folder is never changed); none: the tools act on "
        "the folder itself, every write stopping for your verdict first (see --auto-approve) [default: none for a "
        "PROMPT, copy for a scenario].")
    dedupe: bool = option(False, "Answer a repeated read-only call from the cache.")
    dedupe_all: bool = option(False, "UNSAFE: dedupe write tools too (a second, intended write is swallowed).")
    tool_errors: str = option(
        "text", "text: 'Error: <message>'; generic: 'Error: the tool failed.'; fatal: stop as failed.",
        metavar="text|generic|fatal")
    permanent_errors: bool = option(True, "Stop as failed on errors the model cannot fix.")
    max_identical_failures: int = option(
        2, "Same failing call this many times in a row is permanent (0: off).", min=0)
    auto_approve: list[str] = option(
        [], "Run calls of the tools this pattern names without stopping for a verdict (repeatable; shell-style: "
            "write_file, '*_file', '*' for every tool).", "--auto-approve", metavar="GLOB")
    on_slip: str = option(
        "corrective", "A reply with no answer and no usable call: corrective (ask again with a message saying "
                      "what went wrong), repeat (ask again as before) or fail.",
        metavar="corrective|repeat|fail")
    policies: list[str] = option(
        [], "A steering policy (repeatable): NAME replaces the model's set, +NAME adds one, -NAME removes one, "
            "none turns all off (`runner policies` lists them) [default: the model manifest's].",
        "--policy", metavar="[+|-]NAME")
    answer_after: int | None = option(
        None, "After this many turns of tool calls, ask for the answer (tool_choice none) [default: the local "
              "model's manifest value, else never].", min=1)
    cap_max_tokens: bool = option(
        False, "Also cap each reply's max_tokens from the budget left (after an estimate of the prompt), so spend "
               "stays under --max-budget and --max-tokens-total as far as the estimate holds.")
    price_in: float | None = option(
        None, "USD per million prompt tokens [default: 2.0; config price_in_usd_per_mtok].", min=0.0)
    price_out: float | None = option(
        None, "USD per million completion tokens [default: 12.0; config price_out_usd_per_mtok].", min=0.0)
    timeout_s: float | None = option(None, "Per-request timeout, seconds [default: 600].", min=0.001)
    max_retries: int | None = option(
        None, "Retries for 429/5xx/timeouts/refused connections, each shown as it happens [default: 4].", min=0)
    research: bool = option(
        False, "Also offer the research tool (a child agent); on by default for --scenario research.", "--research")
    research_max_turns: int = option(6, "Turn cap of each research child run.", min=1)
    research_max_budget_usd: float = option(
        0.05, "Budget of each research child run, USD.", "--research-max-budget", min=0.0)
    latency_ms: float = _latency_ms(0.0)
    fault: str | None = option(None, "Scripted provider: faults KIND@TURN,... (429, 500, 401, truncated, slow).")
    detach: bool = option(False, "Queue the run for `runner worker` instead of driving it here.", "--detach")
    keep: bool = option(
        False, "Keep the run even if it never got a reply from its endpoint (by default such a run is not kept: "
               "nothing was paid, nothing to resume).", "--keep")


@dataclass(frozen=True, eq=False, repr=False)
class ResumeRequest:
    """The options of `runner resume` (the run's id aside); None keeps what the run recorded."""

    approve: str | None = option(None, "Approve this pending call id, then continue.")
    reject: str | None = option(None, "Reject this pending call id, then continue.")
    reason: str = option("", "Why the call was rejected, with --reject (the model reads it; optional: "
                                 "without it, the model reads that no reason was given).")
    unsafe_empty_rejection: bool = option(
        False, "DEMONSTRATION ONLY: write an empty tool result for --reject, to show the false report an agent "
               "gives when a refusal is not written down.", hidden=True)
    max_turns: int | None = _max_turns()
    max_budget_usd: float | None = _max_budget()
    max_tokens_total: int | None = _max_tokens_total()
    max_wall_s: float | None = _max_wall_s()
    workspace: Path | None = option(
        None, "Where the run's folder is now (it moved) [default: the folder the run recorded; a resume refuses when that "
        "is gone].", "--workspace", "--folder", metavar="DIR")
    sandbox: str | None = _sandbox(
        "Change how the run works on its folder (copy or none), before it has made a copy of its own [default: as "
        "the run recorded].")
    latency_ms: float | None = _latency_ms(None, " (default: as the run recorded)")
    base_url: str | None = option(
        None, "Continue against this endpoint instead of the one the run recorded (a provider that came back "
              "elsewhere, e.g. on another port); only for a run started with a base URL.", "--base-url",
        metavar="URL")
    force: bool = option(
        False, "Continue from the saved state even if it is an older copy than the run's history (recorded in "
               "the trace).", "--force")
    api_key: str | None = option(
        None, "API key (never saved) [default: from the variable the run recorded; a run that recorded none "
              "and was not given one with --api-key: $RUNNER_API_KEY, $OPENAI_API_KEY].", "--api-key")
    tools: list[str] = option(
        [], "Where to find a tool of the run's own (repeatable): MODULE:NAME, PATH/TO/FILE.py:NAME or a plugin "
            "name, as for run [default: where the run recorded each].", "--tool", metavar="MODULE:NAME|FILE.py:NAME")
    detach: bool = option(False, "Record the verdict or limits and queue the run for `runner worker`.", "--detach")


@dataclass(frozen=True, eq=False, repr=False)
class SuiteRequest:
    """The options of `runner suite`: which model columns, how many runs of each task, and
    which executor drives them; or a cancelled suite's report to finish."""

    provider: str | None = option(
        None, "scripted, local or both (the columns when no --model is given) [default: both for the six-task "
              "suite, else local].", metavar="scripted|local|both")
    suites: list[Path] = option(
        [], "A suite folder (repeatable): suite.json and workspace/ (docs/suite.md) [default: the six-task suite].",
        "--suite", metavar="DIR")
    split: str | None = option(
        None, "Run every suite shipped in tasks/ of this half of the development set (after any --suite).",
        "--split", metavar="dev|test", parser=choice("dev", "test"))
    tasks: list[str] = option(
        [], "Run only this task (repeatable): its id, or SUITE/ID when several suites run.", "--task", metavar="ID")
    policies: list[str] = option(
        [], "A steering policy for the local columns (repeatable): NAME replaces the model's set, +NAME adds "
            "one, -NAME removes one, none turns all off [default: the model manifest's].", "--policy",
        metavar="[+|-]NAME")
    models: list[str] = option(
        [], "A model column (repeatable): a name from `runner models list`, a .gguf path, or 'scripted' "
            "[default: qwen2.5-coder-1.5b-instruct if pulled, else the packaged smollm2-135m-instruct]. "
            "With --provider both the scripted column comes first.",
        "--model", metavar="NAME")
    base_url: str | None = option(
        None, "Use this OpenAI-compatible endpoint as the 'local' provider instead of starting llama.cpp.",
        "--base-url")
    max_turns: int = option(8, "Turn cap per task (at least 1: unlike runner run's, a suite's tasks are always "
                               "capped).", metavar="N")
    max_tokens: int | None = option(None, "Cap on each reply, tokens [default: the server's].", min=1)
    latency_ms: float = _latency_ms(0.0)
    workspace: Path | None = option(
        None, "The folder the suite's tasks work over instead of the suite's own workspace (each run works on its own copy "
        "of it; the grades still expect the suite's answers) [default: the suite's workspace].", "--workspace", "--folder",
        metavar="DIR")
    sandbox: str | None = _sandbox(
        "copy, the only choice for a suite: each run works on its own copy of its folder, which is never changed "
        "(none, the folder itself, is refused: graded runs cannot stop for verdicts).")
    repeats: int = option(1, "Runs per task and model (the report gives pass rates over them).", "--repeat", min=1)
    executor: str = option(
        "local", "local (this process, one run at a time) or ray (Ray actors; pip install 'runner[ray]').",
        metavar="local|ray")
    address: str | None = option(
        None, "--executor ray: the cluster to join (auto or HOST:PORT) [default: start a local one].")
    actors: int | None = option(
        None, "--executor ray: actors per model column, each with its own endpoint [default: 2 per node].", min=1)
    resume_report: Path | None = option(
        None, "Finish a cancelled suite: drive the runs its report (suite-*.json) lists as unfinished, then write "
              "a report of all of them.", "--resume", metavar="REPORT")

    def __post_init__(self) -> None:
        if self.base_url is not None and self.provider == "scripted" and not self.models:
            raise UsageError("--base-url names the local column's endpoint; --provider scripted has no local column")
        if self.sandbox == "none":
            raise UsageError("a suite's runs are graded unattended, each on its own copy of its folder: --sandbox none "
                             "(writes on the folder itself, each stopping for a verdict) does not go with runner suite")
        if self.workspace is not None and not self.workspace.expanduser().is_dir():
            raise UsageError(f"--workspace {self.workspace}: no such folder")
        if self.workspace is not None and self.resume_report is not None:
            raise UsageError("--workspace does not go with --resume: the suite's runs recorded their folder")
        if self.resume_report is not None and (self.suites or self.split or self.tasks):
            raise UsageError("--resume finishes the suites its report ran: leave out --suite, --split and --task")

    @property
    def workspace_path(self) -> str | None:
        """--workspace as an absolute path (None: the suite's own workspace)."""
        return str(self.workspace.expanduser().resolve()) if self.workspace is not None else None


@dataclass(frozen=True, eq=False, repr=False)
class RunsRequest:
    """The options of `runner runs`: which runs, and whether to list, sum or delete them."""

    status: str | None = option(None, "Only runs with this status (running, died, queued, completed, ...).")
    limit: int | None = option(None, "At most this many runs (newest first).", min=1)
    offset: int = option(0, "Skip this many runs first (paging).", min=0)
    prune: bool = option(
        False, "Delete the runs listed: by default the final ones (completed, failed); --status picks others. A run "
               "being driven is never deleted.", "--prune")
    dry_run: bool = option(False, "With --prune: only list what would be deleted.", "--dry-run")
    totals: bool = option(
        False, "Sum runs, turns, tool runs, tokens and USD (of the runs --status/--limit select).", "--totals")
    by: Literal["model", "day", "status"] | None = option(
        None, "With --totals: one row per model, day (UTC) or status, then TOTAL.", "--by", metavar="model|day|status",
        parser=choice("model", "day", "status"))

    def __post_init__(self) -> None:
        if self.dry_run and not self.prune:
            raise UsageError("--dry-run goes with --prune")
        if self.by is not None and not self.totals:
            raise UsageError("--by goes with --totals")
        if self.prune and self.totals:
            raise UsageError("--totals does not go with --prune (sum the runs first, then prune them)")


@dataclass(frozen=True, eq=False, repr=False)
class WorkerRequest:
    """The options of `runner worker` (its store aside)."""

    concurrency: int = option(1, "Runs driven at once by this process.", min=1)
    lease_s: float | None = option(
        None, "PostgreSQL lease length, seconds (renewed every third of it) [default: $RUNNER_LEASE_S or 30].",
        min=0.1)
    idle_exit_s: float | None = option(
        None, "Exit once nothing was runnable for this many seconds [default: never].", "--idle-exit", min=0.0)
    poll_s: float = option(0.5, "Seconds between claims when nothing is runnable.", "--poll", min=0.01)


@dataclass(frozen=True, eq=False, repr=False)
class ServeRequest:
    """The options of `runner serve`: the local model and its llama.cpp server's settings."""

    model: str | None = option(
        None, "A name from `runner models list` or a .gguf path [default: qwen2.5-coder-1.5b-instruct if pulled, "
              "else the packaged smollm2-135m-instruct].")
    port: int = option(8080, "Port on 127.0.0.1 (0: a free one).", min=0, max=65535)
    n_ctx: int = option(4096, "Context size, tokens.", min=64)
    threads: int | None = option(None, "CPU threads [default: min(2, physical cores)].", min=1)
    n_batch: int | None = option(None, "Prompt tokens per llama.cpp decode call [default: 512].", min=1)
    draft: str | None = option(None, "Speculative decoding: none or lookup (prompt lookup) [default: the "
                                     "model manifest's, else none].", metavar="none|lookup", parser=choice("none", "lookup"))
    steer: str = option("default", "Steering for clients that do not steer: off, default (the model manifest's "
                                   "serve_policies) or on (every server policy); each reply's header x-runner-steering "
                                   "says what it was given.", metavar="off|default|on", parser=choice("off", "default", "on"))


@dataclass(frozen=True, eq=False, repr=False)
class ScriptedServeRequest:
    """The options of `runner scripted serve`: where it listens, and its latency and faults."""

    host: str = option("127.0.0.1", "Interface to bind (loopback by default).")
    port: int = option(8765, "Port (0: a free one).", min=0, max=65535)
    latency_ms: float = option(0.0, "Delay every reply by this many ms.", min=0.0)
    fault: str | None = option(None, "KIND@TURN,... with KIND in 429, 500, 401, truncated, slow.")


@dataclass(frozen=True, eq=False, repr=False)
class ViewRequest:
    """The options of `runner view` (its store aside)."""

    host: str = option("127.0.0.1", "Interface to bind (loopback by default; any other needs --token).")
    port: int = option(8700, "Port (0: a free one).", min=0, max=65535)
    token: str | None = option(
        None, "Every request must carry it (?token= once, then a cookie; or Authorization: Bearer).",
        envvar="RUNNER_VIEW_TOKEN")


@dataclass(frozen=True, eq=False, repr=False)
class ExperimentsRequest:
    """The options of `runner experiments` (its runs directory aside)."""

    names: list[str] | None = argument("Experiments to run (default: all).", metavar="NAME")
    skip_local: bool = option(
        False, "Leave out the local-model experiments (local_suite, local_harness: the slow ones).")
    list_names: bool = option(False, "List the experiments and exit.", "--list")
    out: Path | None = option(None, "Where reports go [default: experiments/ in the runs directory].", "--out")
    journal: Path | None = option(
        None, "Append each experiment's dated section to this file [default: journal.md beside the reports; "
        "docs/journal.md: the checkout's journal].", "--journal", metavar="FILE")
