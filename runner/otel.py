"""Runs as OpenTelemetry traces, in the GenAI semantic conventions, sent over OTLP/HTTP.

A run is one trace. Its spans are built from what the store committed (the state and the
trace), never from live objects, so a run exported during the run, after it, or twice, gives
the same spans with the same ids:

- ``invoke_agent runner``: the run (``gen_ai.operation.name = invoke_agent``,
  ``gen_ai.agent.id`` = the run id, usage summed, ``runner.cost_usd``, status and stop
  reason; operator verdicts and approval requests as span events), from its first event to
  its last ``run_stopped``. Sent once the run has stopped; a child run's is nested under the
  research tool call that started it.
- ``chat MODEL``: each model call (``gen_ai.usage.input_tokens``/``output_tokens``,
  ``gen_ai.response.finish_reasons``, ``runner.cost_usd`` for that call, retries, slips),
  timed by the trace's ``turn`` event and its ``ms``.
- ``execute_tool NAME``: each tool run (``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
  ``runner.tool.result_chars``, ``error.type`` when it failed), from ``tool_start`` to
  ``tool_result`` (or ``tool_cancelled``); a call answered without running (``tool_skipped``)
  carries why as ``runner.tool.skipped``.

Trace and span ids are digests of the root run id and the span's place in the run, so
exporting a run again (or a resumed run after its first part) adds nothing twice: Phoenix,
for one, keeps the first copy of a span id. The one consequence: a run exported when it first
stopped keeps that stop on its ``invoke_agent`` span after a later resume (its later turns
and tools still arrive, under the same span).

OpenInference attributes (``openinference.span.kind``, ``llm.token_count.*``) ride along so
Phoenix's own views show kinds and tokens. Only this module imports OpenTelemetry, and only
`runner.cli` imports this module, when an endpoint is set; without OpenTelemetry installed,
importing it raises `MissingExtra` (a usage error naming the extra).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner import __version__
from runner.errors import MissingExtra, RunnerError, RunNotFound, UsageError

try:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExportResult
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
except ImportError as exc:
    raise MissingExtra(f"--otlp-endpoint needs OpenTelemetry ({exc.name} is missing): "
                       "pip install 'runner[otel]'") from None
from runner.state import RunState
from runner.store import RunStore
from runner.trace import (
    ApprovalRequired,
    RunStopped,
    ToolCancelled,
    ToolResult,
    TraceEvent,
    TurnEvent,
    Verdict,
)

ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROJECT_ENV = "RUNNER_OTEL_PROJECT"
LIVE_POLL_S = 1.0
"""How often a live exporter looks for newly committed turns and tool runs, seconds."""
_SCOPE = InstrumentationScope("runner", __version__)


def endpoint_from(value: str | None) -> str | None:
    """The OTLP endpoint to use: `value` (--otlp-endpoint), else $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    (used as it is), else $OTEL_EXPORTER_OTLP_ENDPOINT (the signal path /v1/traces is added,
    as the OpenTelemetry spec says); None when none is set."""
    if value:
        return traces_url(value)
    if traces := os.environ.get(ENDPOINT_ENVS[0]):
        return traces
    if base := os.environ.get(ENDPOINT_ENVS[1]):
        return traces_url(base)
    return None


def traces_url(endpoint: str) -> str:
    """`http://host:4318` -> `http://host:4318/v1/traces` (kept when already there).

    Raises:
        UsageError: not an http(s) URL.
    """
    if not endpoint.startswith(("http://", "https://")):
        raise UsageError(f"--otlp-endpoint must be an http:// or https:// URL (OTLP/HTTP), got {endpoint!r}")
    return endpoint if endpoint.rstrip("/").endswith("/v1/traces") else endpoint.rstrip("/") + "/v1/traces"


def trace_id_of(root_run_id: str) -> int:
    """The 128-bit trace id of a run and its child runs (a digest of the root run id)."""
    return int.from_bytes(hashlib.sha256(f"runner trace {root_run_id}".encode()).digest()[:16], "big") or 1


def span_id_of(run_id: str, *place: object) -> int:
    """The 64-bit span id of one span of a run, e.g. ("turn", 3) or ("tool", "c2")."""
    key = " ".join(["runner span", run_id, *map(str, place)])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") or 1


def _ns(ts: float) -> int:
    return int(ts * 1e9)


@dataclass
class RunSpans:
    """The spans of one run as far as it is committed, and whether it has stopped."""

    spans: list[ReadableSpan]
    stopped: bool
    children: list[str] = field(default_factory=list)


def _provider(state: RunState) -> str:
    endpoint = state.config.endpoint
    if endpoint.scripted:
        return "runner.scripted"
    return "llama.cpp" if endpoint.kind == "local" else "openai"


class _SpanBuilder:
    """Builds the spans of one run: the ids, names and attributes its spans share.

    Args:
        state: the run's committed state.
        root_run_id: the run at the top of its parent chain; names the trace.
        resource: the OpenTelemetry resource every span carries.
    """

    def __init__(self, state: RunState, root_run_id: str, resource: Resource) -> None:
        self.state, self.run_id, self.resource = state, state.run_id, resource
        self.trace_id = trace_id_of(root_run_id)
        self.run_ctx = self.context(span_id_of(self.run_id, "run"))
        self.model = state.config.endpoint.model
        self.provider = _provider(state)
        self.results = {m.tool_call_id: m.content or "" for m in state.messages if m.role == "tool" and m.tool_call_id}
        self.records = {t.turn: t for t in state.per_turn}
        self._seen: dict[tuple[object, ...], int] = {}

    def context(self, span_id: int) -> SpanContext:
        """The sampled, local span context of `span_id` in this run's trace."""
        return SpanContext(self.trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))

    def place(self, *key: object) -> tuple[object, ...]:
        """The span's place in the run: `key`, with an occurrence count from the second time on
        (a re-run after a resume gets its own span id)."""
        self._seen[key] = self._seen.get(key, 0) + 1
        return (*key, self._seen[key]) if self._seen[key] > 1 else key

    def turn_span(self, e: TurnEvent) -> ReadableSpan:
        """The ``chat MODEL`` span of one model call, ending at the `turn` event, `e.ms` long."""
        record = self.records.get(e.turn)
        model = self.model
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": self.provider, "gen_ai.request.model": model,
            "gen_ai.conversation.id": self.run_id, "gen_ai.usage.input_tokens": e.promptTokens,
            "gen_ai.usage.output_tokens": e.completionTokens,
            "gen_ai.response.finish_reasons": [e.finish or "unknown"], "runner.turn": e.turn,
            "runner.cost_usd": round(record.cost_usd, 9) if record else 0.0, "runner.ms": e.ms,
            "openinference.span.kind": "LLM", "llm.model_name": model,
            "llm.token_count.prompt": e.promptTokens, "llm.token_count.completion": e.completionTokens,
            "llm.token_count.total": e.totalTokens,
        }
        if e.retries:
            attributes["runner.retries"] = len(e.retries)
        if e.slip:
            attributes["runner.slip"] = e.slip
        if e.usageEstimated:
            attributes["runner.usage_estimated"] = True
        return ReadableSpan(
            f"chat {model}", self.context(span_id_of(self.run_id, *self.place("turn", e.turn))), self.run_ctx,
            self.resource, attributes, kind=SpanKind.CLIENT,
            status=Status(StatusCode.ERROR, f"protocol slip: {e.slip}") if e.slip else Status(StatusCode.OK),
            start_time=_ns(e.ts - e.ms / 1000), end_time=_ns(e.ts), instrumentation_scope=_SCOPE)

    def tool_span(self, e: ToolResult | ToolCancelled, start: float | None, skipped: str | None = None) -> ReadableSpan:
        """The ``execute_tool NAME`` span of one tool run, from `start` (its `tool_start`'s
        time, or `e.ms` before `e` when None) to its result or cancellation; `skipped`: why a
        call answered without running was (its `tool_skipped` reason, ``runner.tool.skipped``)."""
        ok = e.type == "tool_result" and e.ok
        error = e.error if e.type == "tool_result" else f"cancelled: {e.reason}"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": e.toolName,
            "gen_ai.tool.call.id": e.callId, "gen_ai.tool.type": "function", "gen_ai.conversation.id": self.run_id,
            "runner.tool.result_chars": len(self.results.get(e.callId, "")), "runner.ms": e.ms,
            "openinference.span.kind": "TOOL", "tool.name": e.toolName,
        }
        if e.type == "tool_result":
            attributes["runner.tool.source"] = e.source
        if skipped is not None:
            attributes["runner.tool.skipped"] = skipped
        if not ok:
            attributes["error.type"] = "cancelled" if e.type == "tool_cancelled" else "tool_error"
        span_id = span_id_of(self.run_id, *self.place("tool", e.callId))
        return ReadableSpan(
            f"execute_tool {e.toolName}", self.context(span_id), self.run_ctx, self.resource, attributes,
            kind=SpanKind.INTERNAL, status=Status(StatusCode.OK) if ok else Status(StatusCode.ERROR, error or "failed"),
            start_time=_ns(start if start is not None else e.ts - e.ms / 1000), end_time=_ns(e.ts),
            instrumentation_scope=_SCOPE)

    def run_span(self, first_ts: float, stop: RunStopped, span_events: list[Event],
                 parent_span_id: int | None) -> ReadableSpan:
        """The ``invoke_agent runner`` span of the whole run, from `first_ts` (the trace's first
        event, or the run's creation if earlier) to its last `stop`, with `span_events` on it."""
        state = self.state
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "runner", "gen_ai.agent.id": self.run_id,
            "gen_ai.conversation.id": self.run_id, "gen_ai.provider.name": self.provider,
            "gen_ai.request.model": self.model,
            "gen_ai.usage.input_tokens": state.prompt_tokens, "gen_ai.usage.output_tokens": state.completion_tokens,
            "runner.cost_usd": round(state.cost_usd, 9), "runner.turns": state.turns,
            "runner.tool_runs": state.tool_run_count, "runner.status": stop.status,
            "runner.stop_reason": stop.reason or "", "openinference.span.kind": "AGENT",
            "llm.token_count.prompt": state.prompt_tokens, "llm.token_count.completion": state.completion_tokens,
        }
        if state.parent_run_id:
            attributes["runner.parent_run_id"] = state.parent_run_id
        failed = stop.status == "failed"
        return ReadableSpan(
            "invoke_agent runner", self.run_ctx, self.context(parent_span_id) if parent_span_id else None,
            self.resource, attributes, events=span_events, kind=SpanKind.INTERNAL,
            status=Status(StatusCode.ERROR, stop.reason or "failed") if failed else Status(StatusCode.OK),
            start_time=_ns(min(first_ts, state.created_at)), end_time=_ns(stop.ts), instrumentation_scope=_SCOPE)


