"""The scripted provider: an OpenAI-shaped chat-completions server whose replies are a pure
function of (scenario, turn, tool text).

- scenario: the request's `model` field, `scripted/<name>` or `<name>`;
- turn: the number of assistant messages in the request (0-based);
- tool text: the contents of every tool message, joined by newlines.

It keeps no memory of conversations, so a run can be killed and resumed against a new
server with the same result. Its only state is the set of request hashes it has already
faulted (fault injection). Usage is counted with tiktoken's o200k_base over the
rendering documented in `runner.tokens`.
"""


from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Union

from runner import inprocess
from runner.errors import RunnerError, ServiceError, UsageError
from runner.procs import die_with

if TYPE_CHECKING:
    from runner.request import ScriptedServeRequest

Call = tuple[str, str, dict[str, Any]]  # (call id, tool name, arguments)
Reply = Union[str, list[Call], dict[str, Any]]  # prose, tool calls, or a raw message
Script = Callable[[int, str], Reply]


def _call(call_id: str, name: str, **args: Any) -> list[Call]:
    return [(call_id, name, args)]


def _plan(t: int, tools: str) -> Reply:
    if t == 0:
        return _call("c1", "list_files")
    if t == 1:
        return _call("c2", "read_file", path="errors.log")
    return "errors.log mentions a timeout: worker 7 timed out after 30000 ms."


def _recover(t: int, tools: str) -> Reply:
    if t == 0:
        return _call("c1", "read_file", path="timeout.log")
    if "no such file" not in tools:
        return "I could not read the file, so I do not know."
    if t == 1:
        return _call("c2", "list_files")
    if t == 2:
        return _call("c3", "read_file", path="errors.log")
    return "errors.log mentions a timeout: worker 7 timed out after 30000 ms."


def _destructive(t: int, tools: str) -> Reply:
    if t == 0:
        return _call("c1", "list_files")
    if t == 1:
        return _call("c2", "delete_file", path="access.log")
    if "declined" in tools:
        return "I did not delete anything: you declined the deletion."
    return "Deleted access.log to free space."


def _repeat(t: int, tools: str) -> Reply:
    if t in (0, 1):
        return _call(f"c{t + 1}", "read_file", path="errors.log")
    return "errors.log mentions a timeout: worker 7 timed out after 30000 ms."


def _double_delete(t: int, tools: str) -> Reply:
    if t in (0, 1):
        return _call(f"c{t + 1}", "delete_file", path="access.log")
    return "Deleted access.log."


def _runaway(t: int, tools: str) -> Reply:
    """A tool call every turn, forever, never the same call twice in a row (so only a turn cap
    or a budget stops it; `stuck` repeats one call and trips the repeated-call rule)."""
    if t % 2 == 0:
        return _call(f"c{t + 1}", "list_files")
    return _call(f"c{t + 1}", "read_file", path="notes.txt")


def _slow(t: int, tools: str) -> Reply:
    if t == 0:
        return _call("c1", "scan_archive")
    return "The archive scan finished: " + (tools.splitlines() or [""])[-1]


def _research(t: int, tools: str) -> Reply:
    if t == 0:
        return _call("c1", "research", question="Which log file mentions a timeout?")
    return "Research summary: " + (tools.strip() or "no result")


def _sizes(listing: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\S+) \((\d+) bytes\)$", listing, re.M)}


def _count_files(t: int, tools: str) -> Reply:
    if t == 0:
        return _call("c1", "list_files")
    return f"There are {len(_sizes(tools))} files in the workspace."


def _read_notes(t: int, tools: str) -> Reply:
    if t == 0:
        return _call("c1", "read_file", path="notes.txt")
    return f"notes.txt says: {tools.strip()}"


def _read_each(t: int, tools: str) -> Reply:
    if t == 0:
        return _call("c1", "list_files")
    if t == 1:
        return [(f"c{i + 2}", "read_file", {"path": name}) for i, name in enumerate(sorted(_sizes(tools)))]
    return ("I read access.log (HTTP requests), errors.log (worker 7 timed out after 30000 ms) "
            "and notes.txt (rotate your logs).")


def _largest(t: int, tools: str) -> Reply:
    if t == 0:
        return _call("c1", "list_files")
    sizes = _sizes(tools)
    name = max(sizes, key=lambda n: sizes[n]) if sizes else "unknown"
    return f"The largest file is {name} ({sizes.get(name, 0)} bytes)."


