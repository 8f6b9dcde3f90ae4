"""Tools from MCP (Model Context Protocol) servers, governed and durable like runner's own.

A run names its servers (`McpServer`, recorded in `RunConfig.mcp` without secrets) three ways:
`--mcp NAME=COMMAND...` or `--mcp NAME=URL`, `[mcp.servers.NAME]` tables in a config file, and
`--mcp-config FILE` (a Claude-Desktop-style ``mcpServers`` JSON). Each driver of a run
(`runner run`, `runner resume`, a worker) opens one session per server when it starts driving
(`Servers.open`: the tools must be listed before the first request) and closes it at the stop.
A stdio server runs under a small launcher in a process group of its own that dies with the
process that started it, even a SIGKILLed one (`runner.mcp_launcher`).

Each server tool is offered as ``PREFIX__TOOL`` (prefix: the server's name unless set), in a
fixed order (servers as named, tools by name), its input schema made acceptable to strict
OpenAI validators and to runner's call grammar (`offerable_schema`); a tool that cannot be
offered is left out with one warning. The annotations govern it (`governance`): readOnlyHint:
read-only (re-run after a crash, deduped); idempotentHint: idempotent; destructiveHint (true
unless the server says false, as the protocol has it): needs approval; the server's
`approve` / `allow` / `deny` globs beat its hints.

A call carries the tool call's id in the request's ``_meta`` (``runner/callId``, with
``runner/runId``) so a server can drop a repeat; the loop commits a call that may write
before it is sent, so after a kill -9 an unfinished call of a tool that is neither read-only
nor idempotent waits for a verdict. Results: text to the model; ``isError`` a tool error the
model reads; structured content into the trace (`McpCall`); images and resources one line each.
A server that exits mid-call gives that call an error (its stderr tail traced) and is started
again for the next call; one that does not start stops the run `interrupted`, resumable.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import fnmatch
import hashlib
import json
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import BaseModel, RootModel

from runner import mcp_launcher
from runner.cancel import Cancelled, race
from runner.errors import RunnerError, UsageError
from runner.state import McpServer, RunState
from runner.tools import Tool, ToolContext, ToolError

if TYPE_CHECKING:
    from mcp import Client
    from mcp.types import CallToolResult
    from mcp.types import Tool as RemoteTool

    from runner.trace import McpServerStarted, _Event

SEPARATOR = "__"
"""Between a server's prefix and its tool's name in the name offered to the model."""
TOOL_NAME_MAX = 64
"""OpenAI's limit on a function name; a longer offered name is cut and given a hash."""
DESCRIPTION_MAX = 1024
"""Characters of a tool's description offered to the model (the rest is cut)."""
STDERR_TAIL_CHARS = 2000
EXIT_REPORT_WAIT_S = 10.0
"""How long a failed call waits for the launcher's report of how its server ended, while the
launcher still runs (it comes within milliseconds; seconds on a machine under heavy load)."""
META_CALL_ID = "runner/callId"
META_RUN_ID = "runner/runId"
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*(?<!_)")
_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SECRETISH = re.compile(r"(key|token|secret|password|passwd|authorization|cookie|credential)", re.IGNORECASE)
_RUNNER_KEYS = ("prefix", "tools", "approve", "allow", "deny", "trust_hints", "start_timeout_s", "call_timeout_s")


class McpStartError(RunnerError):
    """An MCP server did not start, or did not list its tools (one line, with its stderr tail)."""

    def __init__(self, server: str, message: str) -> None:
        super().__init__(f"MCP server {server!r} did not start: {message}")
        self.server = server
        self.why = message


class ToolsChanged(UsageError):
    """A resumed run called a server tool that is gone or defined differently now."""


# --- naming servers --------------------------------------------------------------------------


def check_name(name: str, where: str) -> str:
    """`name` if it can name a server (letters, digits, ``-``, ``_``; never ``__``, which
    separates prefix and tool).

    Raises:
        UsageError: it cannot.
    """
    if not _NAME.fullmatch(name) or len(name) > 32:
        raise UsageError(f"{where}: {name!r} cannot name an MCP server: use up to 32 letters, digits, - and _ "
                         "(starting with a letter or digit, never two _ in a row, not ending with _)")
    return name


def parse_option(spec: str) -> McpServer:
    """A `--mcp` value: ``NAME=URL`` (http or https: streamable HTTP) or ``NAME=COMMAND ARGS...``
    (stdio; split as a POSIX shell would, ``${VAR}`` kept for the start).

    Raises:
        UsageError: no ``=``, an empty command, unbalanced quotes, a bad name.
    """
    name, sep, rest = spec.partition("=")
    rest = rest.strip()
    if not sep or not rest:
        raise UsageError(f"--mcp {spec!r}: give NAME=COMMAND [ARGS...] (stdio) or NAME=URL (streamable HTTP)")
    check_name(name.strip(), "--mcp")
    if re.match(r"https?://", rest):
        return McpServer(name=name.strip(), url=rest)
    try:
        argv = shlex.split(rest)
    except ValueError as exc:
        raise UsageError(f"--mcp {spec!r}: {exc}") from None
    return McpServer(name=name.strip(), command=argv)


