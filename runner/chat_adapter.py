"""Hermes-style tool calling on llama.cpp: render the prompt, generate under a grammar, stream.

Why this exists: llama-cpp-python 0.3.x has no chat handler that both shows tool results to
the model and returns OpenAI ``tool_calls``; its ``chatml-function-calling`` handler renders
every ``role: tool`` message as an empty turn, and a GGUF's own template returns
``<tool_call>…</tool_call>`` as plain content. This module is the replacement, served under the
chat format name `HANDLER_NAME` by `runner.local_app`.

Prompt format (ChatML, with tools the way Qwen2.5's own chat template renders them; the
equivalence is tested against that template):

- system turn = the request's first system message (else the model's default system prompt,
  read from its GGUF template), followed, when tools are given, by the ``# Tools`` block with
  one JSON schema per line inside ``<tools></tools>``;
- an assistant tool call is ``\\n<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>``;
- consecutive tool results form one user turn of ``<tool_response>…</tool_response>`` blocks.

Generation (`Engine`): greedy (temperature 0), so a reply is a function of the prompt. Tool
calls are constrained by a llama.cpp grammar built from the offered tools' JSON schemas
(`call_grammar`): with ``tool_choice`` ``auto`` the grammar is lazy — free text until the model
writes ``<tool_call>``, then only an offered tool's name, arguments valid for its schema (no
extra keys) and ``</tool_call>``, then further calls or the end of the turn; ``required`` and a
named function put the whole turn under the grammar (exactly one call); ``none`` keeps the
tools in the prompt (the KV cache of the conversation stays valid) and generates under a grammar
that admits no call (`no_call_grammar`).
The prompt is evaluated message by message and the KV cache is reused for whole messages only
(see `Engine`), which makes a warm server's reply identical to a fresh one's.

Output (`Engine.stream`'s events; `runner.local_app` shapes them as OpenAI replies): text
outside calls is content; each complete call becomes an OpenAI tool call (id
``call_<n>``, n counted over the whole conversation so ids never repeat). Untagged JSON is never
a call, and a call cut short by ``max_tokens`` is dropped, never sent half-made.
"""

from __future__ import annotations

import codecs
import functools
import json
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from llama_cpp import Llama

    from runner.kvprefix import PrefixStore

HANDLER_NAME = "runner-hermes"
DEFAULT_MAX_TOKENS = 512
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