def _verdict_event(e: Verdict) -> Event:
    """The ``runner.verdict`` span event of an operator's verdict on a tool call."""
    return Event("runner.verdict", {"runner.verdict": e.verdict, "gen_ai.tool.call.id": e.callId,
                                    "gen_ai.tool.name": e.toolName, "runner.by": e.by,
                                    "runner.reason": e.reason or ""}, _ns(e.ts))


def _approval_event(e: ApprovalRequired) -> Event:
    """The ``runner.approval_required`` span event of a tool call that waits for a verdict."""
    return Event("runner.approval_required", {"gen_ai.tool.call.id": e.callId,
                                              "gen_ai.tool.name": e.toolName}, _ns(e.ts))


def run_spans(state: RunState, events: Sequence[TraceEvent], root_run_id: str, parent_span_id: int | None,
              resource: Resource) -> RunSpans:
    """Build the spans of one run from its committed state and trace (see the module
    docstring). `parent_span_id`: the research tool call's span for a child run, else None."""
    builder = _SpanBuilder(state, root_run_id, resource)
    spans: list[ReadableSpan] = []
    starts: dict[str, float] = {}
    skipped: dict[str, str] = {}
    children: list[str] = []
    span_events: list[Event] = []
    for e in events:
        if e.type == "tool_start":
            starts[e.callId] = e.ts
        elif e.type == "tool_skipped":
            skipped[e.callId] = e.reason
        elif e.type == "turn":
            spans.append(builder.turn_span(e))
        elif e.type in ("tool_result", "tool_cancelled"):
            spans.append(builder.tool_span(e, starts.pop(e.callId, None), skipped.pop(e.callId, None)))
            if e.type == "tool_result" and e.childRunId:
                children.append(e.childRunId)
        elif e.type == "verdict":
            span_events.append(_verdict_event(e))
        elif e.type == "approval_required":
            span_events.append(_approval_event(e))
    stops = [e for e in events if e.type == "run_stopped"]
    if stops:
        spans.insert(0, builder.run_span(events[0].ts, stops[-1], span_events, parent_span_id))
    return RunSpans(spans, bool(stops), children)