def from_entry(name: str, entry: Any, where: str, *, foreign: bool = False) -> McpServer | None:
    """One server from a config table or an ``mcpServers`` entry: ``command`` + ``args``,
    ``env``, ``cwd``, or ``url`` + ``headers`` (``type``: stdio, http or streamable-http), and
    runner's own keys (`McpServer`: prefix, tools, approve, allow, deny, trust_hints,
    start_timeout_s, call_timeout_s). Secrets (values without ``${VAR}``) stay in memory.

    Args:
        foreign: a file of another program's format (keys runner does not know are ignored,
            ``"disabled": true`` leaves the server out, literal secrets are taken).

    Returns:
        The server, or None for a disabled one.

    Raises:
        UsageError: a bad name, a bad or unknown key, neither or both of command and url, or
            (in runner's own config) a literal value under a secret-looking name.
    """
    check_name(name, where)
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: MCP server {name!r} must be a table of settings")
    if foreign and entry.get("disabled") is True:
        return None
    known = {"command", "args", "env", "cwd", "url", "headers", "type", "transport", *_RUNNER_KEYS}
    unknown = sorted(set(entry) - known)
    if unknown and not foreign:
        raise UsageError(f"{where}: MCP server {name!r}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
    kind = str(entry.get("type") or entry.get("transport") or ("http" if "url" in entry else "stdio")).lower()
    if kind not in ("stdio", "http", "streamable-http", "streamablehttp", "streamable_http"):
        raise UsageError(f"{where}: MCP server {name!r}: transport {kind!r} is not supported (stdio or streamable http)")
    fields: dict[str, Any] = {k: entry[k] for k in _RUNNER_KEYS if k in entry}
    if kind == "stdio":
        command = entry.get("command")
        if not isinstance(command, str) or not command.strip():
            raise UsageError(f"{where}: MCP server {name!r} needs a command (or a url)")
        args = entry.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise UsageError(f"{where}: MCP server {name!r}: args must be a list of strings")
        fields["command"] = [*shlex.split(command), *args] if " " in command and not args else [command, *args]
        if entry.get("cwd") is not None:
            fields["cwd"] = str(entry["cwd"])
    else:
        if not isinstance(entry.get("url"), str):
            raise UsageError(f"{where}: MCP server {name!r} needs a url")
        fields["url"] = entry["url"]
    try:
        server = McpServer(name=name, **fields)
    except ValueError as exc:
        raise UsageError(f"{where}: MCP server {name!r}: {_first_error(exc)}") from None
    for kind_key, values in (("env", entry.get("env")), ("headers", entry.get("headers"))):
        _take_values(server, kind_key, values, where, foreign)
    return server


def _take_values(server: McpServer, kind: str, values: Any, where: str, foreign: bool) -> None:
    """Record `values` (env or headers) in `server`: a template as it is, a literal as a secret."""
    if values is None:
        return
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise UsageError(f"{where}: MCP server {server.name!r}: {kind} must map names to strings")
    recorded: dict[str, str | None] = {}
    for key, value in values.items():
        if _REF.search(value):
            recorded[key] = value
            continue
        if not foreign and _SECRETISH.search(key):
            raise UsageError(f"{where}: MCP server {server.name!r} holds a secret in {kind} {key!r}; keep it out of "
                             f"files: set it in an environment variable and write \"${{THAT_VARIABLE}}\"")
        recorded[key] = None
        server._secrets[f"{kind[:-1] if kind == 'headers' else kind}:{key}"] = value
    setattr(server, kind, recorded)


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
    return str(exc)


def read_claude_config(path: Path) -> list[McpServer]:
    """The servers of a Claude-Desktop-style JSON file: ``{"mcpServers": {NAME: {...}}}``.

    Raises:
        UsageError: unreadable, not JSON, no ``mcpServers`` object, or a bad entry.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--mcp-config {path}: {getattr(exc, 'strerror', None) or exc}") from None
    entries = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise UsageError(f"--mcp-config {path}: no \"mcpServers\" object")
    servers = [from_entry(name, entry, f"--mcp-config {path}", foreign=True) for name, entry in entries.items()]
    return [s for s in servers if s is not None]


def from_table(table: Any, where: str) -> list[McpServer]:
    """The servers of a config file's ``[mcp]`` table (``[mcp.servers.NAME]`` each).

    Raises:
        UsageError: a key other than ``servers``, or a bad server entry.
    """
    if not isinstance(table, dict) or set(table) - {"servers"} or not isinstance(table.get("servers", {}), dict):
        raise UsageError(f"{where}: the mcp table holds only [mcp.servers.NAME] tables")
    servers = [from_entry(name, entry, where) for name, entry in table.get("servers", {}).items()]
    return [s for s in servers if s is not None]


def servers_for(options: Sequence[str], config_file: Path | None, tool_globs: Sequence[str],
                table: Any = None, table_source: str = "config") -> list[McpServer]:
    """The servers a new run offers: the config file's table, then `--mcp-config`'s, then
    each `--mcp`, in that order; `--mcp-tools NAME:GLOB` values narrow each server's tools.

    Raises:
        UsageError: a bad value, two servers under one name, a `--mcp-tools` naming no server.
    """
    servers = [*(from_table(table, table_source) if table else []),
               *(read_claude_config(config_file) if config_file is not None else []),
               *(parse_option(spec) for spec in options)]
    names = [s.name for s in servers]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"more than one MCP server is named {', '.join(map(repr, twice))}")
    by_name = {s.name: s for s in servers}
    for value in tool_globs:
        name, sep, glob = value.partition(":")
        if not sep or not glob:
            raise UsageError(f"--mcp-tools {value!r}: give NAME:GLOB, e.g. fs:read_*")
        if name not in by_name:
            raise UsageError(f"--mcp-tools {value!r}: no MCP server is named {name!r} (named: {', '.join(names) or 'none'})")
        by_name[name].tools.append(glob)
    return servers


def shown_target(server: McpServer) -> str:
    """The command line or URL of `server` as it may be shown: ``${VAR}`` unexpanded, a URL
    without user:password, query or fragment (secrets live in ``${VAR}`` and headers)."""
    if server.url is not None:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(server.url)
        host = parts.hostname or ""
        netloc = host + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    return shlex.join(server.command or [])


WORKSPACE_VARIABLE = "RUNNER_WORKSPACE"
"""``${RUNNER_WORKSPACE}`` is the run's own copy of its workspace, the folder runner's tools
work in (made when first asked for): a filesystem server pointed there works on the run's files."""


def expand(text: str, where: str, workspace: Callable[[], Path] | None = None,
           filled: set[str] | None = None) -> str:
    """`text` with each ``${VAR}`` replaced by the environment's value (``${RUNNER_WORKSPACE}``:
    `workspace()`, when given); each value of a variable named like a secret (``*_TOKEN``,
    ``*KEY*``, ...) is added to `filled`.

    Raises:
        McpStartError: a variable that is not set (`where` names the server).
    """

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == WORKSPACE_VARIABLE and workspace is not None:
            return str(workspace())
        if name not in os.environ:
            raise McpStartError(where, f"${{{name}}} is not set in this process's environment")
        if filled is not None and _SECRETISH.search(name):
            filled.add(os.environ[name])
        return os.environ[name]

    return _REF.sub(value, text)


# --- offering tools --------------------------------------------------------------------------


def offered_name(server: McpServer, tool: str) -> str:
    """The name the model calls `tool` of `server` by: ``PREFIX__TOOL``, any character OpenAI
    does not take in a function name made ``_``, cut to `TOOL_NAME_MAX` with a hash when longer."""
    prefix = server.name if server.prefix is None else server.prefix
    name = re.sub(r"[^A-Za-z0-9_-]", "_", f"{prefix}{SEPARATOR}{tool}" if prefix else tool)
    if len(name) > TOOL_NAME_MAX:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[:TOOL_NAME_MAX - 9]}_{digest}"
    return name


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_DROPPED = ("$schema", "$id", "$comment", "title", "examples")


