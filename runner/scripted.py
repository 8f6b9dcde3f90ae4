"""The scripted provider: an OpenAI-shaped chat-completions server whose replies are a pure
function of (scenario, turn, tool text).

- scenario: the request's `model` field, `scripted/<name>` or `<name>`;
- turn: the number of assistant messages in the request (0-based);
- tool text: the contents of every tool message, joined by newlines.

It keeps no memory of conversations, so a run can be killed and resumed against a new
server with the same result. Its only state is the set of request hashes it has already
faulted (fault injection, R1.6). Usage is counted with tiktoken's o200k_base over the
rendering documented in `runner.tokens`.
"""


import asyncio
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from runner.errors import ServiceError, UsageError

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
    if "Call list_files" not in tools:
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


def create_app(settings: ScriptedSettings | None = None) -> Any:
    """The FastAPI app: POST /v1/chat/completions, GET /v1/models, GET /health."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    from runner import tokens

    settings = settings or ScriptedSettings()
    faulted: set[str] = set()
    lock = threading.Lock()
    app = FastAPI(title="runner scripted provider")
    app.state.requests = []  # (scenario, 1-based turn) per answered request: observability only
    tokens.encoding()  # load (and verify) the tokenizer before the first request

    def error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> Response:
        return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status, headers=headers)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list",
                "data": [{"id": f"scripted/{n}", "object": "model", "owned_by": "runner"} for n in SCENARIOS]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
            messages = body["messages"]
            model = str(body["model"])
            assert isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
        except (ValueError, KeyError, TypeError, AssertionError):
            return error(400, "body must be JSON with 'model' and a list of 'messages'", "invalid_request_error")
        scenario = scenario_name(model)
        if scenario not in SCENARIOS:
            return error(404, f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}", "model_not_found")
        turn = sum(1 for m in messages if m.get("role") == "assistant") + 1
        kind = settings.faults.get(turn)
        if kind == "401":
            return error(401, "invalid API key (injected fault)", "authentication_error")
        if kind is not None:
            key = hashlib.sha256(raw).hexdigest()
            with lock:
                fire = key not in faulted
                faulted.add(key)
            if fire and kind == "429":
                return error(429, "rate limited (injected fault)", "rate_limit_error", {"Retry-After": "1"})
            if fire and kind == "500":
                return error(500, "internal error (injected fault)", "server_error")
            if fire and kind == "slow":
                await asyncio.sleep(settings.slow_fault_s)
        if settings.latency_ms:
            await asyncio.sleep(settings.latency_ms / 1000)
        message = reply_for(scenario, messages)
        app.state.requests.append((scenario, turn))
        prompt_tokens = tokens.count(tokens.render_request(messages, body.get("tools")))
        completion_tokens = tokens.count(tokens.render_reply(message))
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, int) and 0 < max_tokens < completion_tokens:
            # Honour max_tokens like a real model: the reply is cut off and calls are lost.
            ids = tokens.encoding().encode(tokens.render_reply(message), disallowed_special=())
            message = {"role": "assistant", "content": tokens.encoding().decode(ids[:max_tokens])}
            completion_tokens, finish = max_tokens, "length"
        payload = {
            "id": "chatcmpl-" + hashlib.sha256(raw).hexdigest()[:12],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }
        text = json.dumps(payload)
        if kind == "truncated" and fire:
            text = text[: len(text) // 2]
        return Response(text, media_type="application/json")

    return app


class ScriptedServer:
    """The scripted provider on a loopback port, served by uvicorn in a background thread.

    Use as a context manager; `base_url` is "http://127.0.0.1:<port>/v1".
    """

    def __init__(self, settings: ScriptedSettings | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        import socket

        import uvicorn

        self._sock = socket.socket()
        # Accepted sockets inherit this: without it, Nagle + delayed ACK add ~40 ms per reply.
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        self.app = create_app(settings)
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def requests(self) -> list[tuple[str, int]]:
        """(scenario, 1-based turn) of every request answered so far (tests count these)."""
        return list(self.app.state.requests)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> "ScriptedServer":
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