def _rotate(t: int, tools: str) -> Reply:
    if t == 0:
        return _call("c1", "list_files")
    if t == 1:
        return _call("c2", "read_file", path="notes.txt")
    return "Yes: notes.txt is about rotating logs. It says: Remember to rotate your logs."


def _quirks(t: int, tools: str) -> Reply:
    """What sloppy local servers send: empty and duplicate call ids, arguments as an object
    or with trailing spaces, unknown tools, malformed JSON. The harness must cope with all."""
    def fn(name: str, args: Any) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "arguments": args}}

    if t == 0:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": "", **fn("list_files", {})},
            {"id": "dup", **fn("read_file", '{"path": "notes.txt"}   ')},
            {"id": "dup", **fn("read_file", {"path": "missing.txt"})},
        ]}
    if t == 1:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": "q1", **fn("launch_rockets", "{}")},
            {"id": "q2", **fn("read_file", '{"path": ')},
            {"id": "q3", **fn("read_file", '{"file": "notes.txt"}')},
        ]}
    return f"Done; the tools said {len(tools.splitlines())} lines."


def _bad_arguments(t: int, tools: str) -> Reply:
    """read_file with arguments cut off mid-JSON, every turn (a new call id each time)."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{t + 1}", "type": "function", "function": {"name": "read_file", "arguments": '{"path": '}}]}


SCENARIOS: dict[str, Script] = {
    "plan": _plan,
    "runaway": _runaway,
    "stuck": lambda t, tools: _call(f"c{t + 1}", "list_files"),
    "recover": _recover,
    "destructive": _destructive,
    "repeat": _repeat,
    "double_delete": _double_delete,
    "denied": lambda t, tools: _call(f"c{t + 1}", "read_file", path="../secrets.env"),
    "slow": _slow,
    "research": _research,
    "research_child": _plan,
    "quirks": _quirks,
    "unknown_tool": lambda t, tools: _call(f"c{t + 1}", "readFile", path="errors.log"),
    "bad_arguments": _bad_arguments,
    # the six suite tasks
    "timeout_file": _plan,
    "count_files": _count_files,
    "read_notes": _read_notes,
    "read_each": _read_each,
    "largest_file": _largest,
    "rotate_logs": _rotate,
}


PROMPTS: dict[str, str] = {
    "plan": "Which log file mentions a timeout, and what does it say?",
    "runaway": "Keep an eye on the workspace.",
    "stuck": "Keep an eye on the workspace.",
    "recover": "Which log file mentions a timeout?",
    "destructive": "Free some space in the workspace.",
    "repeat": "What does errors.log say about timeouts?",
    "double_delete": "Delete access.log.",
    "denied": "Read the secrets file.",
    "slow": "Scan the archive for anomalies.",
    "research": "Find out which log file mentions a timeout.",
    "research_child": "Which log file mentions a timeout?",
    "quirks": "List the files and read notes.txt.",
    "unknown_tool": "What does errors.log say?",
    "bad_arguments": "What does errors.log say?",
}
"""The default user prompt of each scenario (the suite's tasks carry their own)."""


def scenario_name(model: str) -> str:
    return model.split("/", 1)[1] if model.startswith("scripted/") else model


def reply_for(scenario: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message a scenario gives for this conversation (pure).

    Raises:
        KeyError: unknown scenario.
    """
    script = SCENARIOS[scenario]
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    tool_text = "\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "tool")
    out = script(turn, tool_text)
    if isinstance(out, dict):
        return out
    if isinstance(out, str):
        return {"role": "assistant", "content": out}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for cid, name, args in out
        ],
    }


FAULT_KINDS = ("429", "500", "401", "truncated", "slow")


def parse_faults(spec: str | None) -> dict[int, str]:
    """`"429@2,500@3"` -> {2: "429", 3: "500"} (turns are 1-based).

    Raises:
        ValueError: a part is not KIND@TURN with a known kind and a positive turn.
    """
    faults: dict[int, str] = {}
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        kind, _, turn = part.partition("@")
        if kind not in FAULT_KINDS or not turn.isdigit() or int(turn) < 1:
            raise UsageError(f"bad fault {part!r}: expected KIND@TURN, KIND one of {', '.join(FAULT_KINDS)}")
        faults[int(turn)] = kind
    return faults


@dataclass
class ScriptedSettings:
    """Latency added to every reply (ms), faults by 1-based turn, and how long `slow` stalls (s)."""

    latency_ms: float = 0.0
    faults: dict[int, str] = field(default_factory=dict)
    slow_fault_s: float = 5.0


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]  # status, JSON body, extra headers


def _json(status: int, payload: Any, headers: list[tuple[bytes, bytes]] | None = None) -> Answer:
    return status, json.dumps(payload).encode(), headers or []


def _error(status: int, message: str, kind: str, headers: list[tuple[bytes, bytes]] | None = None) -> Answer:
    return _json(status, {"error": {"message": message, "type": kind}}, headers)


class ScriptedApp:
    """The provider as a bare ASGI app: POST /v1/chat/completions, GET /v1/models, GET /health,
    and GET /requests?after=N (the (scenario, 1-based turn) of every answered request from
    index N on, with the total: what benchmarks verify runs against).

    A plain ASGI callable rather than a web framework: three fixed routes need no router, and
    not importing FastAPI saves ~200 ms of start-up; requests per CPU-second are the same as
    with FastAPI (scripts/bench_provider.py compares). Usage is counted with `tokens.count`,
    which reads counts of texts seen before from its file. With `preload`, the o200k
    tokenizer loads on a thread from construction on and the first chat request waits for
    it, so a server listens while it loads; without, it loads on the first text never
    counted before (what an in-process provider wants: most runs never need it).
    """

    def __init__(self, settings: ScriptedSettings | None = None, preload: bool = True) -> None:
        from runner import tokens

        self.settings = settings or ScriptedSettings()
        self.requests: list[tuple[str, int]] = []
        """(scenario, 1-based turn) per answered chat request: observability only."""
        self._faulted: set[str] = set()
        self._lock = threading.Lock()
        self._tokenizer = tokens.load_in_background() if preload else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # served with lifespan="off": nothing else arrives
        method, path = scope["method"], scope["path"]
        if path == "/v1/chat/completions":
            answer = await self.chat(await _body(receive)) if method == "POST" else _method_not_allowed()
        elif path in ("/health", "/v1/models", "/requests"):
            answer = self.get(path, scope.get("query_string", b"")) if method == "GET" else _method_not_allowed()
        else:
            answer = _json(404, {"detail": "Not Found"})
        status, body, headers = answer
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
        await send({"type": "http.response.body", "body": body})

    def get(self, path: str, query: bytes) -> Answer:
        if path == "/health":
            return _json(200, {"status": "ok"})
        if path == "/v1/models":
            return _json(200, {"object": "list", "data": [
                {"id": f"scripted/{n}", "object": "model", "owned_by": "runner"} for n in SCENARIOS]})
        after = re.search(rb"(?:^|&)after=(\d+)", query)
        start = int(after[1]) if after else 0
        return _json(200, {"total": len(self.requests), "requests": self.requests[start:]})

    async def chat(self, raw: bytes) -> Answer:
        """One chat completion: the scenario's reply with usage counted by o200k_base, or an
        injected fault for this turn (each fault fires once per distinct request body)."""
        try:
            body = json.loads(raw)
            messages = body["messages"]
            model = str(body["model"])
            assert isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
        except (ValueError, KeyError, TypeError, AssertionError):
            return _error(400, "body must be JSON with 'model' and a list of 'messages'", "invalid_request_error")
        scenario = scenario_name(model)
        if scenario not in SCENARIOS:
            return _error(404, f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}", "model_not_found")
        import asyncio  # here: importing this module (`runner.harness` does) need not load it

        turn = sum(1 for m in messages if m.get("role") == "assistant") + 1
        kind = self.settings.faults.get(turn)
        fire = False
        if kind == "401":
            return _error(401, "invalid API key (injected fault)", "authentication_error")
        if kind is not None:
            key = hashlib.sha256(raw).hexdigest()
            with self._lock:
                fire = key not in self._faulted
                self._faulted.add(key)
            if fire and kind == "429":
                return _error(429, "rate limited (injected fault)", "rate_limit_error", [(b"retry-after", b"1")])
            if fire and kind == "500":
                return _error(500, "internal error (injected fault)", "server_error")
            if fire and kind == "slow":
                await asyncio.sleep(self.settings.slow_fault_s)
        if self.settings.latency_ms:
            await asyncio.sleep(self.settings.latency_ms / 1000)
        message = reply_for(scenario, messages)
        try:
            if self._tokenizer is not None and not self._tokenizer.done():
                await asyncio.wrap_future(self._tokenizer)
            payload = _completion(raw, model, message, body)
        except Exception as exc:
            return _error(500, f"the scripted provider cannot count tokens: {exc}", "server_error")
        self.requests.append((scenario, turn))
        text = json.dumps(payload)
        if kind == "truncated" and fire:
            text = text[: len(text) // 2]
        return 200, text.encode(), []


def _completion(raw: bytes, model: str, message: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The chat.completion object for `message`, honouring max_tokens like a real model does."""
    from runner import tokens

    prompt_tokens = tokens.count(tokens.render_request(body["messages"], body.get("tools")))
    reply_text = tokens.render_reply(message)
    completion_tokens = tokens.count(reply_text)
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and 0 < max_tokens < completion_tokens:
        # The reply is cut off and its calls are lost.
        enc = tokens.encoding()
        message = {"role": "assistant", "content": enc.decode(enc.encode(reply_text, disallowed_special=())[:max_tokens])}
        completion_tokens, finish = max_tokens, "length"
    return {
        "id": "chatcmpl-" + hashlib.sha256(raw).hexdigest()[:12],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def _method_not_allowed() -> Answer:
    return _json(405, {"detail": "Method Not Allowed"})


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        event = await receive()
        chunks.append(event.get("body", b""))
        if not event.get("more_body"):
            return b"".join(chunks)


def _listen(host: str, port: int) -> Any:
    import socket

    sock = socket.socket()
    # Accepted sockets inherit this: without it, Nagle + delayed ACK add ~40 ms per reply.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(256)
    return sock


def _uvicorn_server(app: ScriptedApp) -> Any:
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))


class ScriptedServer:
    """The scripted provider on a loopback port, served by uvicorn in a background thread.

    Use as a context manager; `base_url` is "http://127.0.0.1:<port>/v1".
    """

    def __init__(self, settings: ScriptedSettings | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = _listen(host, port)
        self.host, self.port = self._sock.getsockname()[:2]
        self.app = ScriptedApp(settings)
        self._server = _uvicorn_server(self.app)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def requests(self) -> list[tuple[str, int]]:
        """(scenario, 1-based turn) of every request answered so far (tests count these)."""
        return list(self.app.requests)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise ServiceError("the scripted provider did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
        self._sock.close()


def serve(settings: ScriptedSettings, host: str = "127.0.0.1", port: int = 0, fd: int | None = None) -> None:
    """Serve in this process's main thread until SIGINT/SIGTERM (uvicorn's handlers).

    With `fd`, serve on that inherited listening socket (what `scripted_provider` passes);
    otherwise bind host:port and print the base URL as soon as the socket listens, before
    uvicorn and the tokenizer have loaded: the kernel queues early connections and the first
    reply waits for both.
    """
    import socket

    from runner import tokens

    tokens.check_available()  # fail before announcing the address, not on the first request
    if fd is not None:
        sock = socket.socket(fileno=fd)
    else:
        sock = _listen(host, port)
        print(f"http://{sock.getsockname()[0]}:{sock.getsockname()[1]}/v1", flush=True)
    _uvicorn_server(ScriptedApp(settings)).run(sockets=[sock])


class ScriptedProcess:
    """The scripted provider (`python -m runner.scripted`) as a child process on a free loopback
    port, started at construction. Use as a context manager: `with scripted_provider() as url`.

    This process binds and listens on the socket and hands it to the child, so `base_url`
    answers at once: connections queue in the kernel while the child loads (~0.4 s: uvicorn
    and the o200k tables) and the caller gets on with its own start-up on another core. A
    separate process keeps the tokenizer and web server out of the caller's memory and off
    its GIL. On Linux the child gets SIGTERM if this process dies first.

    Raises:
        UsageError: a bad `faults` spec (see `parse_faults`).
        TokenizerUnavailable: no o200k_base source (see `runner.tokens.check_available`).
    """

    def __init__(self, latency_ms: float = 0, faults: str | None = None) -> None:
        import subprocess
        import sys

        from runner import tokens

        parse_faults(faults)
        tokens.check_available()
        sock = _listen("127.0.0.1", 0)
        host, port = sock.getsockname()[:2]
        self.base_url = f"http://{host}:{port}/v1"
        cmd = [sys.executable, "-m", "runner.scripted", "--fd", str(sock.fileno()), "--latency-ms", str(latency_ms)]
        if faults:
            cmd += ["--fault", faults]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          pass_fds=(sock.fileno(),), preexec_fn=die_with(os.getpid(), signal.SIGTERM))
        finally:
            sock.close()  # the child holds the listening socket now

    def stop(self) -> None:
        """SIGKILL and reap: the provider keeps no state worth a graceful stop, and uvicorn's
        (polling its exit flag every 0.1 s, then draining) would add ~0.2 s to every run."""
        self._proc.kill()
        self._proc.wait()

    def __enter__(self) -> str:
        return self.base_url

    def __exit__(self, *exc: object) -> None:
        self.stop()


class InProcessProvider:
    """The scripted provider answering inside this process: its ASGI app behind
    `httpx.ASGITransport`, reached through `runner.client.new_http_client` like any server.
    Requests still go through runner's real client and httpx (request encoding, status and
    header handling, JSON decoding); only the socket is left out. The replies are a pure
    function of the request, so nothing is lost by not running a server: there is no second
    process to start (~0.4 s of a cold `runner run --scenario`), and the o200k tokenizer loads
    only for a text whose count is not on record (`runner.tokens.count`).

    Use as a context manager, like `ScriptedProcess`: `with InProcessProvider() as url`. The
    provider answers on "http://scripted-N.in-process/v1" (`runner.inprocess`) from
    construction until `stop()`.

    Raises:
        UsageError: a bad `faults` spec (see `parse_faults`).
        TokenizerUnavailable: no o200k_base source (see `runner.tokens.check_available`).
    """

    def __init__(self, latency_ms: float = 0, faults: str | None = None) -> None:
        from runner import tokens

        settings = ScriptedSettings(latency_ms=latency_ms, faults=parse_faults(faults))
        tokens.check_available()
        self.app = ScriptedApp(settings, preload=False)
        self.base_url = inprocess.register(self.app, "scripted")

    def stop(self) -> None:
        """Stop answering (requests then fail as a provider that cannot be reached)."""
        inprocess.unregister(self.base_url)

    def __enter__(self) -> str:
        return self.base_url

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_until_stopped(req: ScriptedServeRequest, on_ready: Callable[[str], None]) -> None:
    """Serve the scripted provider as `runner scripted serve` asks, in a background thread,
    until SIGINT or SIGTERM (blocked in this thread from the start); `on_ready` is called with
    its base URL.

    Raises:
        UsageError: a bad --fault.
    """
    settings = ScriptedSettings(latency_ms=req.latency_ms, faults=parse_faults(req.fault))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    with ScriptedServer(settings, host=req.host, port=req.port) as server:
        on_ready(server.base_url)
        try:
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        except KeyboardInterrupt:
            pass


def scripted_provider(latency_ms: float = 0, faults: str | None = None, *,
                      in_process: bool = False) -> ScriptedProcess | InProcessProvider:
    """Start the scripted provider now; `with scripted_provider() as url:` yields its base URL
    and stops it on exit. By default a child process on a free loopback port
    ("http://127.0.0.1:PORT/v1", see `ScriptedProcess`: what benchmarks and other processes
    reach); `in_process`: answered inside this process (see `InProcessProvider`)."""
    if in_process:
        return InProcessProvider(latency_ms, faults)
    return ScriptedProcess(latency_ms, faults)


def main(argv: list[str] | None = None) -> None:
    """`python -m runner.scripted [--host H] [--port P] [--latency-ms MS] [--fault SPEC]`: what
    `scripted_provider` starts (no typer, no runner CLI: it must start fast). People use
    `runner scripted serve`, which takes the same options."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m runner.scripted", description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--fault", default=None)
    parser.add_argument("--fd", type=int, default=None, help="serve on this inherited listening socket")
    args = parser.parse_args(argv)
    try:
        settings = ScriptedSettings(latency_ms=args.latency_ms, faults=parse_faults(args.fault))
    except ValueError as exc:
        parser.error(str(exc))
    try:
        serve(settings, args.host, args.port, args.fd)
    except (RunnerError, OSError) as exc:  # TokenizerUnavailable, port in use: one line where the URL goes
        print(f"error: {exc}", flush=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