def offerable_schema(schema: Any, offered: str) -> dict[str, Any]:
    """`schema` made acceptable as a function's parameters: an object schema (``type: object``
    and ``properties``), no top-level combinator, local references only (``definitions`` moved
    to ``$defs``, each renamed after the tool so two tools never clash), no ``$schema``,
    ``$id``, titles or examples (tokens a small model pays for), ``required`` naming only
    listed properties; it must pass JSON Schema's metaschema and runner's call grammar.

    Raises:
        ValueError: why it cannot be offered, in words.
    """
    if not isinstance(schema, dict):
        raise ValueError("its input schema is not a JSON object")
    out: dict[str, Any] = copy.deepcopy(schema)
    defs = {**(out.pop("definitions", None) or {}), **(out.pop("$defs", None) or {})}
    combinators = [k for k in ("oneOf", "anyOf", "allOf", "not", "enum", "if") if k in out]
    if combinators:
        raise ValueError(f"its input schema has {combinators[0]} at the top (an object schema goes there)")
    if out.get("type", "object") != "object":
        raise ValueError(f"its input schema is of type {out.get('type')!r}, not an object")
    out["type"] = "object"
    out.setdefault("properties", {})
    renamed = {name: f"{offered}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}" for name in defs}
    out = dict(_cleaned(out, renamed))
    if defs:
        out["$defs"] = {renamed[k]: _cleaned(v, renamed) for k, v in defs.items()}
    if isinstance(out.get("required"), list):
        out["required"] = [r for r in out["required"] if r in out["properties"]]
    _check_schema(out)
    return out


