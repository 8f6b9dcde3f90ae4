"""The view's HTTP face: a Starlette app over one run store.

Routes:

- ``GET /``: the runs list (``?status=&model=&q=&page=``); ``GET /events``: its live updates.
- ``GET /runs/{id}``: one run; ``GET /runs/{id}/events``: its live updates (server-sent
  events: ``event: update``, data a JSON object of page part id -> HTML, sent when a commit
  changed what the part shows); ``GET /runs/{id}/trace.jsonl``: the raw trace.
- ``POST /runs/{id}/verdict``: approve or reject the call the run waits on (form fields
  ``call_id``, ``verdict`` = approve|reject, ``reason``, ``csrf``).
- ``GET /suites``, ``GET /suites/{name}``, ``GET /suites/{name}.png``: the suite reports.
- ``GET /static/...``: the page's own script and style (shipped in the package).

Security (`Guard`): with a token, every request must carry it (``?token=`` once, which sets a
``SameSite=Strict`` cookie, or the cookie, or ``Authorization: Bearer``), else 401. Without
one (loopback only), the ``Host`` header must name a loopback address, so a page on another
site cannot reach the view through DNS rebinding. A POST must carry the per-server CSRF
secret that only the view's own pages hold, and its ``Origin``/``Sec-Fetch-Site``, when sent,
must say it came from the view itself. Pages are rendered with autoescaping templates and sent
with a Content-Security-Policy that allows only the view's own script.
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode

import anyio
import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import runner.store.watch as live
import runner.view.pages as pages
from runner.errors import NotPending, RunBusy, RunnerError, RunNotFound, UsageError
from runner.state import RunState
from runner.store import RunStore, default_owner

HERE = Path(__file__).parent
COOKIE = "runner_view_token"
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                 b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
T = TypeVar("T")


@dataclass
class ViewSettings:
    """What one view server serves and how it guards it.

    Attributes:
        runs_root: the runs directory, where suite reports are (`runner suite` writes them
            there whichever store holds the runs).
        token: required on every request when set (always set for a non-loopback host).
        poll_s: how often a live page checks the store for a change, seconds.
    """

    store: RunStore
    runs_root: Path
    token: str | None = None
    poll_s: float = 0.25
    keepalive_s: float = 15.0
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    """The per-server secret every form carries; a page on another site cannot read it."""
    stopping: Callable[[], bool] = lambda: False
    """True once the server is shutting down: live streams end, so it stops at once."""


class Guard:
    """ASGI middleware: the token (or loopback Host) check, and security headers on every
    response (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: ViewSettings) -> None:
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self._refusal(request)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def _refusal(self, request: Request) -> Response | None:
        token = self.settings.token
        if token is None:
            if _host_name(request.headers.get("host", "")) not in LOOPBACK_NAMES:
                return PlainTextResponse("403: this view answers only to a loopback host name\n", 403)
            return None
        given = request.query_params.get("token")
        if given is not None and _same(given, token) and request.method in ("GET", "HEAD"):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            response = RedirectResponse(target, 303)
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
            return response
        bearer = request.headers.get("authorization", "")
        carried = request.cookies.get(COOKIE) or (bearer[7:] if bearer.lower().startswith("bearer ") else None)
        if carried is None or not _same(carried, token):
            return PlainTextResponse("401: this runner view needs its token: open it once with ?token=TOKEN\n", 401,
                                     headers={"www-authenticate": 'Bearer realm="runner view"'})
        return None


def _host_name(header: str) -> str:
    """The host part of a Host header: `127.0.0.1:8000` -> `127.0.0.1`, `[::1]:80` -> `[::1]`."""
    return header.split("]")[0] + "]" if header.startswith("[") else header.rsplit(":", 1)[0]


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["usd"] = lambda v: f"{v:.6f}"
    env.filters["num"] = lambda v: f"{v:,.0f}"
    env.filters["ms"] = lambda v: f"{v:,.1f}" if v < 10 else f"{v:,.0f}"
    env.filters["short"] = lambda v, n=90: v if len(v) <= n else v[: n - 1] + "…"
    env.globals["chart"] = pages.turn_chart
    env.globals["first_prompt"] = pages.first_prompt
    env.globals["tok_s"] = pages.tok_s
    return env


def create_app(settings: ViewSettings) -> ASGIApp:
    """The view as an ASGI app (wrapped in `Guard`)."""
    return Guard(Starlette(routes=_Pages(settings).routes()), settings)


