"""Hermes-style tool calling for llama.cpp: render the prompt, build the grammars, parse the reply.

Why this exists: llama-cpp-python 0.3.x has no chat handler that both shows tool results to
the model and returns OpenAI ``tool_calls``; its ``chatml-function-calling`` handler renders
every ``role: tool`` message as an empty turn, and a GGUF's own template returns
``<tool_call>…</tool_call>`` as plain content. This module is the replacement, served under the
chat format name `HANDLER_NAME` by `runner.local_app` with `runner.engine.Engine`.

Prompt format (ChatML, with tools the way Qwen2.5's own chat template renders them; the
equivalence is tested against that template):

- system turn = the request's first system message (else the model's default system prompt,
  read from its GGUF template), followed, when tools are given, by the ``# Tools`` block with
  one JSON schema per line inside ``<tools></tools>``;
- an assistant tool call is ``\\n<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>``;
- consecutive tool results form one user turn of ``<tool_response>…</tool_response>`` blocks.

The grammars (`call_grammar`, `untagged_call_grammar`, `no_call_grammar`): greedy generation in
`runner.engine` follows one per request. With ``tool_choice`` ``auto`` the call grammar is lazy —
free text until the model writes ``<tool_call>``, then only an offered tool's name, arguments
valid for its schema (no extra keys) and ``</tool_call>``, then further calls or the end of the
turn; ``required`` and a named function put the whole turn under it (exactly one call);
``none`` keeps the tools in the prompt (the KV cache of the conversation stays valid) and admits
no call (`no_call_grammar`). `CallForcer` knows the text the call grammar forces.

Output (`ReplySplitter`'s events; `runner.local_app` shapes them as OpenAI replies): text
outside calls is content; each complete call becomes an OpenAI tool call (id
``call_<n>``, n counted over the whole conversation so ids never repeat). Untagged JSON is never
a call, and a call cut short by ``max_tokens`` is dropped, never sent half-made.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

HANDLER_NAME = "runner-hermes"
MAX_CALLS_PER_TURN = 8
"""Most calls one assistant turn may make (the grammar's repetition bound)."""
STOP_STRINGS = ("<|im_end|>", "<|endoftext|>", "<|im_start|>")
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

JsonObject = dict[str, Any]
ChoiceMode = Literal["none", "auto", "required", "named"]

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
# A literal default system prompt inside a ChatML template, e.g. Qwen's or SmolLM2's. The
# template may hold a real newline or the two characters backslash-n.
_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\n|\\n)([^'\"{}<]+?)<\|im_end\|>")


class RequestError(ValueError):
    """The request cannot be served as given (HTTP 400); the message says why."""


@dataclass(frozen=True)
class ParsedReply:
    """The model's raw text split into OpenAI message parts.

    Attributes:
        content: text outside valid tool-call blocks, stripped; None when empty.
        tool_calls: OpenAI tool calls: {"id", "type": "function", "function": {"name",
            "arguments": JSON string}}.
    """

    content: str | None
    tool_calls: list[JsonObject]


@dataclass(frozen=True)
class ToolChoice:
    """A request's ``tool_choice``, checked against its tools.

    Attributes:
        mode: none (tools still shown, no call), auto (the model decides; calls under the grammar),
            required (the turn is one call to any offered tool), named (one call to `name`).
        name: the function for mode "named", else None.
    """

    mode: ChoiceMode
    name: str | None = None


def parse_tool_choice(value: Any, tool_names: Sequence[str]) -> ToolChoice:
    """Read OpenAI's ``tool_choice`` (absent: "auto" with tools, "none" without).

    Accepts "none", "auto", "required" and ``{"type": "function", "function": {"name": N}}``.

    Raises:
        RequestError: any other value, "required" or a name with no tools, an unknown name.
    """
    if value is None:
        return ToolChoice("auto" if tool_names else "none")
    if value in ("none", "auto"):
        return ToolChoice(value if tool_names else "none")
    if value == "required":
        if not tool_names:
            raise RequestError("tool_choice 'required' needs at least one tool in 'tools'")
        return ToolChoice("required")
    if isinstance(value, Mapping) and value.get("type") == "function":
        name = (value.get("function") or {}).get("name")
        if name not in tool_names:
            raise RequestError(f"tool_choice names {name!r}, which is not in 'tools' ({', '.join(tool_names) or 'none'})")
        return ToolChoice("named", str(name))
    raise RequestError(
        "tool_choice must be 'none', 'auto', 'required' or "
        '{"type": "function", "function": {"name": ...}}'
    )


def default_system_prompt(chat_template: str | None) -> str | None:
    """The default system prompt a ChatML GGUF template inserts, or None if it has none.

    Args:
        chat_template: the GGUF's ``tokenizer.chat_template`` metadata (jinja source).
    """
    if not chat_template:
        return None
    match = _DEFAULT_SYSTEM.search(chat_template)
    return match.group(1) if match else None


def render_segments(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    default_system: str | None = None,
) -> list[str]:
    """The ChatML prompt as one string per turn: system, each message, the assistant header.

    Consecutive tool results are one segment (one user turn). ``"".join`` gives `render_prompt`.
    """
    segments: list[str] = []
    first_is_system = bool(messages) and messages[0].get("role") == "system"
    system = _text(messages[0].get("content")) if first_is_system else default_system
    if tools:
        intro = system if system is not None else ""
        schemas = "".join("\n" + _dumps(tool) for tool in tools)
        segments.append(f"<|im_start|>system\n{intro}{TOOLS_HEADER}{schemas}{TOOLS_FOOTER}<|im_end|>\n")
    elif system is not None:
        segments.append(f"<|im_start|>system\n{system}<|im_end|>\n")
    for i, message in enumerate(messages):
        if i == 0 and first_is_system:
            continue
        text = _render_message(messages, i)
        if message.get("role") == "tool" and i > 0 and messages[i - 1].get("role") == "tool":
            segments[-1] += text
        else:
            segments.append(text)
    segments.append("<|im_start|>assistant\n")
    return segments


def render_prompt(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    default_system: str | None = None,
) -> str:
    """Render an OpenAI conversation as a ChatML prompt ending with the assistant header.

    Args:
        messages: OpenAI chat messages (system/user/assistant/tool). Content may be a string,
            None, or a list of text parts; assistant ``tool_calls`` arguments may be a JSON
            string (OpenAI) or an object.
        tools: OpenAI tool definitions ({"type": "function", "function": {...}}), rendered
            verbatim as JSON, one per line.
        default_system: system text used when the first message is not a system message.

    Returns:
        The prompt text, special tokens spelled out (tokenize with ``special=True``).
    """
    return "".join(render_segments(messages, tools, default_system))
def _render_message(messages: Sequence[Mapping[str, Any]], i: int) -> str:
    message = messages[i]
    role = str(message.get("role"))
    content = _text(message.get("content"))
    if role == "tool":
        # Consecutive tool results share one user turn, as in Qwen2.5's template.
        opens = i == 0 or messages[i - 1].get("role") != "tool"
        closes = i == len(messages) - 1 or messages[i + 1].get("role") != "tool"
        head = "<|im_start|>user" if opens else ""
        tail = "<|im_end|>\n" if closes else ""
        return f"{head}\n<tool_response>\n{content}\n</tool_response>{tail}"
    calls = message.get("tool_calls") or []
    if role == "assistant" and calls:
        text = "<|im_start|>assistant" + (f"\n{content}" if content else "")
        for call in calls:
            function = call.get("function", call)
            name = function.get("name", "")
            arguments = _arguments_json(function.get("arguments"))
            text += f'\n<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
        return text + "<|im_end|>\n"
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def _text(content: Any) -> str:
    """Message content as text: None -> "", list of parts -> their text joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping)
        )
    return str(content)


def _dumps(value: Any) -> str:
    # Hugging Face's `tojson`: default separators, non-ASCII kept.
    return json.dumps(value, ensure_ascii=False)


def _arguments_json(arguments: Any) -> str:
    """Arguments as the JSON object the model was trained on (OpenAI sends a JSON string)."""
    if isinstance(arguments, str):
        try:
            return _dumps(json.loads(arguments))
        except json.JSONDecodeError:
            return _dumps(arguments)  # not JSON: show it as a string rather than lose it
    return _dumps({} if arguments is None else arguments)


def parse_reply(text: str, tool_names: Sequence[str], first_index: int = 0) -> ParsedReply:
    """Split generated text into content and tool calls.

    A block becomes a call only if it is tagged ``<tool_call>`` (the closing tag may be
    missing at the end of the text), its body is a JSON object (surplus closing brackets
    after it are forgiven), ``name`` is one of
    `tool_names` and ``arguments`` (optional, default {}) is an object or a JSON string of one.
    Anything else, including untagged JSON, stays in the content verbatim.

    Args:
        text: the raw completion text (without the stop token).
        tool_names: names of the tools offered in the request.
        first_index: number used for the first call id (``call_<first_index>``).
    """
    calls: list[JsonObject] = []
    kept: list[str] = []
    cursor = 0
    for match in _TOOL_CALL.finditer(text):
        call = _parse_call(match.group(1), tool_names)
        if call is None:
            continue
        kept.append(text[cursor : match.start()])
        cursor = match.end()
        calls.append(
            {
                "id": f"call_{first_index + len(calls)}",
                "type": "function",
                "function": {"name": call[0], "arguments": _dumps(call[1])},
            }
        )
    kept.append(text[cursor:])
    content = "".join(kept).strip()
    return ParsedReply(content=content or None, tool_calls=calls)


def _parse_call(body: str, tool_names: Sequence[str]) -> tuple[str, JsonObject] | None:
    body = body.strip()
    try:
        payload, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError:
        return None
    if body[end:].strip(" \t\r\n}]"):
        return None  # only surplus closing brackets (a small model's usual slip) are forgiven
    if not isinstance(payload, dict) or payload.get("name") not in tool_names:
        return None
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return str(payload["name"]), arguments


def count_prior_calls(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


def offered_tool_names(tools: Sequence[Mapping[str, Any]] | None) -> list[str]:
    return [str(t.get("function", {}).get("name")) for t in tools or []]




# --- the tool-call grammar ----------------------------------------------------------------------


def closed_schema(schema: Any) -> Any:
    """A copy of a JSON schema where every object allows only its listed properties.

    ``additionalProperties`` is set to false wherever an object schema leaves it unset, so the
    grammar built from it admits no extra keys at any depth.
    """
    if isinstance(schema, list):
        return [closed_schema(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {key: closed_schema(value) for key, value in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def call_schema(tools: Sequence[Mapping[str, Any]], only: str | None = None) -> JsonObject:
    """The JSON schema of one call body: ``{"name": <tool>, "arguments": <its parameters>}``.

    Args:
        tools: OpenAI tool definitions.
        only: restrict to this function name (a named ``tool_choice``).

    Raises:
        RequestError: two tools define the same ``$defs`` name differently.
    """
    alternatives: list[JsonObject] = []
    defs: JsonObject = {}
    for tool in tools:
        function = tool.get("function") or {}
        name = str(function.get("name"))
        if only is not None and name != only:
            continue
        parameters = dict(function.get("parameters") or {"type": "object", "properties": {}})
        for key, value in (parameters.pop("$defs", None) or {}).items():
            if defs.setdefault(key, value) != value:
                raise RequestError(f"tools define $defs/{key} in two different ways")
        alternatives.append({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": closed_schema(parameters)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    schema: JsonObject = alternatives[0] if len(alternatives) == 1 else {"oneOf": alternatives}
    if defs:
        schema["$defs"] = closed_schema(defs)
    return schema


@functools.lru_cache(maxsize=32)
def _grammar_for(schema_json: str, calls: int, after_open: bool, untagged: bool = False) -> str:
    from llama_cpp.llama_grammar import SchemaConverter

    converter: Any = SchemaConverter(  # type: ignore[no-untyped-call]
        prop_order={"name": 0, "arguments": 1}, allow_fetch=False, dotall=False, raw_pattern=False)
    schema = converter.resolve_refs(json.loads(schema_json), "")
    converter.visit(schema, "call")
    if untagged:
        more = f' ("\\n" call){{0,{calls - 1}}}' if calls > 1 else ""
        rules = [
            'root ::= fenced | bare | doubled',
            'fenced ::= "```" "json"? "\\n" bare "\\n"? "```"',
            f"bare ::= call{more}",
            'doubled ::= "{" call "}"',
        ]
    else:
        first = 'call-body' if after_open else 'call-block'
        more = f' ("\\n"? call-block){{0,{calls - 1}}}' if calls > 1 else ""
        rules = [
            f"root ::= {first}{more}",
            'call-block ::= "<tool_call>" call-body',
            'call-body ::= "\\n"? call "\\n"? "</tool_call>"',
        ]
    return "\n".join([*rules, converter.format_grammar()])


def call_grammar(tools: Sequence[Mapping[str, Any]], only: str | None = None,
                 calls: int = MAX_CALLS_PER_TURN, after_open: bool = False) -> str:
    """A llama.cpp GBNF grammar for 1..`calls` ``<tool_call>{json}</tool_call>`` blocks.

    Each block's JSON is ``{"name": N, "arguments": A}`` where N is an offered tool (or `only`)
    and A satisfies that tool's parameter schema with no extra keys (`closed_schema`), built by
    llama-cpp-python's own JSON-schema converter. With `after_open` the grammar starts just
    after the first ``<tool_call>`` (the model has written the tag itself).
    """
    return _grammar_for(json.dumps(call_schema(tools, only)), calls, after_open)


def text_format_grammar(response_format: Any) -> str | None:
    """The GBNF grammar of a reply in words that OpenAI's ``response_format`` asks for: None
    for none or ``text``; any JSON object for ``json_object``; the schema's JSON for
    ``json_schema`` (llama-cpp-python's converter).

    Raises:
        RequestError: another type, or a schema the converter cannot follow.
    """
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        schema: Any = {"type": "object"}
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema", {"type": "object"}) if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise RequestError("response_format: json_schema needs {\"name\": ..., \"schema\": {...}}")
    else:
        raise RequestError(f"response_format: type {kind!r} is not text, json_object or json_schema")
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return str(json_schema_to_gbnf(json.dumps(schema)))
    except (AssertionError, ValueError, KeyError, TypeError) as exc:
        raise RequestError(f"response_format: a schema the grammar cannot follow ({exc})") from exc


def untagged_call_grammar(tools: Sequence[Mapping[str, Any]], calls: int = MAX_CALLS_PER_TURN) -> str:
    """A GBNF grammar for a whole reply that is an untagged call: 1..`calls` call objects (one
    per line), bare, in a ```json fence, or one call in doubled braces (``{{…}}``).

    Each object is the same ``{"name": N, "arguments": A}`` as in `call_grammar` (an offered
    tool, arguments valid for its schema, no extra keys at any depth).
    """
    return _grammar_for(json.dumps(call_schema(tools)), calls, False, untagged=True)


def _lit(char: str) -> str:
    return json.dumps(char)


def _cls(char: str) -> str:
    return "\\" + char if char in "]\\^-" else char


PROSE_GRAMMAR = 'root ::= [^{[`<>| \\t\\r\\n] [^<{]*'
"""A reply that cannot be a tool call: it does not open with a JSON array, a code fence, a tag
or a ``>``, and holds no ``{`` or ``<`` (so no JSON object and no ``<tool_call>``). For
``tool_choice: "none"`` on a model that writes untagged calls."""
_UNTAGGED_START = re.compile(r"(?:```(?:json)?[ \t]*\n\s*)?\{")
_UNTAGGED_UNDECIDED = re.compile(r"`{0,3}|```j|```js|```jso|```(?:json)?[ \t]*(?:\n\s*)?")


TAGLESS_GRAMMAR = "\n".join([
    'root ::= s0',
    *(f's{k} ::= "<" s1 | {_lit(CALL_OPEN[k])} s{k + 1} | [^<{_cls(CALL_OPEN[k])}] s0 | ""'
      for k in range(1, len(CALL_OPEN) - 1)),
    's0 ::= "<" s1 | [^<] s0 | ""',
    f's{len(CALL_OPEN) - 1} ::= "<" s1 | [^<{_cls(CALL_OPEN[-1])}] s0 | ""',
])
"""Any text that does not hold ``<tool_call>`` (states: how much of the tag the text ends
with; the last character of the tag is never allowed). For ``tool_choice: "none"`` on a
model that writes its calls tagged."""


def no_call_grammar(untagged_calls: bool) -> str:
    """The grammar of a ``tool_choice: "none"`` reply with the tools in the prompt:
    `PROSE_GRAMMAR` for a model that writes calls as bare JSON, else `TAGLESS_GRAMMAR`."""
    return PROSE_GRAMMAR if untagged_calls else TAGLESS_GRAMMAR


def untagged_start(text: str) -> Literal["call", "text", "undecided"]:
    """Whether a reply that begins with `text` is an untagged call.

    A reply whose first non-blank character opens a JSON object, directly or after a ```json
    (or bare ```) fence line, is a call ("call"); one that cannot become that any more is text
    ("text"); blank text or a partial fence is "undecided". This is the lazy trigger of
    llama.cpp's Hermes/Qwen2.5 handler, anchored at the start of the reply like its, and fired
    at the first brace rather than after ``"name": "<tool>"``: once a reply opens an object the
    grammar makes it a call of an offered tool (a pasted tool schema included).
    """
    stripped = text.lstrip()
    if _UNTAGGED_START.match(stripped):
        return "call"
    return "undecided" if _UNTAGGED_UNDECIDED.fullmatch(stripped) else "text"


def parse_untagged(text: str, tool_names: Sequence[str]) -> list[tuple[str, JsonObject]] | None:
    """The calls in a reply that is wholly an untagged call block, or None if it is not one.

    Accepts one or more call objects (``{"name": …, "arguments": …}``, separated by blanks),
    bare, inside one ```json / ``` fence, or a single call in doubled braces ``{{…}}``; surplus
    closing brackets are forgiven as for tagged calls. Every object must name one of
    `tool_names` with object arguments, and nothing else may follow.
    """
    body = text.strip()
    fence = re.fullmatch(r"```(?:json)?[ \t]*\n(.*?)\n?\s*```", body, re.DOTALL)
    if fence:
        body = fence.group(1).strip()
    elif body.startswith("{{") and body.endswith("}}"):
        inner = body[1:-1].strip()
        if _parse_call(inner, tool_names) is not None:
            body = inner
    calls: list[tuple[str, JsonObject]] = []
    decoder = json.JSONDecoder()
    rest = body
    while rest:
        try:
            _, end = decoder.raw_decode(rest)
        except json.JSONDecodeError:
            return None
        surplus = len(rest[end:]) - len(rest[end:].lstrip(" \t\r\n}]"))
        call = _parse_call(rest[: end + surplus], tool_names)
        if call is None:
            return None
        calls.append(call)
        rest = rest[end + surplus:].strip()
    return calls or None


# --- from generated text to OpenAI message parts -------------------------------------------------


@dataclass(frozen=True)
class TextDelta:
    """Content text, in order; the deltas concatenate to the reply's stripped content.
    `logprobs`: when asked for, the OpenAI ``logprobs.content`` entries of the tokens this text
    completes (a token split across deltas goes with the later one), else None."""

    text: str
    logprobs: list[JsonObject] | None = None


@dataclass(frozen=True)
class CallDelta:
    """One complete, validated tool call (sent only once its closing tag was generated)."""

    index: int
    """Position among this reply's calls, from 0."""
    call: JsonObject
    """OpenAI shape: {"id", "type": "function", "function": {"name", "arguments": JSON string}}."""


@dataclass(frozen=True)
class Finished:
    """The end of a reply.

    Attributes:
        finish_reason: "stop", "length", "tool_calls", or "cancelled" (the client went away).
        prompt_tokens / completion_tokens: tokens of the rendered prompt / generated tokens.
        timings: `Engine` timings (ms and token counts; see `Engine.stream`).
        logprobs: OpenAI ``logprobs.content`` entries of the reply's text when they were asked
            for (a reply that calls tools: those of its text before the call), else None.
    """

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    timings: JsonObject
    logprobs: list[JsonObject] | None = None


Event = TextDelta | CallDelta | Finished


class ReplySplitter:
    """Turns generated text, fed piece by piece, into content deltas and complete calls.

    Content is stripped the way `parse_reply` strips it (leading whitespace dropped, trailing
    whitespace held until more text follows), and any text that could still become
    ``<tool_call>`` or a stop string is held back, so streamed content never shows protocol
    text that the final reply would not. A call identical to an earlier one of the same reply
    (same name, same arguments) is not sent again (`duplicates` counts them).
    """

    def __init__(self, tool_names: Sequence[str], first_index: int = 0,
                 stops: Sequence[str] = STOP_STRINGS, calls_allowed: bool = True) -> None:
        self.tool_names = list(tool_names)
        self.first_index = first_index
        self.markers = ([CALL_OPEN] if calls_allowed else []) + [s for s in stops if s]
        self.calls: list[JsonObject] = []
        self.content: list[str] = []
        self.stopped = False
        """A stop string was generated: the reply is over."""
        self.dropped_call = False
        """A call was left unfinished (cut off) or did not parse, and was dropped."""
        self.duplicates = 0
        """Calls left out because an earlier call of this reply was the same."""
        self._made: set[tuple[str, str]] = set()
        self._buffer = ""
        self._in_call = False
        self._started = False
        self._pending_space = ""
        self._untagged: str | None = None

    def start_untagged(self) -> None:
        """From now on the reply is one untagged call block (`parse_untagged`): text fed is
        held, never content, and becomes calls at `finish`. Call it before any content."""
        self._untagged = ""

    def feed(self, text: str) -> list[Event]:
        if self._untagged is not None:
            self._untagged += text
            return []
        self._buffer += text
        events: list[Event] = []
        while not self.stopped:
            if self._in_call:
                end = self._buffer.find(CALL_CLOSE)
                if end < 0:
                    break
                events += self._close_call(self._buffer[:end])
                self._buffer = self._buffer[end + len(CALL_CLOSE):]
                continue
            hit = min(((self._buffer.find(m), m) for m in self.markers if m in self._buffer), default=None)
            if hit is None:
                hold = _partial_marker(self._buffer, self.markers)
                events += self._text(self._buffer[: len(self._buffer) - hold])
                self._buffer = self._buffer[len(self._buffer) - hold:]
                break
            at, marker = hit
            events += self._text(self._buffer[:at])
            self._buffer = self._buffer[at + len(marker):]
            if marker == CALL_OPEN:
                self._in_call = True
            else:
                self.stopped = True
        return events

    def finish(self) -> list[Event]:
        """Flush held text at the end of generation; an unfinished call is dropped."""
        if self._untagged is not None:
            return self._close_untagged(self._untagged)
        if self._in_call:
            self.dropped_call = True
            return []
        events = [] if self.stopped else self._text(self._buffer)
        self._buffer = ""
        return events

    def _close_call(self, body: str) -> list[Event]:
        self._in_call = False
        parsed = _parse_call(body, self.tool_names)
        if parsed is None:
            self.dropped_call = True
            return []
        return self._add_call(*parsed)

    def _close_untagged(self, text: str) -> list[Event]:
        parsed = parse_untagged(text, self.tool_names)
        if parsed is None:
            self.dropped_call = True
            return []
        return [event for name, arguments in parsed for event in self._add_call(name, arguments)]

    def _add_call(self, name: str, arguments: JsonObject) -> list[Event]:
        """The call as a `CallDelta`, or none when this reply already made the same call."""
        key = (name, json.dumps(arguments, sort_keys=True))
        if key in self._made:
            self.duplicates += 1
            return []
        self._made.add(key)
        call = {"id": f"call_{self.first_index + len(self.calls)}", "type": "function",
                "function": {"name": name, "arguments": _dumps(arguments)}}
        self.calls.append(call)
        return [CallDelta(len(self.calls) - 1, call)]

    def _text(self, text: str) -> list[Event]:
        if not self._started:
            text = text.lstrip()
        text = self._pending_space + text
        kept = text.rstrip()
        self._pending_space = text[len(kept):]
        if not kept:
            return []
        self._started = True
        self.content.append(kept)
        return [TextDelta(kept)]


def _partial_marker(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


# --- text the call grammar forces ------------------------------------------------------------


class CallForcer:
    """The text the call grammar forces next, in its canonical spacing (jump-forward decoding).

    Inside a call the grammar leaves the model one real choice per step only at the tool's name
    and in the arguments: ``\n{"name": "`` after the tag, the rest of a name once its start
    fits one tool, ``", "arguments": `` after it, and ``{}}\n</tool_call>`` for a tool without
    parameters are forced. The engine evaluates such text as one batch instead of sampling it
    token by token. The spacing is the one the prompt's own examples use, which the grammar allows.

    Args:
        tools: the offered tools.
        only: the one allowed function (a named tool_choice), else None.
    """

    _PARTIAL_NAME = re.compile(r'\n?\{ ?"name": ?"([^"]*)')

    def __init__(self, tools: Sequence[Mapping[str, Any]], only: str | None = None) -> None:
        self.parameters = {name: params for name, params in _tool_parameters(tools).items()
                           if only is None or name == only}

    def forced(self, text: str) -> str:
        """The forced continuation of `text` (the reply so far), or "" when the model chooses."""
        opened = text.rfind(CALL_OPEN)
        if not self.parameters or opened < 0 or CALL_CLOSE in text[opened:]:
            return ""
        call = text[opened + len(CALL_OPEN):]
        if call == "":
            return '\n{"name": "'
        match = self._PARTIAL_NAME.fullmatch(call)
        if match is None:
            return ""
        partial = match.group(1)
        names = [name for name in self.parameters if name.startswith(partial)]
        if len(names) != 1:
            return ""
        rest = names[0][len(partial):] + '", "arguments": '
        return rest + ("{}}\n" + CALL_CLOSE if not self.parameters[names[0]].get("properties") else "")


_OPEN_FENCE = re.compile(r"\A```(?:json)?[ \t]*\n\s*")


def finished_calls(text: str) -> int:
    """How many call objects a reply written under a call grammar has finished: tagged blocks
    closed, or whose ``{"name": …, "arguments": …}`` object is complete; or, for a reply that is
    an untagged call block, bare or in a ```json fence, its complete objects. Once a reply holds
    as many as it may (``parallel_tool_calls``), the grammar leaves only the closing tag or fence
    and the end of the turn, which add nothing to the calls. A doubled-brace block counts 0."""
    decoder = json.JSONDecoder()
    if CALL_OPEN in text:
        done = 0
        for block in text.split(CALL_OPEN)[1:]:
            body = block.lstrip()
            try:
                done += CALL_CLOSE in block or isinstance(decoder.raw_decode(body)[0], dict)
            except json.JSONDecodeError:
                pass
        return done
    rest, done = text.lstrip(), 0
    fence = _OPEN_FENCE.match(rest)
    if fence:  # a closed fence still counts its calls
        rest = rest[fence.end():].rstrip().removesuffix("```")
    if rest.startswith("{{") or "```" in rest:
        return 0
    while rest.startswith("{"):
        try:
            _, end = decoder.raw_decode(rest)
        except json.JSONDecodeError:
            break
        done, rest = done + 1, rest[end:].lstrip()
    return done


def _tool_parameters(tools: Sequence[Mapping[str, Any]]) -> dict[str, JsonObject]:
    return {str((t.get("function") or {}).get("name")): dict((t.get("function") or {}).get("parameters") or {})
            for t in tools}