def resource_for() -> Resource:
    """service.name `runner`, and the Phoenix project ($RUNNER_OTEL_PROJECT, default `runner`)."""
    return Resource.create({"service.name": "runner", "service.version": __version__,
                            "openinference.project.name": os.environ.get(PROJECT_ENV) or "runner"})


def collect(store: RunStore, run_ids: Iterable[str], resource: Resource) -> tuple[list[ReadableSpan], list[str]]:
    """The spans of these runs and of every child run under them (each in its root's trace);
    also the runs that have not stopped (their `invoke_agent` span is left out).

    Raises:
        RunNotFound: a run id the store does not have. CorruptState: as `RunStore.load`.
    """
    spans: list[ReadableSpan] = []
    unfinished: list[str] = []
    todo: list[tuple[str, str, int | None]] = [(run_id, root_of(store, run_id), None) for run_id in run_ids]
    while todo:
        run_id, root, parent = todo.pop(0)
        state, events = store.load(run_id), store.read_trace(run_id)
        if parent is None and state.parent_run_id:
            parent = _call_span_of(store, state)
        built = run_spans(state, events, root, parent, resource)
        spans.extend(built.spans)
        if not built.stopped:
            unfinished.append(run_id)
        for child in built.children:
            todo.append((child, root, _child_parent(events, run_id, child)))
    return spans, unfinished


