"""A small stdio MCP server for the tests, on the official SDK (run as a script): what the
published servers cannot show on demand. It logs every call it receives, with the ``runner/``
keys of the request's ``_meta``, and every cancellation it sees, one JSON line each to
$PROBE_LOG; `greet` takes another schema when $PROBE_VARIANT is 2; `secret_digest` tells the
sha256 of $PROBE_SECRET (so a test learns the server got it without the secret showing up);
`lookup` lists a schema that refers outside itself (runner leaves it out).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("probe")
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)


def _log(tool: str, event: str, ctx: Context[Any, Any] | None = None, **more: Any) -> None:
    path = os.environ.get("PROBE_LOG")
    if not path:
        return
    meta: dict[str, Any] = {}
    if ctx is not None:
        raw = ctx.request_context.meta or {}
        meta = {k: v for k, v in dict(raw).items() if str(k).startswith("runner/")}
    line = {"tool": tool, "event": event, "meta": meta, "pid": os.getpid(), "ts": time.time(), **more}
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


@server.tool(annotations=WRITE, description="Write a record slowly (takes the given seconds).")
async def slow_write(seconds: float, ctx: Context[Any, Any]) -> str:
    _log("slow_write", "start", ctx)
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _log("slow_write", "cancelled", ctx)
        raise
    _log("slow_write", "done", ctx)
    return f"wrote one record after {seconds:g} s"


@server.tool(annotations=READ_ONLY, description="The sha256 of the secret this server was given.")
def secret_digest(ctx: Context[Any, Any]) -> str:
    _log("secret_digest", "start", ctx)
    return hashlib.sha256(os.environ.get("PROBE_SECRET", "").encode()).hexdigest()


def greet_loudly(name: str, loud: bool, ctx: Context[Any, Any]) -> str:
    _log("greet", "start", ctx)
    return f"HELLO {name.upper()}" if loud else f"Hello {name}"


def greet(name: str, ctx: Context[Any, Any]) -> str:
    _log("greet", "start", ctx)
    return f"Hello {name}"


server.add_tool(greet_loudly if os.environ.get("PROBE_VARIANT") == "2" else greet, name="greet",
                annotations=READ_ONLY, description="Greet someone.")


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
             description="Erase a record (cannot be undone).")
def erase(record: str, ctx: Context[Any, Any]) -> str:
    _log("erase", "start", ctx, record=record)
    return f"erased {record}"


def lookup(key: str) -> str:
    return key


server.add_tool(lookup, name="lookup", annotations=READ_ONLY, description="Look a key up (its schema refers elsewhere).")
for tool in server._tool_manager.list_tools():  # a schema no client should offer: a reference outside itself
    if tool.name == "lookup":
        tool.parameters = {"type": "object", "properties": {"key": {"$ref": "https://example.com/key.json"}}}


if __name__ == "__main__":
    server.run()