def _cleaned(node: Any, renamed: dict[str, str], *, names: bool = False) -> Any:
    """A schema node without `_DROPPED` keys, local references renamed; foreign ones raise."""
    if isinstance(node, list):
        return [_cleaned(item, renamed) for item in node]
    if not isinstance(node, dict):
        return node
    if names:  # a map of names to schemas: keep every name
        return {key: _cleaned(value, renamed) for key, value in node.items()}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "$ref":
            out[key] = _local_ref(value, renamed)
        else:
            out[key] = _cleaned(value, renamed, names=key in _SCHEMA_MAPS)
    return out


def _local_ref(ref: Any, renamed: dict[str, str]) -> str:
    for stem in ("#/$defs/", "#/definitions/"):
        if isinstance(ref, str) and ref.startswith(stem) and ref[len(stem):] in renamed:
            return f"#/$defs/{renamed[ref[len(stem):]]}"
    raise ValueError(f"its input schema refers to {ref!r}, outside itself")


def _check_schema(schema: dict[str, Any]) -> None:
    """Raise ValueError if `schema` fails the JSON Schema metaschema or runner's call grammar."""
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"its input schema is not valid JSON Schema ({exc.message})") from None
    try:
        from llama_cpp.llama_grammar import SchemaConverter
    except ImportError:  # runner's grammar is llama-cpp-python's converter: without it nothing uses one
        return
    closed: dict[str, Any] = json.loads(json.dumps(schema))
    try:
        converter: Any = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False,  # type: ignore[no-untyped-call]
                                         raw_pattern=False)
        converter.visit(converter.resolve_refs(closed, ""), "arguments")
    except Exception as exc:  # the converter's own error: a construct the grammar cannot express
        raise ValueError(f"runner's call grammar cannot express its input schema ({type(exc).__name__}: {exc})") from None


def governance(server: McpServer, tool: RemoteTool) -> tuple[bool, bool, bool] | None:
    """(read_only, idempotent, needs_approval) of `tool`, or None when `server.deny` names it.

    From the annotations as the protocol defines them (readOnlyHint default false,
    destructiveHint default true, idempotentHint default false), unless `trust_hints` is off
    (then a non-idempotent write); `approve` then `allow` globs override the approval."""
    if _matches(server.deny, tool.name):
        return None
    hints = tool.annotations if server.trust_hints else None
    read_only = bool(hints and hints.read_only_hint)
    destructive = not (hints and hints.destructive_hint is False)
    idempotent = read_only or bool(hints and hints.idempotent_hint)
    approval = not read_only and destructive
    if _matches(server.approve, tool.name):
        approval = True
    elif _matches(server.allow, tool.name):
        approval = False
    return read_only, idempotent, approval


def _matches(globs: Iterable[str], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, glob) for glob in globs)


def digest(tool: RemoteTool) -> str:
    """sha256 (16 hex) of what a tool is: its name, description, input schema, annotations."""
    body = {"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema,
            "annotations": tool.annotations.model_dump(mode="json", exclude_none=True) if tool.annotations else None}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


class _Arguments(RootModel[dict[str, Any]]):
    """A server tool's arguments: the JSON object the model sent, checked against the schema."""


class McpTool(Tool):
    """One server tool as a runner tool. Made by `Servers.open` (one subclass per tool: its
    name, description and flags are class attributes, as for every tool)."""

    blocking = False
    server: _Server
    remote: str
    """The tool's name on its server."""
    parameters: dict[str, Any]

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def parse(self, arguments: str) -> BaseModel:
        """The model's arguments, validated against the offered schema.

        Raises:
            ToolError: not a JSON object, or not valid for the schema (worded for the model).
        """
        import jsonschema

        raw = self.json_object(arguments)
        problems = sorted(jsonschema.Draft202012Validator(self.parameters).iter_errors(raw), key=str)
        if problems:
            where = ".".join(map(str, problems[0].absolute_path)) or "arguments"
            raise ToolError(f"invalid arguments for {self.name}: {where}: {problems[0].message}")
        return _Arguments(raw)

    async def run(self, args: BaseModel, ctx: ToolContext) -> str:
        assert isinstance(args, _Arguments)
        return await self.server.call(self.remote, args.root, ctx)


def _tool_class(server: _Server, remote: RemoteTool, offered: str, parameters: dict[str, Any],
                flags: tuple[bool, bool, bool]) -> type[McpTool]:
    description = (remote.description or remote.title or remote.name).strip()
    if len(description) > DESCRIPTION_MAX:
        description = description[:DESCRIPTION_MAX - 1] + "…"
    read_only, idempotent, approval = flags
    attributes = {"name": offered, "description": description, "read_only": read_only, "idempotent": idempotent,
                  "needs_approval": approval, "server": server, "remote": remote.name, "parameters": parameters,
                  "__module__": __name__}
    return type(f"McpTool_{offered}", (McpTool,), attributes)


# --- results ---------------------------------------------------------------------------------