def root_of(store: RunStore, run_id: str) -> str:
    """The id of the run at the top of `run_id`'s parent chain (itself for a top-level run)."""
    state = store.load(run_id)
    seen = {run_id}
    while state.parent_run_id and state.parent_run_id not in seen:
        seen.add(state.parent_run_id)
        try:
            state = store.load(state.parent_run_id)
        except RunNotFound:
            break
    return state.run_id


def _child_parent(events: Sequence[TraceEvent], run_id: str, child: str) -> int | None:
    calls = [e.callId for e in events if e.type == "tool_result" and e.childRunId == child]
    return span_id_of(run_id, "tool", calls[0]) if calls else None


def _call_span_of(store: RunStore, child: RunState) -> int | None:
    assert child.parent_run_id is not None
    try:
        return _child_parent(store.read_trace(child.parent_run_id), child.parent_run_id, child.run_id)
    except RunNotFound:
        return None


class Exporter:
    """An OTLP/HTTP span exporter to one endpoint; remembers the span ids it sent, so a live
    exporter sends each span once."""

    def __init__(self, endpoint: str, *, timeout_s: float = 10.0) -> None:
        # The OTLP exporter logs each retry to stderr; runner says what failed, once (ExportFailed).
        logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.CRITICAL)
        self.endpoint = endpoint
        self._otlp = OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s)
        self.sent: set[tuple[int, int]] = set()

    def send(self, spans: Sequence[ReadableSpan]) -> int:
        """Send the spans not sent yet; returns how many were sent.

        Raises:
            ExportFailed: the receiver did not take them.
        """
        fresh = [s for s in spans if s.context is not None and (s.context.trace_id, s.context.span_id) not in self.sent]
        if not fresh:
            return 0
        refused = _refused(self.endpoint)
        if refused:  # the exporter would retry with back-off for seconds: nothing listens
            raise ExportFailed(f"the OTLP receiver at {self.endpoint} did not take {len(fresh)} span(s): {refused}")
        if self._otlp.export(fresh) is not SpanExportResult.SUCCESS:
            raise ExportFailed(f"the OTLP receiver at {self.endpoint} did not take {len(fresh)} span(s): "
                               "unreachable through the exporter's retries, or it refused them")
        self.sent.update((s.context.trace_id, s.context.span_id) for s in fresh if s.context is not None)
        return len(fresh)

    def close(self) -> None:
        self._otlp.shutdown()  # type: ignore[no-untyped-call,unused-ignore]


CONNECT_PROBE_S = 1.0
"""How long the check that a receiver listens waits for a TCP connection, seconds."""