class _Pages:
    """The view's route handlers over one store, and what they share: the templates and the
    lock that lets one store call run at a time (the store objects are not shared-state safe).
    """

    def __init__(self, settings: ViewSettings) -> None:
        self.settings, self.store = settings, settings.store
        self.env = _templates()
        self.lock = threading.Lock()

    def routes(self) -> list[Route | Mount]:
        """Every route of the view (see the module docstring), the static files included."""
        return [
            Route("/", self.runs_list), Route("/events", self.list_events), Route("/health", self.health),
            Route("/runs/{run_id}", self.run_page), Route("/runs/{run_id}/events", self.run_events),
            Route("/runs/{run_id}/trace.jsonl", self.run_trace),
            Route("/runs/{run_id}/verdict", self.verdict, methods=["POST"]),
            Route("/suites", self.suites), Route("/suites/{name}", self.suite),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker thread, holding the store lock; returns its result."""
        def locked() -> T:
            with self.lock:
                return fn(*args)
        return await anyio.to_thread.run_sync(locked)

    def html(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        """Template `name` rendered with `context` and the CSRF secret, as an HTML response."""
        return HTMLResponse(self.env.get_template(name).render(csrf=self.settings.csrf, **context), status)

    def list_parts(self, view: pages.RunsPage) -> dict[str, str]:
        """The live parts of the runs list: page part id -> HTML."""
        return {"runs-list": self.env.get_template("_runs_list.html").render(view=view, csrf=self.settings.csrf)}

    def run_parts(self, view: pages.RunView) -> dict[str, str]:
        """The live parts of one run's page: page part id (``run-summary``, ...) -> HTML."""
        parts = {}
        for part in ("summary", "stop", "chart", "transcript", "trace"):
            parts[f"run-{part}"] = self.env.get_template(f"_run_{part}.html").render(
                view=view, state=view.state, csrf=self.settings.csrf, trace_lines=pages.trace_lines)
        return parts

    async def runs_list(self, request: Request) -> Response:
        """``GET /``: the runs list, filtered by the query string."""
        f = _filters(request)
        view = await self.call(lambda: pages.runs_page(self.store, **f))
        query = urlencode({k if k != "text" else "q": v for k, v in f.items() if v})
        return self.html("runs.html", view=view, parts=self.list_parts(view),
                         events_url="/events" + (f"?{query}" if query else ""),
                         store_url=self.store.url, statuses=pages.STATUSES)

    async def run_page(self, request: Request) -> Response:
        """``GET /runs/{id}``: one run's page; 404 for an unknown run, 500 for an unreadable one."""
        run_id = request.path_params["run_id"]
        try:
            view = await self.call(pages.run_view, self.store, run_id)
        except RunNotFound as exc:
            return self.html("error.html", 404, title="no such run", message=str(exc))
        except RunnerError as exc:
            return self.html("error.html", 500, title="this run cannot be read", message=str(exc))
        return self.html("run.html", view=view, state=view.state, parts=self.run_parts(view),
                         events_url=f"/runs/{run_id}/events")

    async def run_trace(self, request: Request) -> Response:
        """``GET /runs/{id}/trace.jsonl``: the run's raw trace as JSON lines."""
        run_id = request.path_params["run_id"]
        try:
            events = await self.call(self.store.read_trace, run_id)
        except RunNotFound as exc:
            return PlainTextResponse(f"{exc}\n", 404)
        return PlainTextResponse("".join(line + "\n" for line in pages.trace_lines(events)),
                                 media_type="application/x-ndjson")

    async def run_events(self, request: Request) -> Response:
        """``GET /runs/{id}/events``: the run page's live updates (server-sent events)."""
        run_id = request.path_params["run_id"]
        store = self.store
        running = [True]

        def token() -> Any:
            return live.run_token(store, run_id, running[0])

        def build() -> dict[str, str]:
            view = pages.run_view(store, run_id)
            running[0] = view.info.shown_status == "running"
            return {**self.run_parts(view), "status": view.info.shown_status}

        return _event_stream(self.settings, self.call, token, build)

    async def list_events(self, request: Request) -> Response:
        """``GET /events``: the runs list's live updates (server-sent events)."""
        f = _filters(request)
        store = self.store
        running = [True]

        def token() -> Any:
            return live.list_token(store, running[0])

        def build() -> dict[str, str]:
            view = pages.runs_page(store, **f)
            running[0] = any(i.shown_status == "running" for i in view.rows)
            return self.list_parts(view)

        return _event_stream(self.settings, self.call, token, build)

    async def verdict(self, request: Request) -> Response:
        """``POST /runs/{id}/verdict``: approve or reject the call the run waits on, once the
        form passes the CSRF and origin checks (403 otherwise); redirects to the run."""
        run_id = request.path_params["run_id"]
        form = await _form(request)
        problem = _forged(request, form.get("csrf", ""), self.settings.csrf)
        if problem:
            return self.html("error.html", 403, title="refused", message=problem)
        call_id, choice, reason = (form.get(k, "").strip() for k in ("call_id", "verdict", "reason"))
        client = request.client.host if request.client else "?"
        try:
            await self.call(give_web_verdict, self.store, run_id, call_id, choice, reason,
                            f"web: {default_owner()} for {client}")
        except RunNotFound as exc:
            return self.html("error.html", 404, title="no such run", message=str(exc))
        except RunBusy as exc:
            return self.html("error.html", 409, title="the run is busy", message=str(exc))
        except UsageError as exc:
            return self.html("error.html", 400, title="no verdict given", message=str(exc))
        except RunnerError as exc:  # the store refused (a read-only runs folder, a lost database)
            return self.html("error.html", 500, title="no verdict given", message=str(exc))
        return RedirectResponse(f"/runs/{run_id}", 303)

    async def suites(self, request: Request) -> Response:
        """``GET /suites``: the list of suite reports."""
        return self.html("suites.html", files=await self.call(pages.suite_files, self.settings.runs_root))

    async def suite(self, request: Request) -> Response:
        """``GET /suites/{name}``: one suite report; ``GET /suites/{name}.png``: its plot."""
        name = request.path_params["name"]
        found = await self.call(pages.suite_file, self.settings.runs_root, name.removesuffix(".png"))
        if found is None:
            return self.html("error.html", 404, title="no such suite report", message=name)
        if name.endswith(".png"):
            return FileResponse(found.path.with_suffix(".png"), media_type="image/png") if found.has_plot else \
                PlainTextResponse("no plot\n", 404)
        from runner.suite import SuiteReport

        report = SuiteReport.model_validate_json(found.path.read_text())
        return self.html("suite.html", file=found, report=report)

    async def health(self, request: Request) -> Response:
        """``GET /health``: ``ok``."""
        return PlainTextResponse("ok\n")


def _filters(request: Request) -> dict[str, Any]:
    """The runs list's filters from the query string: ``status`` (one of `pages.STATUSES`, else
    empty), ``model``, ``text`` (from ``q``) and ``page`` (a number, else 1)."""
    q = request.query_params
    page = q.get("page", "1")
    return {"status": q.get("status", "") if q.get("status", "") in pages.STATUSES else "",
            "model": q.get("model", ""), "text": q.get("q", ""), "page": int(page) if page.isdigit() else 1}


async def _form(request: Request) -> dict[str, str]:
    """An HTML form's fields (application/x-www-form-urlencoded, at most 64 KiB; the first
    value of each), read without a multipart parser; empty for any other body."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return {}
    body = await request.body()
    if len(body) > 65_536:
        return {}
    return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}


def _forged(request: Request, csrf: str, expected: str) -> str | None:
    """Why a state-changing request is refused as possibly cross-site, or None."""
    if not _same(csrf, expected):
        return "the form's CSRF token is missing or wrong (reload the page and try again)"
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host', '')}":
        return f"a request from another origin ({origin}) is refused"
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"a {site} request is refused"
    return None


def give_web_verdict(store: RunStore, run_id: str, call_id: str, choice: str, reason: str, by: str) -> None:
    """Approve or reject the call run `run_id` waits on, as the operator `by`: the same
    `verdict` event `runner resume --approve/--reject` writes, then queue the run for a
    worker (or `runner resume RUN_ID`).

    Raises:
        RunNotFound. RunBusy: another process drives the run. NotPending: the run does not
        wait on `call_id`. UsageError: `choice` is not approve or reject.
    """
    from runner.harness import give_verdict

    if choice not in ("approve", "reject"):
        raise UsageError(f"a verdict is approve or reject, not {choice!r}")
    info = store.info(run_id)
    _waits_for(info.state, call_id)  # refused: the run is left as it is (queued stays queued)
    lease = store.claim(run_id, owner=by)
    try:
        state = store.load(run_id)
        _waits_for(state, call_id)  # again: it may have moved on meanwhile
        give_verdict(store, lease, state, call_id, choice, reason)
    except BaseException:
        store.release(lease, runnable=info.shown_status == "queued")
        raise
    store.release(lease, runnable=True)


def _waits_for(state: RunState, call_id: str) -> None:
    """NotPending unless the run waits for a verdict on `call_id` and has none yet."""
    from runner.loop import verdict_call

    it = state.interruption
    if state.status != "interrupted" or it is None or it.type != "approval":
        raise NotPending(f"run {state.run_id} does not wait for a verdict on call {call_id!r} (it is {state.status})")
    if it.call_id != call_id:
        raise NotPending(f"run {state.run_id} waits for a verdict on call {it.call_id} ({it.tool_name}), "
                         f"not on {call_id!r}")
    verdict_call(state, call_id)


def _event_stream(settings: ViewSettings, call: Callable[..., Any], token: Callable[[], Any],
                  build: Callable[[], dict[str, str]]) -> StreamingResponse:
    """Server-sent events: the parts of a page that changed, each time the store's token
    changes (checked every `poll_s`), and a comment line every `keepalive_s` otherwise."""

    async def stream() -> AsyncIterator[str]:
        yield "retry: 1000\n\n"
        seen: Any = object()
        sent: dict[str, str] = {}
        quiet_s = 0.0
        while not settings.stopping():
            try:
                now = await call(token)
                if now != seen:
                    seen = now
                    parts = await call(build)
                    changed = {k: v for k, v in parts.items() if sent.get(k) != v}
                    sent = parts
                    if changed:
                        quiet_s = 0.0
                        yield f"event: update\ndata: {json.dumps(changed)}\n\n"
            except RunnerError as exc:  # said once, until it changes (a run deleted, a damaged trace)
                if sent.get("problem") != str(exc):
                    sent = {"problem": str(exc)}
                    yield f"event: problem\ndata: {json.dumps(str(exc))}\n\n"
            if quiet_s >= settings.keepalive_s:
                quiet_s = 0.0
                yield ": keep-alive\n\n"
            await anyio.sleep(settings.poll_s)
            quiet_s += settings.poll_s

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})