class ContextOverflow(RequestError):
    """The rendered prompt does not fit the context window.

    Attributes:
        n_prompt_tokens: the prompt's tokens. n_ctx: the context window, tokens.
    """

    def __init__(self, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(f"This model's maximum context length is {n_ctx} tokens; "
                         f"the prompt has {n_prompt_tokens} tokens")
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


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


def _count_prior_calls(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


def _tool_names(tools: Sequence[Mapping[str, Any]] | None) -> list[str]:
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
    """Content text, in order; the deltas concatenate to the reply's stripped content."""

    text: str


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
    """

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    timings: JsonObject


Event = TextDelta | CallDelta | Finished


class ReplySplitter:
    """Turns generated text, fed piece by piece, into content deltas and complete calls.

    Content is stripped the way `parse_reply` strips it (leading whitespace dropped, trailing
    whitespace held until more text follows), and any text that could still become
    ``<tool_call>`` or a stop string is held back, so streamed content never shows protocol
    text that the final reply would not.
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
        call = {"id": f"call_{self.first_index + len(self.calls)}", "type": "function",
                "function": {"name": parsed[0], "arguments": _dumps(parsed[1])}}
        self.calls.append(call)
        return [CallDelta(len(self.calls) - 1, call)]

    def _close_untagged(self, text: str) -> list[Event]:
        parsed = parse_untagged(text, self.tool_names)
        if parsed is None:
            self.dropped_call = True
            return []
        events: list[Event] = []
        for name, arguments in parsed:
            call = {"id": f"call_{self.first_index + len(self.calls)}", "type": "function",
                    "function": {"name": name, "arguments": _dumps(arguments)}}
            self.calls.append(call)
            events.append(CallDelta(len(self.calls) - 1, call))
        return events

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


# --- generation on llama.cpp -------------------------------------------------------------------


@dataclass
class ChatRequest:
    """What the engine needs from an OpenAI chat request (validated by `runner.local_app`).

    Attributes:
        messages: OpenAI messages, at least one.
        tools: OpenAI tool definitions (legacy ``functions`` already converted).
        tool_choice: as `parse_tool_choice` reads it.
        max_tokens: reply cap, tokens (None: the server's default).
        stop: extra stop strings.
        parallel_tool_calls: False: at most one call in the reply (OpenAI's
            ``parallel_tool_calls``); True: up to `MAX_CALLS_PER_TURN`.
    """

    messages: list[JsonObject]
    tools: list[JsonObject] = field(default_factory=list)
    tool_choice: Any = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    parallel_tool_calls: bool = True


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


def _tool_parameters(tools: Sequence[Mapping[str, Any]]) -> dict[str, JsonObject]:
    return {str((t.get("function") or {}).get("name")): dict((t.get("function") or {}).get("parameters") or {})
            for t in tools}


@dataclass
class _Reply:
    """One reply while `Engine` generates it: what drives generation and what it has made so far.

    Attributes:
        splitter: turns the reply's text into events.
        sampler: greedy llama.cpp sampler, under whichever grammar applies now.
        forcer: finds text the call grammar forces (jump-forward).
        decoder: incremental UTF-8 decoder of the sampled tokens' bytes.
        tools: the tools in view. choice: the request's ``tool_choice``.
        header: the assistant header's tokens (the prompt's last segment).
        max_tokens: the reply cap, tokens. began: request start, `time.perf_counter()` s.
        text: the reply so far. tail: its last characters while watching for ``<tool_call>``.
        generated: tokens generated (sampled or forced). first_token_ms: request start to the
            first sampled token, ms (0 until then).
        finish: "length" until generation ends otherwise ("stop", "cancelled").
        inject: forced text to evaluate next, "" for none.
        held: the reply's opening held back while it may be an untagged call, else None.
        watching: free text watched for the model writing ``<tool_call>`` (tool_choice auto).
    """

    splitter: ReplySplitter
    sampler: Any
    forcer: CallForcer
    decoder: codecs.IncrementalDecoder
    tools: list[JsonObject]
    choice: ToolChoice
    header: list[int]
    max_tokens: int
    began: float
    text: str = ""
    tail: str = ""
    generated: int = 0
    first_token_ms: float = 0.0
    finish: str = "length"
    inject: str = ""
    held: str | None = None
    watching: bool = False
    max_calls: int = MAX_CALLS_PER_TURN


class Engine:
    """Greedy chat generation on one `Llama`, one request at a time.

    KV reuse, message by message: the prompt is tokenized per segment (`render_segments`) and
    evaluated one segment per ``Llama.eval`` call. Leading segments identical to the previous
    request's are kept in the KV cache; the rest, and always the final assistant header, are
    evaluated again. Every token's KV entries and the first token's logits therefore come from
    the same batch composition whether the server is fresh or warm, so a fresh and a warm
    server give byte-identical replies (llama.cpp's batched and single-token kernels round
    differently; reusing a prefix that ends mid-message, as llama-cpp-python does, changed the
    first reply of a warm server). Generated tokens are never reused: the next request
    re-evaluates the assistant message as a prompt segment.

    Args:
        llama: the loaded model.
        default_max_tokens: reply cap when a request sets none, tokens.
        reuse_prefix: False evaluates every prompt in full (for measuring what reuse saves).
        jump_forward: evaluate text the call grammar forces as one batch (`CallForcer`);
            False samples it token by token (for measuring what that saves).
        untagged_calls: with ``tool_choice`` auto, a reply that starts with a JSON object (bare,
            fenced or in doubled braces) is a call (`untagged_start`): generation rewinds to the
            reply's start and writes it again under `untagged_call_grammar`. For models that
            write calls without the ``<tool_call>`` tag (Qwen2.5-Coder); the manifest says which.

    `prefix_store`, when set, gives a cold engine the first segment's KV entries from disk
    (`runner.kvprefix`): loaded when no segment is reused from memory, saved when it was
    evaluated into an empty cache.
    """

    prefix_store: PrefixStore | None = None
    _disk_prefix: list[int] | None = None
    """The first segment as loaded from disk, while its KV entries are in the cache."""
    _disk_tokens = 0

    def __init__(self, llama: Llama, default_max_tokens: int = DEFAULT_MAX_TOKENS,
                 reuse_prefix: bool = True, jump_forward: bool = True, untagged_calls: bool = False) -> None:
        import llama_cpp

        self.llama = llama
        self.default_max_tokens = default_max_tokens
        self.reuse_prefix = reuse_prefix
        self.jump_forward = jump_forward
        self.untagged_calls = untagged_calls
        self._lock = threading.Lock()
        self._segments: list[list[int]] = []
        self._default_system = default_system_prompt(llama.metadata.get("tokenizer.chat_template"))
        self._vocab = llama._model.vocab
        self._is_eog = llama_cpp.llama_vocab_is_eog
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def tokens(self, text: str) -> int:
        """Token count of `text` in this model's tokenizer (no BOS, special tokens parsed)."""
        return len(self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def stream(self, request: ChatRequest, cancel: threading.Event) -> Iterator[Event]:
        """Generate one reply as events: `TextDelta`/`CallDelta` as tokens arrive, then `Finished`.

        Waits for the previous request to finish first. Setting `cancel` stops generation
        within one token (finish_reason "cancelled"). Close the iterator when abandoning it.

        `Finished.timings`: prompt_tokens; cached_prompt_tokens (KV entries reused);
        prompt_eval_tokens (evaluated) and prompt_eval_ms; eval_tokens (generated) and
        eval_ms (sampling and single-token decodes); first_token_ms (request start to the
        first generated token); handler_ms (whole call, lock wait excluded).

        Raises:
            RequestError: bad tool_choice or tools; ContextOverflow when the prompt does not fit.
        """
        names = _tool_names(request.tools)
        choice = parse_tool_choice(request.tool_choice, names)
        # Under "none" the tools stay in the prompt, where every other turn has them, so the
        # conversation's KV entries are reused; a grammar rules the call out instead
        # (`no_call_grammar`).
        tools = request.tools if choice.mode != "none" else []
        prose_only = choice.mode == "none" and bool(request.tools)
        segments = render_segments(request.messages, request.tools, self._default_system)
        with self._lock:
            yield from self._generate(request, choice, tools, segments, cancel, prose_only)

    def _generate(self, request: ChatRequest, choice: ToolChoice, tools: list[JsonObject],
                  segments: list[str], cancel: threading.Event, prose_only: bool = False) -> Iterator[Event]:
        """Evaluate the prompt, then generate the reply as events ending with `Finished`.

        Args:
            request: the request being served.
            choice: its checked ``tool_choice``.
            tools: the tools the reply may call (none under ``tool_choice`` none, where they are
                still in the prompt).
            segments: the rendered prompt, one string per turn (`render_segments`).
            cancel: set to stop generation within one token.
            prose_only: generate under `no_call_grammar` (see `stream`).

        Raises:
            ContextOverflow: the prompt leaves no room for a reply token.
        """
        began = time.perf_counter()
        seg_tokens = [self.llama.tokenize(s.encode("utf-8"), add_bos=self._add_bos and i == 0, special=True)
                      for i, s in enumerate(segments)]
        prompt_tokens = sum(len(s) for s in seg_tokens)
        # llama.cpp rounds a context up (to at least 256 tokens), llama-cpp-python keeps room
        # for the n_ctx it was asked for: the smaller is what fits
        n_ctx = min(self.llama.n_ctx(), len(self.llama.input_ids))
        room = n_ctx - prompt_tokens
        if room < 1:
            raise ContextOverflow(prompt_tokens, n_ctx)
        max_tokens = min(request.max_tokens or self.default_max_tokens, room)
        cached = self._load_prompt(seg_tokens)
        prompt_done = time.perf_counter()
        reply = self._start_reply(request, choice, tools, prose_only, max_tokens, seg_tokens[-1], began)
        yield from self._decode(reply, cancel)
        yield from self._release_held(reply)  # a reply that ended while still undecided is text
        yield from reply.splitter.finish()
        yield self._finished(reply, prompt_tokens, cached, prompt_done)

    def _start_reply(self, request: ChatRequest, choice: ToolChoice, tools: list[JsonObject],
                     prose_only: bool, max_tokens: int, header: list[int], began: float) -> _Reply:
        """The state of a reply about to be generated: its sampler, splitter and forced text.

        Args:
            request, choice, tools, prose_only: as for `_generate`.
            max_tokens: the reply cap, tokens (already fitted to the context window).
            header: the assistant header's tokens (the prompt's last segment).
            began: `time.perf_counter()` when the request started, s.
        """
        splitter = ReplySplitter(_tool_names(tools), _count_prior_calls(request.messages),
                                 [*STOP_STRINGS, *request.stop], calls_allowed=bool(tools))
        # auto: free text, watched for the opening tag; required/named: the grammar from token 1.
        watching = bool(tools) and choice.mode == "auto"
        constrained = bool(tools) and choice.mode in ("required", "named")
        calls = MAX_CALLS_PER_TURN if request.parallel_tool_calls else 1
        sampler = (self._grammar_sampler(no_call_grammar(self.untagged_calls)) if prose_only
                   else self._sampler(tools, choice if constrained else None, calls))
        return _Reply(
            splitter=splitter,
            sampler=sampler,
            forcer=CallForcer(tools if self.jump_forward else [], choice.name),
            decoder=codecs.getincrementaldecoder("utf-8")(errors="replace"),
            tools=tools,
            choice=choice,
            header=header,
            max_tokens=max_tokens,
            began=began,
            inject=CALL_OPEN if constrained else "",
            # Untagged calls: the reply's opening is held back until `untagged_start` decides.
            held="" if watching and self.untagged_calls else None,
            watching=watching,
            max_calls=MAX_CALLS_PER_TURN if request.parallel_tool_calls else 1,
        )

    def _decode(self, reply: _Reply, cancel: threading.Event) -> Iterator[Event]:
        """Generate until end of turn, a stop string, `cancel` or max_tokens; sets `reply.finish`."""
        while reply.generated < reply.max_tokens:
            if cancel.is_set():
                reply.finish = "cancelled"
                return
            reply.inject = reply.inject or reply.forcer.forced(reply.text)
            if reply.inject:
                yield from self._jump_forward(reply)
                continue
            token = reply.sampler.sample(self.llama._ctx, -1)
            if self._is_eog(self._vocab, token):
                reply.finish = "stop"
                return
            reply.first_token_ms = reply.first_token_ms or (time.perf_counter() - reply.began) * 1000
            piece = reply.decoder.decode(self.llama.detokenize([token], special=True))
            if self._hold(reply, token, piece):
                continue
            yield from self._release_held(reply)
            opened = (reply.tail + piece).find(CALL_OPEN) if reply.watching else -1
            if opened >= 0:
                yield from self._open_call(reply, token, piece, opened)
                continue
            yield from self._emit(reply, token, piece)
            if reply.splitter.stopped:
                reply.finish = "stop"
                return

    def _jump_forward(self, reply: _Reply) -> Iterator[Event]:
        """Evaluate `reply.inject`, text the grammar allows in one way only, as one batch.

        The text is cut to the tokens left under max_tokens; the sampler accepts each token so
        its grammar state follows.
        """
        whole = self._tokenize(reply.inject)
        tokens = whole[: reply.max_tokens - reply.generated]
        piece = reply.inject if tokens == whole else self.llama.detokenize(tokens, special=True).decode("utf-8", "replace")
        for forced in tokens:
            reply.sampler.accept(forced)
        self.llama.eval(tokens)
        reply.generated += len(tokens)
        reply.text += piece
        reply.inject = ""
        yield from reply.splitter.feed(piece)

    def _hold(self, reply: _Reply, token: int, piece: str) -> bool:
        """Hold back the reply's opening while `untagged_start` cannot tell whether it is a call.

        Returns:
            True when the token was dealt with here: the opening is still undecided (the token
            is evaluated and held), or it is an untagged call (generation rewinds to the reply's
            start under `untagged_call_grammar`). False when nothing is held (any more): the
            reply is text and the token goes on as usual, after `_release_held`.
        """
        if reply.held is None:
            return False
        verdict = untagged_start(reply.held + piece)
        if verdict == "text":
            return False
        reply.generated += 1
        if verdict == "undecided":
            reply.held += piece
            self.llama.eval([token])
            return True
        self._rewind_reply(reply.header)
        reply.decoder.reset()
        reply.sampler = self._untagged_sampler(reply.tools, reply.max_calls)
        reply.splitter.start_untagged()
        reply.held, reply.watching = None, False
        return True

    def _release_held(self, reply: _Reply) -> list[Event]:
        """Show the held opening as text (it was evaluated already) and stop holding."""
        earlier, reply.held = reply.held, None
        if not earlier:
            return []
        reply.text, reply.tail = reply.text + earlier, (reply.tail + earlier)[-len(CALL_OPEN):]
        return reply.splitter.feed(earlier)

    def _emit(self, reply: _Reply, token: int, piece: str) -> Iterator[Event]:
        """Add a sampled token's text to the reply; evaluate the token unless a stop string ended it."""
        reply.tail = (reply.tail + piece)[-len(CALL_OPEN):]
        reply.generated += 1
        reply.text += piece
        yield from reply.splitter.feed(piece)
        if not reply.splitter.stopped:
            self.llama.eval([token])

    def _open_call(self, reply: _Reply, token: int, piece: str, opened: int) -> Iterator[Event]:
        """The model wrote ``<tool_call>`` (ending `opened` characters into tail + piece): keep
        the text up to the tag's end (a token may run past it), then hand the rest of the turn
        to the call grammar."""
        head = piece[: opened + len(CALL_OPEN) - len(reply.tail)]
        replacement = [token] if head == piece else self._tokenize(head)
        reply.generated += len(replacement)
        reply.text += head
        yield from reply.splitter.feed(head)
        self.llama.eval(replacement)
        reply.watching, reply.tail = False, ""
        reply.sampler = self._sampler(reply.tools, reply.choice, reply.max_calls, after_open=True)

    def _finished(self, reply: _Reply, prompt_tokens: int, cached: int, prompt_done: float) -> Finished:
        """The reply's `Finished` event, with the timings `stream` documents.

        Args:
            reply: the reply, fully generated.
            prompt_tokens: the prompt's tokens. cached: those whose KV entries were reused.
            prompt_done: `time.perf_counter()` when the prompt was evaluated, s.
        """
        done = time.perf_counter()
        finish = "tool_calls" if reply.finish == "stop" and reply.splitter.calls else reply.finish
        return Finished(finish, prompt_tokens, reply.generated, {
            "prompt_tokens": prompt_tokens,
            "cached_prompt_tokens": cached,
            "prompt_eval_tokens": prompt_tokens - cached,
            "prompt_eval_ms": round((prompt_done - reply.began) * 1000, 3),
            "eval_tokens": reply.generated,
            "eval_ms": round((done - prompt_done) * 1000, 3),
            "first_token_ms": round(reply.first_token_ms, 3),
            "prefix_disk_tokens": self._disk_tokens,
            "handler_ms": round((done - reply.began) * 1000, 3),
            "dropped_call": reply.splitter.dropped_call,
        })

    def _load_prompt(self, seg_tokens: list[list[int]]) -> int:
        """Evaluate the prompt segment by segment, keeping matching leading segments; returns
        the number of prompt tokens whose KV entries were reused."""
        keep = 0
        limit = min(len(self._segments), len(seg_tokens) - 1) if self.reuse_prefix else 0  # header: always
        while keep < limit and self._segments[keep] == seg_tokens[keep]:
            keep += 1
        if keep == 0 and self.reuse_prefix and len(seg_tokens) > 1:
            keep = self._restore_prefix(seg_tokens[0])
        self._disk_tokens = len(seg_tokens[0]) if keep and seg_tokens[0] == self._disk_prefix else 0
        self._segments = seg_tokens[:keep]
        cached = sum(len(s) for s in self._segments)
        self.llama.n_tokens = cached  # eval() drops every KV entry from here on
        for segment in seg_tokens[keep:]:
            self.llama.eval(segment)
            self._segments.append(segment)
            if len(self._segments) == 1 and len(seg_tokens) > 1:
                self._disk_prefix = None
                self._save_prefix(segment)
        return cached

    def warm_up(self) -> None:
        """Get a cold engine ready before its first request, as llama.cpp's own server does:
        one throwaway decode (the model's weights are read in, buffers allocated), then an
        empty cache again; then, with a prefix store, its most recently used saved prefix
        is loaded as if the previous request had left it."""
        self.llama.n_tokens = 0
        self.llama.eval(self._tokenize("<|im_start|>"))
        self.llama.n_tokens = 0
        self.llama._ctx.kv_cache_seq_rm(-1, 0, -1)
        self._segments = []
        tokens = self.prefix_store.latest() if self.prefix_store is not None and self.reuse_prefix else None
        if tokens and self._restore_prefix(tokens):
            self._segments = [tokens]

    def _restore_prefix(self, tokens: list[int]) -> int:
        """1 if the prefix store loaded `tokens`' KV entries (the first segment), else 0."""
        if self.prefix_store is None or not self.prefix_store.restore(self.llama, tokens):
            return 0
        self._disk_prefix = tokens
        return 1

    def _save_prefix(self, tokens: list[int]) -> None:
        if self.prefix_store is not None and self.reuse_prefix:
            self.prefix_store.save(self.llama, tokens)

    def _rewind_reply(self, header: list[int]) -> None:
        """Forget the tokens generated so far: drop their KV entries and evaluate the assistant
        header again as its own batch, as `_load_prompt` does, so the next token is sampled from
        the very logits the reply's first token was (the reply is rewritten under a grammar)."""
        self.llama.n_tokens = sum(len(s) for s in self._segments) - len(header)
        self.llama.eval(header)

    def _grammar_sampler(self, grammar: str) -> Any:
        """Greedy sampling under the GBNF `grammar` from the reply's next token."""
        from llama_cpp._internals import LlamaSampler
        from llama_cpp.llama_grammar import LlamaGrammar

        sampler: Any = LlamaSampler()  # type: ignore[no-untyped-call]
        sampler.add_grammar(self.llama._model, LlamaGrammar.from_string(grammar, verbose=False))
        sampler.add_greedy()
        return sampler

    def _untagged_sampler(self, tools: list[JsonObject], calls: int) -> Any:
        """Greedy sampling under `untagged_call_grammar` from the reply's first token."""
        return self._grammar_sampler(untagged_call_grammar(tools, calls))

    def _tokenize(self, text: str) -> list[int]:
        return self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def _sampler(self, tools: list[JsonObject], choice: ToolChoice | None, calls: int = MAX_CALLS_PER_TURN,
                 after_open: bool = False) -> Any:
        """Greedy sampling, under the call grammar (at most `calls` calls with ``tool_choice``
        auto) unless `choice` is None (free text)."""
        from llama_cpp._internals import LlamaSampler
        from llama_cpp.llama_grammar import LlamaGrammar

        sampler: Any = LlamaSampler()  # type: ignore[no-untyped-call]
        if choice is not None and choice.mode != "none" and tools:
            calls = calls if choice.mode == "auto" else 1
            text = call_grammar(tools, choice.name, calls=calls, after_open=after_open)
            sampler.add_grammar(self.llama._model, LlamaGrammar.from_string(text, verbose=False))
        sampler.add_greedy()
        return sampler