def _refused(endpoint: str) -> str:
    """Why no receiver can take spans at `endpoint` (connection refused, no such host, no
    answer within `CONNECT_PROBE_S`), in words; "" when something listens there. One TCP
    connect: the OTLP exporter itself retries a refused connection with back-off for ~7 s."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "localhost", port), timeout=CONNECT_PROBE_S):
            return ""
    except OSError as exc:
        return f"nothing listens there ({exc.strerror or exc})"


class ExportFailed(RunnerError):
    """The OTLP receiver could not be reached or refused the spans."""


def export_runs(store: RunStore, run_ids: Sequence[str], endpoint: str) -> tuple[int, list[str]]:
    """Send the stored runs (and their child runs) as traces; returns (spans sent, runs that
    have not stopped: sent without their `invoke_agent` span).

    Raises:
        RunNotFound, CorruptState, ExportFailed.
    """
    exporter = Exporter(endpoint)
    try:
        spans, unfinished = collect(store, run_ids, resource_for())
        return exporter.send(spans), unfinished
    finally:
        exporter.close()


@dataclass(frozen=True)
class ExportReport:
    """What `export` sent: the traces URL, how many spans, each run's trace id (32 hex
    digits), and the runs that have not stopped (sent without their `invoke_agent` span)."""

    endpoint: str
    spans_sent: int
    traces: dict[str, str]
    unfinished: list[str]


def export(store: RunStore, run_ids: Sequence[str], endpoint: str) -> ExportReport:
    """`export_runs` to the traces URL of `endpoint` (see `traces_url`), with each run's trace id.

    Raises:
        UsageError: not an http(s) URL. RunNotFound, CorruptState, ExportFailed: as `export_runs`.
    """
    url = traces_url(endpoint)
    sent, unfinished = export_runs(store, run_ids, url)
    traces = {run_id: f"{trace_id_of(root_of(store, run_id)):032x}" for run_id in run_ids}
    return ExportReport(url, sent, traces, unfinished)


class LiveExport:
    """Sends the spans of runs driven in this process while they run: a thread looks at the
    store every `poll_s` and sends each newly committed turn and tool run, and a run's
    `invoke_agent` span once it stops. `stop()` sends what is left. Export trouble is
    reported through `on_problem` and never stops a run.

    Args:
        run_ids: the runs to follow (their child runs come along); None: every run whose
            trace grows after the start (a worker, a suite).
    """

    def __init__(self, store: RunStore, endpoint: str, run_ids: Iterable[str] | None = None, *,
                 poll_s: float = LIVE_POLL_S, on_problem: Callable[[str], None] | None = None) -> None:
        from runner.store.watch import RunWatch

        self.store, self.poll_s, self.on_problem = store, poll_s, on_problem
        self.exporter = Exporter(endpoint)
        self.resource = resource_for()
        self.run_ids = set(run_ids) if run_ids is not None else None
        self.watch = RunWatch(store) if run_ids is None else None
        if self.watch is not None:
            self.watch.changed()  # the baseline: runs already there are followed only once they change
        self._lengths: dict[str, int] = {}
        self._waiting: set[str] = set()
        self._problem: str | None = None
        """Runs whose `invoke_agent` span is held back (driven when last seen)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="runner-otel", daemon=True)
        self.spans_sent = 0

    def __enter__(self) -> LiveExport:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def follow(self, run_id: str) -> None:
        """Also follow this run (a run created after the start)."""
        if self.run_ids is not None:
            self.run_ids.add(run_id)

    def stop(self) -> None:
        """Stop following, and send what is left, the `invoke_agent` spans included."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._lengths.clear()
        self._tick(final=True)
        self.exporter.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._tick()

    def _tick(self, final: bool = False) -> None:
        """Send the new spans of the runs that changed. A run's `invoke_agent` span waits while
        the run is driven (it would be sent with a stop that the run is about to leave), so
        it goes out at `stop()` (followed runs) or once the store shows the run stopped."""
        try:
            ids = set(self.run_ids) if self.run_ids is not None else set(self.watch.changed() if self.watch else [])
            for run_id in sorted(ids | self._waiting):
                events = self.store.read_trace(run_id)
                if self._lengths.get(run_id) == len(events) and run_id not in self._waiting:
                    continue
                self._lengths[run_id] = len(events)
                spans, _ = collect(self.store, [run_id], self.resource)
                held = [s for s in spans if not final and self._held(s)]
                self._waiting.discard(run_id)
                if held:
                    self._waiting.add(run_id)
                self.spans_sent += self.exporter.send([s for s in spans if s not in held])
        except (RunnerError, OSError) as exc:
            if self.on_problem is not None and str(exc) != self._problem:  # said once, until it changes
                self.on_problem(f"otel export: {exc}")
            self._problem = str(exc)

    def _held(self, span: ReadableSpan) -> bool:
        agent = (span.attributes or {}).get("gen_ai.agent.id") if span.name == "invoke_agent runner" else None
        if not isinstance(agent, str):
            return False
        if self.run_ids is not None:
            return agent in self.run_ids
        return self.store.info(agent).shown_status in ("running", "queued")
