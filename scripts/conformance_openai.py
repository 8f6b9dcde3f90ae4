"""Conformance: drive `runner serve` with the official `openai` Python SDK.

Checks, each printed as PASS/FAIL with what was seen:

1. ``tool_choice="none"``: no tool call, content only.
2. ``tool_choice="auto"``: any call names an offered tool with arguments valid for its schema.
3. ``tool_choice="required"``: the reply is exactly one tool call, valid for its schema.
4. a named function: the reply is one call to that function.
5. streaming: chunk arrival times are printed; the first content chunk arrives while the
   server is still generating (GET /health says so) and before the last chunk; usage comes
   in the last chunk (``stream_options.include_usage``).
6. the SDK's stream helper (``client.chat.completions.stream``) assembles the streamed
   tool-call deltas into the same call the non-streamed request returns.

Starts its own server on the packaged SmolLM2 unless ``--base-url`` is given. Exit code 0 when
every check passes, 1 otherwise.

Usage: ``python scripts/conformance_openai.py [--base-url URL] [--model NAME]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner import models
from runner.local import LocalServer, LocalSettings

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "list_files", "description": "List the files in the workspace with their sizes in bytes.",
        "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file from the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "tail_log", "description": "Show the last lines of a log file.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "lines": {"type": "integer"},
            "level": {"type": "string", "enum": ["ERROR", "WARN", "INFO"]}},
            "required": ["path", "lines"]}}},
]
SYSTEM = "You are a careful assistant working on a folder of log files. Use the tools."
USER = "Which log file mentions a timeout?"
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def check(self, name: str, ok: bool, seen: str) -> None:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {seen}", flush=True)
        if not ok:
            self.failed.append(name)


def valid_call(call: Any) -> bool:
    """The call names an offered tool and its arguments satisfy that tool's schema, no extra keys."""
    schema = SCHEMAS.get(call.function.name)
    if schema is None:
        return False
    try:
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, {**schema, "additionalProperties": False})
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def messages(user: str = USER) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def run(base_url: str, model: str) -> int:
    # Any: the SDK's overloads want its typed message params; plain dicts are what we send.
    client: Any = OpenAI(base_url=base_url, api_key="sk-local", max_retries=0, timeout=300)
    health_url = base_url.removesuffix("/v1") + "/health"
    checks = Checks()

    reply = client.chat.completions.create(model=model, messages=messages(), tools=TOOLS,
                                           tool_choice="none", max_tokens=48)
    message = reply.choices[0].message
    checks.check("tool_choice none", not message.tool_calls and bool(message.content),
                 f"content={message.content!r:.80} tool_calls={message.tool_calls}")

    reply = client.chat.completions.create(model=model, messages=messages(), tools=TOOLS,
                                           tool_choice="auto", max_tokens=96)
    calls = reply.choices[0].message.tool_calls or []
    checks.check("tool_choice auto", all(valid_call(c) for c in calls),
                 f"{len(calls)} call(s) {[(c.function.name, c.function.arguments) for c in calls]}, "
                 f"content={reply.choices[0].message.content!r:.60}")

    reply = client.chat.completions.create(model=model, messages=messages(), tools=TOOLS,
                                           tool_choice="required", max_tokens=96)
    calls = reply.choices[0].message.tool_calls or []
    checks.check("tool_choice required", len(calls) == 1 and valid_call(calls[0])
                 and reply.choices[0].finish_reason == "tool_calls",
                 f"{[(c.function.name, c.function.arguments) for c in calls]} finish={reply.choices[0].finish_reason}")
    required_call = calls[0] if calls else None

    named = {"type": "function", "function": {"name": "tail_log"}}
    reply = client.chat.completions.create(model=model, messages=messages("Show me the end of errors.log."),
                                           tools=TOOLS, tool_choice=named, max_tokens=96)
    calls = reply.choices[0].message.tool_calls or []
    checks.check("tool_choice named (tail_log)", len(calls) == 1 and calls[0].function.name == "tail_log"
                 and valid_call(calls[0]), f"{[(c.function.name, c.function.arguments) for c in calls]}")

    # Streaming: arrival times of every chunk, and whether the server was still generating.
    began = time.perf_counter()
    arrivals: list[tuple[float, str]] = []
    generating_at_first: int | None = None
    usage = None
    stream = client.chat.completions.create(
        model=model, messages=messages("Tell me a short story about a log file."), max_tokens=48,
        stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        ms = (time.perf_counter() - began) * 1000
        text = chunk.choices[0].delta.content if chunk.choices else None
        arrivals.append((ms, text or ("<usage>" if chunk.usage else "<other>")))
        if text and generating_at_first is None:
            generating_at_first = httpx.get(health_url, timeout=10).json()["generating"]
        usage = chunk.usage or usage
    content = [(ms, text) for ms, text in arrivals if text not in ("<usage>", "<other>")]
    print("  chunk arrivals (ms since request, text):")
    for ms, text in arrivals:
        print(f"    {ms:8.1f}  {text!r}")
    checks.check("streamed: first content chunk arrives before the last token is generated",
                 len(content) > 2 and generating_at_first == 1 and content[0][0] < arrivals[-1][0],
                 f"first content chunk at {content[0][0] if content else float('nan'):.0f} ms while the server "
                 f"reported generating={generating_at_first}; last chunk at {arrivals[-1][0]:.0f} ms; "
                 f"{len(content)} content chunks")
    checks.check("streamed: usage in the last chunk", usage is not None and arrivals[-1][1] == "<usage>"
                 and usage.completion_tokens >= len(content) > 0, f"usage={usage}")

    # The SDK's stream helper assembles tool-call deltas.
    with client.chat.completions.stream(model=model, messages=messages(), tools=TOOLS,
                                        tool_choice="required", max_tokens=96) as helper:
        final = helper.get_final_completion()
    streamed_calls = final.choices[0].message.tool_calls or []
    same = (required_call is not None and len(streamed_calls) == 1
            and streamed_calls[0].function.name == required_call.function.name
            and json.loads(streamed_calls[0].function.arguments) == json.loads(required_call.function.arguments))
    checks.check("stream helper assembles tool-call deltas (same call as non-streamed)", same,
                 f"{[(c.function.name, c.function.arguments) for c in streamed_calls]}")

    print(f"{'all checks passed' if not checks.failed else 'FAILED: ' + ', '.join(checks.failed)}")
    return 0 if not checks.failed else 1


@contextlib.contextmanager
def endpoint(base_url: str | None, model: str) -> Iterator[tuple[str, str]]:
    if base_url:
        yield base_url, model
        return
    name, path = models.resolve_choice(model)
    with LocalServer(LocalSettings(model=path, model_name=name, port=0)) as server:
        yield server.base_url, name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="a running `runner serve` (default: start one)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="manifest name, .gguf path, or the id to send")
    args = parser.parse_args()
    with endpoint(args.base_url, args.model) as (url, name):
        return run(url, name)


if __name__ == "__main__":
    sys.exit(main())