def result_text(result: CallToolResult) -> str:
    """What the model reads of a result: each text part as it is, each image, audio part or
    resource in one line saying what it is."""
    lines: list[str] = []
    for part in result.content:
        kind = getattr(part, "type", "")
        if kind == "text":
            lines.append(part.text)  # type: ignore[union-attr]
        elif kind in ("image", "audio"):
            size = len(getattr(part, "data", "") or "") * 3 // 4
            lines.append(f"[{kind}: {getattr(part, 'mime_type', '?')}, {size:,} bytes, not shown]")
        elif kind == "resource_link":
            lines.append(f"[resource link: {getattr(part, 'uri', '?')} ({getattr(part, 'name', '')})]")
        elif kind == "resource":
            resource = getattr(part, "resource", None)
            text = getattr(resource, "text", None)
            uri = getattr(resource, "uri", "?")
            lines.append(f"[resource {uri}]\n{text}" if isinstance(text, str)
                         else f"[resource {uri}: {getattr(resource, 'mime_type', None) or 'binary'}, not shown]")
        else:
            lines.append(f"[{kind or 'content'} part, not shown]")
    if not lines and result.structured_content is not None:
        lines.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(lines)


# --- one server ------------------------------------------------------------------------------


class _Server:
    """One server of one run driver: its process (or connection), its session and its tools.

    The session lives in a task of its own (`_own`): the SDK's task groups are entered and left
    there, so a server that dies never cancels the run's own task.
    """

    def __init__(self, spec: McpServer, run_id: str, emit: Callable[[_Event], None],
                 workspace: Callable[[], Path] | None = None) -> None:
        self.spec = spec
        self.run_id = run_id
        self.emit = emit
        self.workspace = workspace
        self.client: Client | None = None
        self.pid: int | None = None
        self.launcher_pid: int | None = None
        """The stdio server's launcher (`runner.mcp_launcher`): it reports how the server ended."""
        self.tools: list[RemoteTool] = []
        self.offered: list[str] = []
        """The names its tools are offered under (set by `Servers.open`)."""
        self.left_out: list[str] = []
        self.down: str | None = None
        """Why the server is not usable now (it exited, its connection broke); None: it is up."""
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._stderr: _StderrFile | None = None
        self._filled: set[str] = set()
        self._http: Any = None

    async def start(self) -> McpServerStarted:
        """Start the server, open its session and list its tools; returns the event that says
        so (`offered` and `leftOut` for the caller to fill in).

        Raises:
            McpStartError: it did not start or list its tools within `start_timeout_s` (the
                message holds its stderr tail).
        """
        from runner.trace import McpServerStarted

        began = time.perf_counter()
        self.down, self._closing, self.pid, self.launcher_pid = None, asyncio.Event(), None, None
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._own(ready))
        try:
            async with asyncio.timeout(self.spec.start_timeout_s):
                self.client = await asyncio.shield(ready)
                self.tools = await _listing(self.client)
            self.pid, self.launcher_pid = self._pids()
        except (Exception, asyncio.CancelledError) as exc:
            why = (f"no tool list within {self.spec.start_timeout_s:g} s (start_timeout_s)"
                   if isinstance(exc, TimeoutError) else exc.why if isinstance(exc, McpStartError)
                   else self.scrub(_why(exc)))
            tail = self.stderr_tail()
            await self.close()
            if isinstance(exc, asyncio.CancelledError) and not isinstance(exc, TimeoutError):
                raise
            raise McpStartError(self.spec.name, why + (f"; its stderr ends: {_one_line(tail)}" if tail else "")) from None
        info = self.client.server_info
        return McpServerStarted(
            runId=self.run_id, server=self.spec.name, transport="http" if self.spec.url else "stdio",
            target=shown_target(self.spec), protocolVersion=self.client.protocol_version,
            serverName=info.name if info else None, serverVersion=info.version if info else None,
            toolsHash=tools_hash(self.tools), offered=self.offered, leftOut=self.left_out, pid=self.pid,
            ms=round((time.perf_counter() - began) * 1000, 3))

    async def _own(self, ready: asyncio.Future[Client]) -> None:
        """Hold the session open until `close`; a failure before it opens goes to `ready`."""
        from mcp import Client

        try:
            async with Client(self._transport(), client_info=_client_info()) as client:
                ready.set_result(client)
                await self._closing.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except BaseException as exc:  # an SDK error, or an exception group from its task groups
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            else:
                self.down = self.down or self.scrub(_why(exc))

    def _transport(self) -> Any:
        """The SDK transport for this server, secrets and ``${VAR}`` filled in now."""
        spec = self.spec
        if spec.url is not None:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            headers = {k: self._value("header", k, v) for k, v in spec.headers.items()}
            self._http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=spec.call_timeout_s))
            return streamable_http_client(self._expand(spec.url), http_client=self._http)
        from mcp.client.stdio import StdioServerParameters, stdio_client

        argv = [self._expand(part) for part in spec.command or []]
        env = {k: self._value("env", k, v) for k, v in spec.env.items()}
        self._stderr = _StderrFile()
        python, *args = mcp_launcher.command(sys.executable, os.getpid(), argv)
        params = StdioServerParameters(command=python, args=args, env=env,
                                       cwd=self._expand(spec.cwd) if spec.cwd else None)
        return stdio_client(params, errlog=self._stderr.writer)

    def _expand(self, text: str) -> str:
        return expand(text, self.spec.name, self.workspace, self._filled)

    def scrub(self, text: str) -> str:
        """`text` with every env and header value, and every value of a variable named like a
        secret, shown as ``***``: what runner writes of a server's errors and stderr never
        holds them."""
        for value in sorted(self._filled, key=len, reverse=True):
            if len(value) >= 6:
                text = text.replace(value, "***")
        return text

    def _value(self, kind: str, key: str, template: str | None) -> str:
        """An env or header value, filled in: its template expanded, or the secret given for it
        (an env one from the environment too). Each is kept for `scrub`."""
        if template is not None:
            value = self._expand(template)
            self._filled.add(value)
            return value
        secret = self.spec.secrets().get(f"{kind}:{key}")
        if secret is None and kind == "env":
            secret = os.environ.get(key)
        if secret is not None:
            self._filled.add(secret)
            return secret
        if kind == "env":
            raise McpStartError(self.spec.name, f"its env {key} was given as a value, which runner never saves; "
                                                f"set ${key} where the run is driven")
        raise McpStartError(self.spec.name, f"its header {key} was given as a value, which runner never saves; "
                                            "write it as \"${VARIABLE}\" and set that variable where the run is driven")

    def _pids(self) -> tuple[int | None, int | None]:
        """The stdio server's pid and its launcher's, from the line the server writes (through
        the launcher's code) before it runs: there once the server has answered. (None, None)
        for a server at a URL."""
        first = self._stderr.text().split("\n", 1)[0] if self._stderr is not None else ""
        if not first.startswith(mcp_launcher.PREFIX + "pid="):
            return None, None
        pids = dict(part.split("=", 1) for part in first.removeprefix(mcp_launcher.PREFIX).split())
        return int(pids["pid"]), int(pids["launcher"])

    def stderr_tail(self) -> str:
        """The last lines the server wrote to stderr (at most `STDERR_TAIL_CHARS`), the
        launcher's own lines left out."""
        if self._stderr is None:
            return ""
        lines = [line for line in self._stderr.text().splitlines() if not line.startswith(mcp_launcher.PREFIX)]
        return self.scrub("\n".join(lines))[-STDERR_TAIL_CHARS:]

    def reported_exit(self) -> str | None:
        """How the server's process ended, as its launcher reported it ("exit code 1", "killed
        by SIGKILL"); None until it has."""
        for line in self._stderr.text().splitlines() if self._stderr is not None else []:
            if line.startswith(mcp_launcher.PREFIX + "exit="):
                code = int(line.split("=", 1)[1])
                return f"exit code {code}" if code >= 0 else f"killed by {_signal_name(-code)}"
        return None

    def exit_status(self) -> str | None:
        """How the server's process ended, in words, once it has; None while it runs."""
        reported = self.reported_exit()
        if reported is not None:
            return reported
        if self.pid is not None and not _running(self.pid):
            return "ended"
        if self._task is not None and self._task.done():
            return self.down or "connection closed"
        return None

    async def call(self, tool: str, arguments: dict[str, Any], ctx: ToolContext) -> str:
        """Call `tool` with `arguments` (starting the server first if it is down) and return the
        text the model reads.

        Raises:
            ToolError: `isError`, a timeout, the server exiting or the connection failing.
            Cancelled: the run's Stop signal (a cancel notification goes to the server), or
                the server did not start again (the run stops `interrupted`; resumable).
        """
        from runner.trace import McpCall

        if self.down is not None or self.exit_status() is not None:
            await self._restart()
        assert self.client is not None
        began = time.perf_counter()
        meta = {META_CALL_ID: ctx.call_id, META_RUN_ID: ctx.run_id}

        def traced(**fields: Any) -> None:
            self.emit(McpCall(runId=self.run_id, server=self.spec.name, tool=tool, callId=ctx.call_id,
                              ms=round((time.perf_counter() - began) * 1000, 3), **fields))

        try:
            result = await race(self.client.call_tool(tool, arguments, read_timeout_seconds=self.spec.call_timeout_s,
                                                      meta=meta), ctx.cancel)  # type: ignore[arg-type]
        except Cancelled:
            traced(failure="cancelled")
            raise
        except Exception as exc:
            failure = await self._failure(exc)
            traced(failure=failure)
            raise ToolError(f"{self.spec.name}: {failure}") from None
        traced(isError=bool(result.is_error), structured=result.structured_content)
        text = result_text(result)
        if result.is_error:
            raise ToolError(text or f"{tool} reported an error and said nothing more")
        return text

    async def _failure(self, exc: Exception) -> str:
        """Why a call got no answer, in words for the model; a server that exited is traced
        (`mcp_server_exited`, with its stderr tail) and marked down, to start again next call."""
        from runner.trace import McpServerExited

        if isinstance(exc, TimeoutError) or "timed out" in str(exc).lower():
            return f"no answer within {self.spec.call_timeout_s:g} s (the call was cancelled on the server)"
        status = await self._exit_report(_connection_closed(exc))
        status = status or self.exit_status()
        if status is None and self.spec.url is None:
            return f"the call failed: {self.scrub(_why(exc))}"
        self.down = status or self.scrub(_why(exc))
        self.emit(McpServerExited(runId=self.run_id, server=self.spec.name, pid=self.pid, status=self.down,
                                  stderrTail=self.stderr_tail()))
        return (f"the server stopped during the call ({self.down}); it is started again for the next call, so "
                "you may try again")

    async def _exit_report(self, closed: bool) -> str | None:
        """How the server ended, as its launcher reports it, waited for while it may still come:
        while the server is gone, or its connection `closed` (a killed process closes its pipes
        before it is a zombie, so its pid can look alive a while longer), and its launcher,
        which writes the report before it exits, still runs. None: the server lives, has no
        launcher (a URL), or no report came within `EXIT_REPORT_WAIT_S`."""
        deadline = time.monotonic() + EXIT_REPORT_WAIT_S
        while True:
            status = self.reported_exit()
            if status is not None or self.pid is None or (not closed and _running(self.pid)):
                return status
            if self.launcher_pid is None or not _running(self.launcher_pid):
                return self.reported_exit()  # the launcher is gone: what it wrote is all there is
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.02)

    async def _restart(self) -> None:
        """Start the server again after it went down.

        Raises:
            Cancelled: it did not start (the run stops `interrupted`, the call left pending).
        """
        await self.close()
        try:
            self.emit(await self.start())
        except McpStartError as exc:
            raise Cancelled(str(exc)) from None

    async def close(self) -> None:
        """End the session and the server's process group (stdin closed, then SIGTERM, SIGKILL)."""
        self._closing.set()
        task, self._task, self.client = self._task, None, None
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._http is not None:
            with contextlib.suppress(Exception):
                await self._http.aclose()
            self._http = None


