"""The run as data: one pydantic model that holds everything a run needs to resume.

`RunState` is plain, serializable data (no clients, tools or callables). It round-trips
through JSON, carries a `format_version`, and is the only thing `save`/`load` persist.
Messages use the OpenAI chat-completions shapes so they can be sent as they are.

The models' annotations are evaluated as the module runs (no `from __future__ import
annotations`): pydantic then takes each field's type as an object instead of compiling its
text, about a third of what defining the models costs at import. Names defined further down
are quoted.
"""

import time
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, NamedTuple, Union

from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, PrivateAttr, model_validator

FORMAT_VERSION = 4
"""4: a `HarnessNote` on each message the harness adds (older ones load as kind "legacy"),
`RunState.answer_unsupported`, the `no_answer` failure. 3: the config's endpoint fields in `RunConfig.endpoint`, its limits in `RunConfig.limits`
(format-2 files, flat, are lifted on load). 2: `error`, the `provider_unavailable`
interruption, limits on the max_turns / max_budget interruptions, `usage_estimated` / `slip` on
turn records, `skipped` tool runs (every new field has a default, so version-1 files load)."""

MIN_REPLY_TOKENS = 16
"""With cap_max_tokens, a turn is bought only if the budget pays for at least this many reply tokens."""

DEFAULT_MAX_TURNS = 20
"""The turn cap a run gets unless one is given (the chapter's runs use 20); None lifts it."""

RunStatus = Literal[
    "running",  # the loop may call the model again
    "completed",  # the model answered in prose; final
    "failed",  # what no resume fixes (401/403, invalid request, context overflow, permanent tool
    # error, protocol slips or repeated calls past their bound); `error` says which; final
    "max_turns_exceeded",  # the turn cap stopped it; resumable with a higher cap
    "budget_exceeded",  # the USD, token or time budget stopped it; resumable with a higher budget
    "interrupted",  # approval needed, cancelled, the provider unavailable, or repaired; resumable
]
FINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed"})
DEFAULT_TOOLS: tuple[str, ...] = ("list_files", "read_file", "delete_file", "scan_archive")
"""The tool names a run offers unless told otherwise (resolved by `runner.catalog`)."""


class FunctionCall(BaseModel, defer_build=True):
    name: str
    arguments: str = "{}"
    """The arguments as a JSON string, exactly as the model sent them."""