class _StderrFile:
    """Where a stdio server's stderr goes: a file the server appends to, read through a
    descriptor of its own (so reading never moves the server's writes), removed from the disk
    as soon as it is open."""

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix="runner-mcp-", suffix=".stderr")
        os.close(fd)
        self.writer: TextIO = open(path, "a", encoding="utf-8", errors="replace")
        self._reader = open(path, encoding="utf-8", errors="replace")
        os.unlink(path)
        self._text = ""

    def text(self) -> str:
        """Everything written so far."""
        with contextlib.suppress(OSError, ValueError):
            self._text += self._reader.read()
        return self._text

    def close(self) -> None:
        for f in (self.writer, self._reader):
            with contextlib.suppress(OSError):
                f.close()


async def _listing(client: Client) -> list[RemoteTool]:
    """Every tool the server lists, page after page."""
    tools: list[RemoteTool] = []
    cursor: str | None = None
    for _ in range(100):
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def tools_hash(tools: Sequence[RemoteTool]) -> str:
    """sha256 (16 hex) over the `digest` of each listed tool, in the server's order."""
    return hashlib.sha256("\n".join(digest(t) for t in tools).encode()).hexdigest()[:16]


def _client_info() -> Any:
    from mcp.types import Implementation

    from runner import __version__

    return Implementation(name="runner", version=__version__)


def _connection_closed(exc: BaseException) -> bool:
    """The call failed because the connection to the server closed (MCP's CONNECTION_CLOSED)."""
    from mcp.types import CONNECTION_CLOSED

    exc = _leaf(exc)
    return getattr(exc, "code", None) == CONNECTION_CLOSED or isinstance(exc, (BrokenPipeError, EOFError))


def _leaf(exc: BaseException) -> BaseException:
    """An exception group's first leaf (any other exception as it is)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _why(exc: BaseException) -> str:
    """One line for an exception, an exception group's first leaf unwrapped."""
    exc = _leaf(exc)
    text = str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        text = f"no such program: {exc.filename or text}"
    return _one_line(text)


def _one_line(text: str) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines() if line.strip())[-600:]


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _running(pid: int) -> bool:
    """True while `pid` is a live process (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not os.path.exists("/proc") or os.path.exists(f"/proc/{pid}")


# --- the servers of one run driver -----------------------------------------------------------


class Servers:
    """The MCP servers of one run, for one driver: started by `open`, stopped by `close`
    (use as an async context manager). Events go to `emit` (the loop's `Runtime.defer`: each
    is traced with the next committed transition); until it is set they wait in `waiting`.

    Args:
        state: the run; `state.config.mcp` names the servers, and `open` records each
            server's listing there (`McpServer.listing`).
        workspace: the run's own workspace folder, made when first asked for: what
            ``${RUNNER_WORKSPACE}`` stands for (None: the environment's variable, if any).
    """

    def __init__(self, state: RunState, workspace: Callable[[], Path] | None = None) -> None:
        self.state = state
        self.waiting: list[_Event] = []
        self._emit: Callable[[_Event], None] = self.waiting.append
        self.servers = [_Server(spec, state.run_id, self._forward, workspace) for spec in state.config.mcp]
        self.warnings: list[str] = []
        """One line per tool left out (its schema cannot be offered, its name is taken)."""
        self.tools: list[Tool] = []
        """The runner tools of every server, in the order offered (set by `open`)."""
        self.failed = False
        """Set by the caller when `open` raised: the run was stopped and is not driven."""
        self.catalog: list[Tool] = []
        """The run's whole catalog, these tools last (set by the caller: `runner.catalog.build`)."""

    def _forward(self, event: _Event) -> None:
        self._emit(event)

    def bind(self, emit: Callable[[_Event], None]) -> None:
        """Send events to `emit` from now on, the waiting ones first."""
        waiting, self.waiting = self.waiting, []
        self._emit = emit
        for event in waiting:
            emit(event)

    async def __aenter__(self) -> Servers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.gather(*(server.close() for server in self.servers))

    async def open(self) -> list[Tool]:
        """Start every server (at once), list its tools and return them as runner tools, in
        the fixed order; record each server's listing in the run (a run that recorded one
        already is checked against it first).

        Raises:
            McpStartError: a server did not start (the first, in the order named), or offers
                a tool under a name another tool of the run has.
            ToolsChanged: a tool the run called is gone or defined differently now.
        """
        results = await asyncio.gather(*(server.start() for server in self.servers), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        tools: list[Tool] = []
        taken = set(self.state.config.tools)
        for server, started in zip(self.servers, results):
            assert not isinstance(started, BaseException)
            offered, server.left_out = self._offer(server)
            clash = next((cls.name for cls in offered if cls.name in taken), None)
            if clash is not None:
                raise McpStartError(server.spec.name, f"it offers {clash}, a name another tool of the run has; give "
                                                      "it a prefix of its own (prefix) or leave one out")
            taken.update(cls.name for cls in offered)
            self._check_unchanged(server, offered)
            server.offered = started.offered = [cls.name for cls in offered]
            started.leftOut = server.left_out
            server.spec.listing = {cls.name: digest(next(t for t in server.tools if t.name == cls.remote))
                                   for cls in offered}
            tools += [cls() for cls in offered]
            self._emit(started)
        self.tools = tools
        return tools

    def _offer(self, server: _Server) -> tuple[list[type[McpTool]], list[str]]:
        """The tool classes `server` offers, by offered name, and the tools left out (why)."""
        spec = server.spec
        chosen: dict[str, type[McpTool]] = {}
        left_out: list[str] = []
        for remote in server.tools:
            if spec.tools and not _matches(spec.tools, remote.name):
                continue
            flags = governance(spec, remote)
            if flags is None:
                left_out.append(f"{remote.name}: denied by the server's deny list")
                continue
            offered = offered_name(spec, remote.name)
            try:
                parameters = offerable_schema(remote.input_schema, offered)
            except ValueError as exc:
                left_out.append(f"{remote.name}: {exc}")
                self.warnings.append(f"MCP server {spec.name!r}: tool {remote.name!r} is not offered: {exc}")
                continue
            if offered in chosen:
                left_out.append(f"{remote.name}: its name {offered!r} is taken by another tool of the server")
                self.warnings.append(f"MCP server {spec.name!r}: tool {remote.name!r} is not offered: {offered!r} "
                                     "is taken by another of its tools")
                continue
            chosen[offered] = _tool_class(server, remote, offered, parameters, flags)
        return [chosen[name] for name in sorted(chosen)], left_out

    def _check_unchanged(self, server: _Server, offered: list[type[McpTool]]) -> None:
        """Refuse when a tool this run called (per the listing it recorded) is gone or changed."""
        recorded = server.spec.listing
        if not recorded:
            return
        called = {c.function.name for m in self.state.messages for c in m.tool_calls or []}
        now = {cls.name: digest(next(t for t in server.tools if t.name == cls.remote)) for cls in offered}
        for name in sorted(called & set(recorded)):
            if now.get(name) != recorded[name]:
                what = "is gone" if name not in now else "is defined differently (description, schema or annotations)"
                raise ToolsChanged(f"run {self.state.run_id} called {name} of MCP server {server.spec.name!r}, which "
                                   f"{what} now; resume with --force to go on with the tools as they are")


def forget_listings(state: RunState) -> None:
    """Drop what the run recorded of its servers' tools (`resume --force`): the next driver
    records them as they are then, and no change stops it."""
    for server in state.config.mcp:
        server.listing = {}