class ToolCall(BaseModel, defer_build=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TopLogprob(BaseModel, defer_build=True):
    token: str
    logprob: float


class TokenLogprob(TopLogprob):
    """One generated token of a reply, as the provider gave it (OpenAI ``logprobs.content``)."""

    top_logprobs: list[TopLogprob] = []
    """The likeliest tokens at this place, the generated one among them when it is likeliest."""


HarnessKind = Literal[
    "correction",  # after a protocol slip: what went wrong and what to do
    "answer_request",  # answer forcing: the answer asked for (tool_choice "none")
    "nudge",  # a repeated call before anything but a listing succeeded: look inside a file
    "review",  # a reply that would have ended the run, sent back (`detail`: which kind of non-answer)
    "second_opinion",  # the answer asked for again in a fresh context
    "disagreement",  # the two answers disagree: which does the text support
    "last_attempt",  # a final reply that is no answer: one fresh request for the answer
    "legacy",  # written by a version that did not record kinds (format 3 and before)
]
"""What a message the harness added to a run is."""


class HarnessNote(BaseModel, defer_build=True):
    """What a message the harness added is, and who sent it (kept in the run, never sent)."""

    kind: HarnessKind
    policy: str
    """The steering policy that sent it (`runner.steering`), or "legacy"."""
    tool_choice: str | None = None
    """The ``tool_choice`` the request carrying it sends (None: the usual one)."""
    detail: str | None = None
    """For a review, the kind of non-answer it answers ("restated", "unsupported", ...)."""
    fresh: bool = False
    """The request carrying it sends only the system prompt before it (a fresh context)."""

    @property
    def label(self) -> str:
        """What it is in words, with what it reviewed and the policy that sent it (transcripts)."""
        what = HARNESS_LABELS[self.kind] + (f": {self.detail}" if self.kind == "review" and self.detail else "")
        return what if self.kind == "legacy" else f"{what}; {self.policy}"


HARNESS_LABELS: dict[str, str] = {
    "correction": "corrects a slip", "answer_request": "asks for the answer", "nudge": "nudges",
    "review": "sends the answer back", "second_opinion": "asks again", "disagreement": "shows both answers",
    "last_attempt": "asks once more", "legacy": "asks again"}
"""How transcripts name each kind of harness message."""


class Message(BaseModel, defer_build=True):
    """One chat message in the OpenAI shape (`system`, `user`, `assistant`, `tool`)."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    logprobs: list[TokenLogprob] | None = None
    """An assistant reply's tokens with their log probabilities, when the request asked for
    them (kept in the run, never sent back)."""
    harness: HarnessNote | None = None
    """Set on the user messages the harness adds (named ``runner``): their kind and policy."""

    @model_validator(mode="after")
    def _legacy_note(self) -> "Message":
        if self.harness is None and self.role == "user" and self.name == "runner":  # saved before notes existed
            self.harness = HarnessNote(kind="legacy", policy="legacy")
        return self

    def to_api(self) -> dict[str, Any]:
        """The dict sent to a chat-completions endpoint (no null fields)."""
        return self.model_dump(exclude_none=True, exclude={"logprobs", "harness"})


class ChangePreview(BaseModel, defer_build=True):
    """What approving a write would do to one file, worked out when the run asked
    (`runner.tools.change_preview`): a unified diff and its counts of lines."""

    path: str
    action: Literal["create", "replace", "edit", "delete"]
    removed_lines: int
    """Lines of the file as it was that the write takes out."""
    added_lines: int
    """Lines the write puts in."""
    diff: str = ""
    """The unified diff (``--- a/PATH``, ``+++ b/PATH``, hunks with 3 lines of context), at most
    `runner.tools.PREVIEW_LINES` lines, then one saying how many more; "" when the file is too
    large to compare (the counts are then the whole files')."""


class ApprovalInterruption(BaseModel, defer_build=True):
    type: Literal["approval"] = "approval"
    call_id: str
    tool_name: str
    args: Any
    in_doubt: bool = False
    """True when the call was started in an earlier process and its outcome is unknown."""
    preview: ChangePreview | None = None
    """What the write would change, as the files were when the run asked; None for a tool that
    does not say (`Tool.preview`)."""


class MaxTurnsInterruption(BaseModel, defer_build=True):
    type: Literal["max_turns"] = "max_turns"
    limit: int | None = None
    """The turn cap in force (None in version-1 files)."""
    used: int | None = None
    """Turns taken when the run stopped."""


class MaxBudgetInterruption(BaseModel, defer_build=True):
    type: Literal["max_budget"] = "max_budget"
    limit_usd: float | None = None
    """The budget in force, USD (None in version-1 files)."""
    used_usd: float | None = None
    """Spend when the run stopped, USD (may pass the limit by at most one turn's cost)."""
    needs_usd: float | None = None
    """With `cap_max_tokens`: the least budget that pays for the next prompt (as estimated)
    and a reply as long as the run's longest (at least `MIN_REPLY_TOKENS`), USD; None when
    the budget itself was spent."""
    limit_tokens: int | None = None
    """The token budget in force (`Limits.max_tokens_total`) when it is what stopped the run."""
    used_tokens: int | None = None
    """Prompt plus completion tokens spent when the run stopped."""
    needs_tokens: int | None = None
    """With `cap_max_tokens`: the least token budget that pays for the next prompt (as
    estimated) and a reply as long as the run's longest; None when the budget itself was spent."""
    limit_wall_s: float | None = None
    """The time budget in force (`Limits.max_wall_s`) when it is what stopped the run, seconds."""


class ProviderUnavailableInterruption(BaseModel, defer_build=True):
    """The provider could not be reached, or kept failing, through every retry: a plain
    resume asks again. Not a verdict on the run."""

    type: Literal["provider_unavailable"] = "provider_unavailable"
    http_status: int | None
    """The last attempt's HTTP status; None for a transport error or timeout."""
    message: str
    """The last attempt's error, with the provider's own message where it sent one."""
    retries: int
    """Attempts made after the first."""


class CancelledInterruption(BaseModel, defer_build=True):
    type: Literal["cancelled"] = "cancelled"
    reason: str


class RepairedInterruption(BaseModel, defer_build=True):
    """`runner repair` rebuilt the run from a damaged journal at a save where it was still
    running: no process drives it, and a plain resume goes on from there."""

    type: Literal["repaired"] = "repaired"
    kept_seq: int
    """The last good save the run was rebuilt from."""
    dropped: int = 0
    """Transitions committed after it that the damage lost."""


class ToolServerInterruption(BaseModel, defer_build=True):
    """An MCP server the run offers tools from did not start: a plain resume starts it again."""

    type: Literal["tool_server"] = "tool_server"
    server: str
    """The server's name (`McpServer.name`)."""
    message: str
    """Why it did not start, in one line."""


Interruption = Annotated[
    Union[ApprovalInterruption, MaxTurnsInterruption, MaxBudgetInterruption, CancelledInterruption,
          ProviderUnavailableInterruption, RepairedInterruption, ToolServerInterruption],
    Field(discriminator="type"),
]

ErrorType = Literal[
    "auth",  # HTTP 401/403: the key or the account
    "invalid_request",  # a 4xx (or a deterministic 5xx) the provider calls invalid
    "not_found",  # HTTP 404: unknown model or endpoint
    "context_overflow",  # the prompt does not fit the model's context
    "bad_endpoint",  # the base URL answers, but not as a chat-completions API (HTML, non-JSON, 405, 501)
    "protocol_slip",  # the model kept replying with no answer and no usable call
    "tool_error",  # tool_errors="fatal" and a tool failed
    "permanent_tool_error",  # a tool failure no retry fixes (permission denied, ...)
    "repeated_failure",  # the same failing call N times in a row
    "repeated_call",  # the same successful call N times in a row
    "no_answer",  # the model's last reply was no answer (a restated question, a pasted result, ...), twice
]
"""Why a `failed` run failed, as a closed set."""


class RunError(BaseModel, defer_build=True):
    """What stopped a `failed` run, as data."""

    type: ErrorType
    message: str
    """One line: the provider's own message, or the tool's error, or the slip described."""
    http_status: int | None = None
    """The provider's HTTP status (None for tool errors, slips and transport errors)."""
    details: dict[str, Any] | None = None
    """Numbers the provider gave with the error, e.g. {"n_prompt_tokens": 5000, "n_ctx": 4096}."""


class EngineTimings(BaseModel, defer_build=True):
    """Where a local engine's time on one reply went, as its server reported it (runner's
    server in its ``runner`` extension; llama.cpp's server in ``timings``)."""

    prompt_reused: int
    """Prompt tokens whose KV entries were kept from the request before (or loaded from disk)."""
    prompt_evaluated: int
    """Prompt tokens evaluated for this reply."""
    prompt_ms: float
    """Time evaluating the prompt, ms."""
    gen_ms: float
    """Time generating the reply (sampling, decoding, drafting), ms."""
    draft_accepted: int | None = None
    """Speculative decoding: drafted tokens the model confirmed (None: no drafting)."""
    draft_proposed: int | None = None
    """Speculative decoding: tokens drafted (None: no drafting)."""


class TurnRecord(BaseModel, defer_build=True):
    """One answered model call: usage in tokens, cost in USD, wall time in ms."""

    turn: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    ms: float
    provider_ms: float = 0.0
    """Time spent inside the HTTP call(s), retries and back-off included."""
    finish_reason: str | None = None
    retries: int = 0
    max_tokens: int | None = None
    """The max_tokens sent with the request, if any."""
    budget_capped: bool = False
    """True when max_tokens came from the budget left (cap_max_tokens)."""
    usage_estimated: bool = False
    """True when the provider sent no usable usage and the tokens were counted with tiktoken
    o200k_base over `runner.tokens`' rendering (charged all the same)."""
    slip: str | None = None
    """A protocol slip (`empty_tool_calls`, `blank_content`, `unparsed_tool_call`): the reply
    was billed but not kept, and the turn was asked again."""
    engine: EngineTimings | None = None
    """The local engine's account of the reply, when its server gave one."""


class ToolRun(BaseModel, defer_build=True):
    """One tool call that produced a result (really run, served from cache, or refused)."""

    call_id: str
    tool_name: str
    signature: str
    ok: bool
    ms: float
    source: Literal["run", "cache", "rejected", "invalid", "skipped", "refused"] = "run"
    """run: executed; cache: dedupe; rejected: the user declined; invalid: unknown tool or bad
    arguments; skipped: not run because the budget or turn cap was reached mid-batch; refused:
    not run because the tool found it could only fail (`Tool.check`), answered with that error."""
    error: str | None = None


ToolChoice = Literal["auto", "required", "none"]
EndpointKind = Literal["url", "local", "scripted"]


class Endpoint(BaseModel, defer_build=True):
    """Everything needed to reach one model: which, where, and how patiently.

    Its kind follows from which field is set: `base_url` (``url``: an endpoint already
    running), else `local_model` (``local``: a GGUF runner serves itself), else neither
    (``scripted``: the scripted provider). Saved with every run, so a resume, a worker or a Ray
    actor reaches the same model again; `runner.endpoints.open_endpoint` starts what it needs.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    """The model name sent with every request (a scripted run sends ``scripted/<scenario>``)."""
    base_url: str | None = None
    """An OpenAI-compatible endpoint that is already running, e.g. ``http://127.0.0.1:8080/v1``."""
    local_model: str | None = None
    """A manifest name or GGUF path runner serves itself when `base_url` is None."""
    chat_format: str | None = None
    """The local server's chat format (None: the manifest's, else runner's Hermes adapter)."""
    n_threads: int | None = Field(default=None, ge=1)
    """llama.cpp threads of the local server (None: `runner.local.LocalSettings`' default)."""
    first_turn_tool_choice: ToolChoice = "auto"
    """``tool_choice`` sent on a run's first turn ("auto": none sent); the model manifest
    gives each local model's value ("required" makes a small model's first turn a call)."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Per-request timeout, seconds."""
    max_retries: int = Field(default=4, ge=0)
    """Retries of a request that failed transiently (connection refused, 429, 5xx, timeout)."""
    api_key_env: str | None = None
    """The NAME of the environment variable the run's API key came from (never the key):
    resume and workers read the key from it again (`runner.config.key_for`). None: no key,
    or one given on the command line (`api_key_given`)."""
    api_key_given: bool = False
    """The run's key was given on the command line (`--api-key`, never recorded): a resume or
    a worker must be given it again, and sends no other in its place."""
    latency_ms: float = Field(default=0.0, ge=0)
    """The scripted provider only: delay added to every reply, ms."""

    @property
    def kind(self) -> EndpointKind:
        if self.base_url:
            return "url"
        return "local" if self.local_model else "scripted"

    @property
    def scripted(self) -> bool:
        """The scripted provider, started here or already serving at `base_url`: its model
        names are ``scripted`` (a suite column) and ``scripted/<scenario>`` (a run)."""
        return self.model == "scripted" or self.model.startswith("scripted/")

    @property
    def label(self) -> str:
        """A short name for tables: "scripted", the GGUF's file stem, or the model name."""
        if self.scripted:
            return "scripted"
        if self.kind == "local":
            assert self.local_model is not None
            return Path(self.local_model).stem if self.local_model.endswith(".gguf") else self.local_model
        return self.model

    def key(self) -> tuple[str | None, ...]:
        """What decides which server a run needs: runs with equal keys can share one."""
        return (self.kind, self.base_url, self.local_model, self.chat_format,
                str(self.n_threads), str(self.latency_ms) if self.kind == "scripted" else None)


class Limits(BaseModel, defer_build=True):
    """When a run must stop before it spends more, and the checks that say so.

    The loop asks `before_request` before each model call and `before_tool_call` before each
    call of a batch; both return why the run must stop, or None. The budget is checked before
    a turn is bought, so spend can pass the cap by at most one turn's cost (the price of a turn
    is not known until it is over), unless `cap_max_tokens` caps the reply too.
    """

    max_turns: int | None = DEFAULT_MAX_TURNS
    """Turn cap; None: no cap (version-1 files without one load as None, as they ran)."""
    max_budget_usd: float | None = None
    """Spend cap, USD; None: no cap."""
    max_tokens_total: int | None = None
    """Token budget: prompt plus completion tokens of every turn (a run at $0, on a local
    model, is limited by this or by `max_wall_s`); None: no cap. Checked before each turn, so
    it can be passed by at most one turn's tokens."""
    max_wall_s: float | None = None
    """Time budget: the run's wall time over every process that drove it, seconds; None: no
    cap. Checked before each turn."""
    cap_max_tokens: bool = False
    """Cap each request's max_tokens from the budgets left (USD and tokens) after an
    (over-)estimate of the next prompt, and stop when fewer than `MIN_REPLY_TOKENS` reply
    tokens fit: spend stays under each cap as long as the estimate holds. A reply cut off by this cap stops the run
    as budget_exceeded."""
    max_identical_failures: int = 2
    """A failing call repeated this many times in a row is treated as permanent (0: never)."""
    max_identical_calls: int = 3
    """The same successful call (tool + arguments) this many times in a row stops the run
    `failed` (0: never)."""
    max_protocol_retries: int = 2
    """A reply that is neither an answer nor a usable call is asked again this many times."""

    def before_request(self, state: "RunState", next_prompt_tokens: Callable[[], int],
                       prices: tuple[float, float]) -> "LimitStop | None":
        """Why the next model call must not be made, or None.

        Args:
            next_prompt_tokens: an (over-)estimate of the next request's prompt tokens,
                called only when `cap_max_tokens` needs it.
            prices: USD per million prompt and completion tokens.
        """
        if self.max_turns is not None and state.turns >= self.max_turns:
            return LimitStop("max_turns_exceeded", MaxTurnsInterruption(limit=self.max_turns, used=state.turns),
                             f"reached the turn cap of {self.max_turns}")
        spent_tokens = state.prompt_tokens + state.completion_tokens
        if self.max_tokens_total is not None and spent_tokens >= self.max_tokens_total:
            return LimitStop("budget_exceeded", MaxBudgetInterruption(
                limit_tokens=self.max_tokens_total, used_tokens=spent_tokens),
                f"spent {spent_tokens:,} of a {self.max_tokens_total:,}-token budget")
        if self.max_wall_s is not None and state.wall_ms >= self.max_wall_s * 1000:
            return LimitStop("budget_exceeded", MaxBudgetInterruption(limit_wall_s=self.max_wall_s),
                             f"ran {state.wall_ms / 1000:.1f} s of a {self.max_wall_s:g} s time budget")
        if self.max_budget_usd is not None and state.cost_usd >= self.max_budget_usd:
            return self._usd_stop(state)
        reply_tokens = self.reply_tokens(state, next_prompt_tokens, prices)
        if reply_tokens is None or reply_tokens >= MIN_REPLY_TOKENS:
            return None
        (price_in, price_out), prompt_tokens = prices, next_prompt_tokens()
        reply = max([MIN_REPLY_TOKENS, *(t.completion_tokens for t in state.per_turn)])
        too_little = f"the next prompt (~{prompt_tokens} tokens) would leave too little for a reply"
        if self.max_tokens_total is not None and self.max_tokens_total - spent_tokens - prompt_tokens < MIN_REPLY_TOKENS:
            needs_tokens = spent_tokens + prompt_tokens + reply
            return LimitStop("budget_exceeded", MaxBudgetInterruption(
                limit_tokens=self.max_tokens_total, used_tokens=spent_tokens, needs_tokens=needs_tokens),
                f"spent {spent_tokens:,} of a {self.max_tokens_total:,}-token budget; {too_little} (a budget of "
                f"{needs_tokens:,} tokens pays for one as long as the run's longest)")
        needs_usd = state.cost_usd + (prompt_tokens * price_in + reply * price_out) / 1e6
        needs_usd = (int(needs_usd * 1e6) + 2) / 1e6  # whole micro-dollars, rounded up with room
        return self._usd_stop(state, needs_usd, f"; {too_little} (a budget of ${needs_usd:.6f} pays for one as long "
                                                "as the run's longest)")

    def _usd_stop(self, state: "RunState", needs_usd: float | None = None, more: str = "") -> "LimitStop":
        """The stop on the USD budget: spent, or (`needs_usd`) too little left for the next turn."""
        assert self.max_budget_usd is not None
        budget = MaxBudgetInterruption(limit_usd=self.max_budget_usd, used_usd=round(state.cost_usd, 9),
                                       needs_usd=needs_usd)
        return LimitStop("budget_exceeded", budget,
                         f"spent ${state.cost_usd:.6f} of a ${self.max_budget_usd:.6f} budget{more}")

    def reply_tokens(self, state: "RunState", next_prompt_tokens: Callable[[], int],
                     prices: tuple[float, float]) -> int | None:
        """With `cap_max_tokens`, the completion tokens the budgets (USD and tokens) still pay
        for once the next prompt is paid; None when not capping or there is no budget."""
        price_in, price_out = prices
        pays_usd = self.max_budget_usd is not None and price_out > 0
        if not self.cap_max_tokens or not (pays_usd or self.max_tokens_total is not None):
            return None
        prompt_tokens = next_prompt_tokens()
        caps = []
        if pays_usd:
            assert self.max_budget_usd is not None
            left_usd = self.max_budget_usd - state.cost_usd - prompt_tokens * price_in / 1e6
            caps.append(int(left_usd * 1e6 / price_out))
        if self.max_tokens_total is not None:
            caps.append(self.max_tokens_total - state.prompt_tokens - state.completion_tokens - prompt_tokens)
        return min(caps)

    def before_tool_call(self, state: "RunState") -> str | None:
        """Why a call of the current batch must not run (the tool result the model reads),
        or None. The turn that asked for the batch is already counted, so the cap stops a
        batch only once the run is past it."""
        if self.max_budget_usd is not None and state.cost_usd >= self.max_budget_usd:
            return (f"Not run: the run's budget of ${self.max_budget_usd:.6f} was spent "
                    f"(${state.cost_usd:.6f}) before this call could start.")
        if self.max_turns is not None and state.turns > self.max_turns:
            return f"Not run: the run is past its turn cap of {self.max_turns} turns."
        return None


class LimitStop(NamedTuple):
    """A stop a limit calls for: the status, the interruption, the reason in words."""

    status: RunStatus
    interruption: Interruption
    reason: str


class McpServer(BaseModel, defer_build=True):
    """One MCP server a run offers tools from, as the run records it: no secret in it.

    Either `command` (stdio: the server is a child process) or `url` (streamable HTTP). Every
    string may hold ``${VAR}`` references, expanded from the environment of the process that
    starts the server. Read from a command line or a file (`runner.mcp.from_entry`), an `env`
    or `headers` value given without any ``${VAR}`` is a secret: it is recorded as None and
    kept only in the memory of the process that was given it (`secrets`); any other process (a
    resume, a worker) takes an `env` value from its own environment variable of that name.
    Built in Python, write a secret as ``${VAR}``: every value given here is recorded.
    `runner.mcp` starts the servers and turns their tools into runner tools.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    """Letters, digits, ``-`` and ``_`` (never two ``_`` in a row); the tools' default prefix."""
    command: list[str] | None = None
    """The program and its arguments (stdio)."""
    url: str | None = None
    """The streamable HTTP endpoint, e.g. ``http://127.0.0.1:3001/mcp``."""
    env: dict[str, str | None] = {}
    """Variables set for a stdio server: a template, or None for a secret (see above)."""
    headers: dict[str, str | None] = {}
    """HTTP headers sent to a URL server: a template, or None for a secret (see above)."""
    cwd: str | None = None
    prefix: str | None = None
    """Offered tool names are ``PREFIX__TOOL``; None: the server's name; "": the tool's own name."""
    tools: list[str] = []
    """Globs over the server's tool names: only these are offered (empty: every tool)."""
    approve: list[str] = []
    """Globs of tools that need approval whatever their annotations say."""
    allow: list[str] = []
    """Globs of tools that never need approval whatever their annotations say."""
    deny: list[str] = []
    """Globs of tools never offered."""
    trust_hints: bool = True
    """Take the server's `readOnlyHint` / `idempotentHint` / `destructiveHint`; False: every tool
    is a non-idempotent write that needs approval (unless `allow` names it)."""
    start_timeout_s: float = Field(default=60.0, gt=0)
    """How long the server may take to start and list its tools (``npx`` may install first)."""
    call_timeout_s: float = Field(default=300.0, gt=0)
    """How long one tool call may take before it is a tool error."""
    listing: dict[str, str] = {}
    """Offered tool name -> digest of its definition (description, schema, annotations) when
    the run first listed it: a resume compares the tools the run called against it."""

    _secrets: dict[str, str] = PrivateAttr(default_factory=dict)

    def secrets(self) -> dict[str, str]:
        """The secret values this process was given ("env:NAME" / "header:NAME" -> value); never saved."""
        return dict(self._secrets)


_ENDPOINT_KEYS = frozenset(Endpoint.model_fields)
_LIMIT_KEYS = frozenset(Limits.model_fields)


class RunConfig(BaseModel, defer_build=True):
    """How the run reaches its model (`endpoint`), when it must stop (`limits`), and which
    policies apply.

    Persisted with the state so `resume` continues under the same rules unless told otherwise.
    Prices default to $2.00 / $12.00 per million prompt / completion tokens (the chapter's
    reference rates, read 2026-09-06).

    Format-2 files kept every field flat (``model``, ``base_url``, ``max_turns``, ...): such keys
    are lifted into `endpoint` and `limits` on load, and keyword construction accepts them
    the same way (``RunConfig(model="m", max_turns=3)``).
    """

    endpoint: Endpoint
    limits: Limits = Field(default_factory=Limits)
    max_tokens: int | None = None
    """max_tokens sent with every request (None: the server's default)."""
    price_in_usd_per_mtok: float = 2.0
    price_out_usd_per_mtok: float = 12.0
    dedupe: bool = False
    dedupe_all: bool = False
    tool_errors: Literal["text", "generic", "fatal"] = "text"
    permanent_errors: bool = True
    on_slip: Literal["corrective", "repeat", "fail"] = "corrective"
    """What a protocol slip gets: ``corrective`` asks again with a short user message saying
    what went wrong and what to do (kept in the transcript, named ``runner``); ``repeat`` sends
    the same request again; ``fail`` fails the run at the first slip."""
    answer_after_tool_turns: int | None = None
    """After this many assistant turns of tool calls, the next request adds a user message
    asking for the answer to the task (restated) and is sent with ``tool_choice: "none"``: the
    model must answer from what it has read. None: never. The model manifest gives small local
    models a value."""
    answer_on_stall: bool = False
    """Also ask for the answer (as `answer_after_tool_turns` does) as soon as a turn of tool
    calls brought nothing new: each of its calls repeated an earlier call (same tool, same
    arguments) or failed, and some earlier call succeeded. A model that keeps making new
    successful calls keeps going, up to `answer_after_tool_turns`."""
    answer_restates_results: Literal["never", "after_failure", "always"] = "never"
    """Whether the message that asks for the answer (answer forcing, or after an empty reply)
    restates every distinct successful tool result under a header naming the call, before the
    task: ``always``, or ``after_failure`` (only when a call of the last turn of calls failed,
    which would otherwise be the last thing the model reads). A small model then reads the
    results next to the question, and failed calls stay out of it."""
    parallel_tool_calls: bool | None = None
    """Sent as OpenAI's ``parallel_tool_calls`` (False: at most one call per turn; runner's
    local server then allows one call under its grammar). None: not sent."""
    steering: list[str] = []
    """The steering policies in force that are not fields of their own (`runner.steering`:
    listing_in_prompt, abstain_option, evidence_first)."""
    workspace: str | None = None
    """The folder the tools work over, as an absolute path (None: the packaged three-file
    workspace, `tasks/workspace`). Recorded, so a resume or a worker works on the same folder."""
    sandbox: Literal["copy", "none"] = "copy"
    """``copy``: the run works on its own copy of `workspace`, made when a tool that may write
    first runs (the folder itself is never changed). ``none``: every tool acts on the folder
    itself, and every tool that may write stops for a verdict first (unless
    `auto_approve_tools` names it); the write tools' ledger is kept in the run's own folder."""
    builtin_tools: Literal["demo", "folder"] = "demo"
    """Which built-in tools the names in `tools` mean (`runner.catalog`): ``demo``, the
    packaged workspace's tools (the six-task suite and the scenarios); ``folder``, tools fit
    for a folder of one's own (subfolders, line ranges, search, write and edit)."""
    max_tool_result_chars: int | None = 20_000
    """Longer tool results are cut, with a marker the model reads (None: no cap)."""
    auto_approve: bool = False
    """Approve every needs_approval call without stopping (used by the double_delete demo)."""
    auto_approve_tools: list[str] = []
    """Shell-style patterns (``write_file``, ``*_file``, ``*``) of tool names whose calls run
    without stopping for a verdict (`--auto-approve GLOB`)."""
    tools: list[str] = Field(default_factory=lambda: list(DEFAULT_TOOLS))
    """Names of the tools offered to the model (`research` adds a child-agent tool). Given
    tool objects (your own tools) instead of names, the config keeps their names, records
    where each can be imported again in `tool_refs`, and hands the objects to the run that
    starts from this config (they are never saved)."""
    tool_refs: dict[str, str] = {}
    """Tool name -> "module:attribute" for tools that are not built in: how a resume or a
    worker finds them again (a tool class, or an instance, importable from there)."""
    mcp: list[McpServer] = []
    """MCP servers whose tools the run offers after `tools` (see `runner.mcp`)."""
    research_model: str | None = None
    """Model for the `research` tool's child runs (default: the parent's model)."""
    research_max_turns: int = 6
    research_max_budget_usd: float = 0.05

    @model_validator(mode="before")
    @classmethod
    def _lift_flat_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not (_ENDPOINT_KEYS | _LIMIT_KEYS) & data.keys():
            return data
        data = dict(data)
        for group, keys in (("endpoint", _ENDPOINT_KEYS), ("limits", _LIMIT_KEYS)):
            flat = {k: data.pop(k) for k in list(data) if k in keys}
            if flat:
                nested = data.get(group)
                base = nested.model_dump() if isinstance(nested, BaseModel) else dict(nested or {})
                data[group] = base | flat
        return data

    @model_validator(mode="after")
    def _unpriced_on_own_machine(self) -> "RunConfig":
        """A model on this machine (runner's own llama.cpp server, or a base URL on a loopback
        address) costs nothing unless a price is given: both prices are then 0."""
        given = self.model_fields_set & {"price_in_usd_per_mtok", "price_out_usd_per_mtok"}
        if not given and on_own_machine(self.endpoint):
            self.price_in_usd_per_mtok = self.price_out_usd_per_mtok = 0.0
        return self

    @property
    def prices(self) -> tuple[float, float]:
        """USD per million prompt and completion tokens."""
        return self.price_in_usd_per_mtok, self.price_out_usd_per_mtok

    @property
    def priced(self) -> bool:
        """False for a run at $0 (no price: a model on this machine, or prices of 0 given)."""
        return self.price_in_usd_per_mtok > 0 or self.price_out_usd_per_mtok > 0

    def approves_itself(self, tool_name: str) -> bool:
        """True if a call of `tool_name` runs without a person's verdict (`auto_approve`, or
        a pattern of `auto_approve_tools` matches the name)."""
        import fnmatch

        return self.auto_approve or any(fnmatch.fnmatchcase(tool_name, p) for p in self.auto_approve_tools)

    def needs_verdict(self, tool_name: str, needs_approval: bool, read_only: bool, on_folder: bool = True) -> bool:
        """True if a call of this tool stops for a verdict: the tool needs approval, or it may
        write and acts on the user's own folder (a built-in tool, `on_folder`, with sandbox
        "none"); unless approved in advance."""
        asks = needs_approval or (self.sandbox == "none" and not read_only and on_folder)
        return asks and not self.approves_itself(tool_name)

    _given_tools: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _take_tool_objects(cls, data: Any, handler: ModelWrapValidatorHandler["RunConfig"]) -> "RunConfig":
        """`tools` may hold tool objects: keep their names (and import references) as data,
        and the objects beside, unsaved, for `given_tools`."""
        objects = [t for t in data.get("tools") or [] if not isinstance(t, str)] if isinstance(data, dict) else []
        if objects:
            refs = {t.name: ref for t in objects if (ref := tool_ref(t)) is not None}
            data = {**data, "tools": [t if isinstance(t, str) else t.name for t in data["tools"]],
                    "tool_refs": {**data.get("tool_refs", {}), **refs}}
        config = handler(data)
        config._given_tools.update({t.name: t for t in objects})
        return config

    def given_tools(self) -> dict[str, Any]:
        """The tool objects this config was built with, by name (never saved; a loaded config has none)."""
        return dict(self._given_tools)


def on_own_machine(endpoint: Endpoint) -> bool:
    """True for a model served on this machine that is not the scripted provider (which plays
    a hosted one, prices included): runner's own llama.cpp server, or a loopback base URL."""
    if endpoint.scripted:
        return False
    if endpoint.kind == "local":
        return True
    if endpoint.kind != "url" or not endpoint.base_url:
        return False
    from urllib.parse import urlsplit

    host = (urlsplit(endpoint.base_url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def tool_ref(tool: Any) -> str | None:
    """Where a tool object can be imported again ("module:Class", built with no arguments), or
    None for a tool defined in `__main__` or inside a function."""
    cls = type(tool)
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        return None
    return f"{cls.__module__}:{cls.__qualname__}"


class RunState(BaseModel, defer_build=True):
    """Everything about one run. Counts are in tokens, money in USD, times in ms."""

    format_version: int = FORMAT_VERSION
    run_id: str
    parent_run_id: str | None = None
    created_at: float = Field(default_factory=time.time)
    config: RunConfig
    messages: list[Message]
    status: RunStatus = "running"
    interruption: Interruption | None = None
    reason: str | None = None
    """Why the run stopped, in words (set with every non-running status)."""
    error: RunError | None = None
    """Set when status is `failed`: the typed cause."""
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    """Total spend, including child runs started by the research tool."""
    child_cost_usd: float = 0.0
    """The part of `cost_usd` spent by child runs, USD."""
    child_costs: dict[str, float] = {}
    """Child run id -> that child's total spend as last seen, USD (a value, not an increment)."""
    wall_ms: float = 0.0
    """Wall time summed over every process that worked on this run."""
    per_turn: list[TurnRecord] = []
    tool_runs: list[ToolRun] = []
    approved: dict[str, str] = {}
    """call id -> call signature; an approval holds only for those exact arguments."""
    started: dict[str, str] = {}
    """Write-tool calls started but not yet recorded: call id -> signature (in doubt on resume)."""
    in_doubt: list[str] = []
    """Call ids whose earlier start has an unknown outcome: they run again only if approved."""
    answer_unsupported: str | None = None
    """Set when the run completed with an answer the run's own review found unsupported by
    any tool result: what the answer says that nothing returned (a quoted name, a number)."""
    elided_results: int = 0
    """How many of the earliest tool results the requests send as one line each, so that the
    conversation fits the model's context window (raised by one for each request refused as
    too long)."""
    seq: int = 0
    """Sequence number of the last committed save (0: never saved). A store accepts a save
    only from the state that follows its stored one, so an old copy cannot overwrite newer
    history."""

    @property
    def answer(self) -> str:
        """The final assistant prose when completed, else an empty string."""
        if self.status != "completed" or not self.messages:
            return ""
        return self.messages[-1].content or ""

    @property
    def tool_run_count(self) -> int:
        """Tool calls that really executed (cache hits and rejections excluded)."""
        return sum(1 for r in self.tool_runs if r.source == "run")


def new_run_id() -> str:
    import uuid  # imported where used, as hashlib and json below: `from runner import RunState` stays light

    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def new_run(
    prompt: str, config: RunConfig, *, system: str | None = None, run_id: str | None = None,
    parent_run_id: str | None = None,
) -> RunState:
    """A fresh `running` state holding the system prompt (if any) and the user's prompt."""
    messages = [Message(role="system", content=system)] if system else []
    messages.append(Message(role="user", content=prompt))
    return RunState(
        run_id=run_id or new_run_id(), parent_run_id=parent_run_id, config=config, messages=messages
    )


def call_signature(tool_name: str, arguments: str) -> str:
    """Tool name + a digest of the canonical JSON of the arguments; the dedupe and approval key.

    `arguments` is the JSON string the model sent; key order and spacing do not matter.
    A string that is not JSON is signed as it is.
    """
    import hashlib
    import json

    try:
        canonical = json.dumps(json.loads(arguments or "{}"), sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False)
    except json.JSONDecodeError:
        canonical = arguments
    return tool_name + ":" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def pending(state: RunState) -> list[ToolCall]:
    """Tool calls of the last assistant message that have no tool result yet, in order."""
    last_assistant = next(
        (i for i in range(len(state.messages) - 1, -1, -1) if state.messages[i].role == "assistant"),
        None,
    )
    if last_assistant is None:
        return []
    answered = {m.tool_call_id for m in state.messages[last_assistant + 1 :] if m.role == "tool"}
    calls = state.messages[last_assistant].tool_calls or []
    return [c for c in calls if c.id not in answered]
