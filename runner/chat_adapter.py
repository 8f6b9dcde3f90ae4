"""Hermes-style tool calling for llama-cpp-python: render the prompt, generate, parse the calls.

Why this exists: llama-cpp-python 0.3.x has no chat handler that both shows tool results to
the model and returns OpenAI ``tool_calls``. Its ``chatml-function-calling`` handler renders
every ``role: tool`` message as an empty turn and drops the tools when ``tool_choice`` is
absent; the GGUF's own template renders tools but returns ``<tool_call>…</tool_call>`` as plain
content. This module is the deliberate replacement, registered under `HANDLER_NAME`.

Prompt format (ChatML, with tools the way Qwen2.5's own chat template renders them; the
equivalence is tested against that template):

- system turn = the request's first system message (else the model's default system prompt,
  read from its GGUF template), followed, when tools are given, by the ``# Tools`` block with
  one JSON schema per line inside ``<tools></tools>``;
- an assistant tool call is ``\\n<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>``;
- consecutive tool results form one user turn of ``<tool_response>…</tool_response>`` blocks.

Output: every ``<tool_call>{json}</tool_call>`` block whose JSON is an object naming one of the
request's tools becomes an OpenAI tool call (id ``call_<n>``, n counted over the whole
conversation so ids never repeat); everything else stays content. Untagged JSON is never a
call. Decoding is greedy (temperature 0), so a reply is a function of the prompt.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llama_cpp import Llama

HANDLER_NAME = "runner-hermes"
DEFAULT_MAX_TOKENS = 512
STOP_STRINGS = ("<|im_end|>", "<|endoftext|>")

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

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
# A literal default system prompt inside a ChatML template, e.g. Qwen's or SmolLM2's. The
# template may hold a real newline or the two characters backslash-n.
_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\n|\\n)([^'\"{}<]+?)<\|im_end\|>")


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


def default_system_prompt(chat_template: str | None) -> str | None:
    """The default system prompt a ChatML GGUF template inserts, or None if it has none.

    Args:
        chat_template: the GGUF's ``tokenizer.chat_template`` metadata (jinja source).
    """
    if not chat_template:
        return None
    match = _DEFAULT_SYSTEM.search(chat_template)
    return match.group(1) if match else None


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
    parts: list[str] = []
    first_is_system = bool(messages) and messages[0].get("role") == "system"
    system = _text(messages[0].get("content")) if first_is_system else default_system
    if tools:
        intro = system if system is not None else ""
        schemas = "".join("\n" + _dumps(tool) for tool in tools)
        parts.append(f"<|im_start|>system\n{intro}{TOOLS_HEADER}{schemas}{TOOLS_FOOTER}<|im_end|>\n")
    elif system is not None:
        parts.append(f"<|im_start|>system\n{system}<|im_end|>\n")
    for i, _message in enumerate(messages):
        if i == 0 and first_is_system:
            continue
        parts.append(_render_message(messages, i))
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


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


def hermes_chat_handler(
    *,
    llama: Llama,
    messages: list[JsonObject],
    functions: list[JsonObject] | None = None,
    tools: list[JsonObject] | None = None,
    tool_choice: str | JsonObject | None = None,
    stream: bool = False,
    stop: str | list[str] | None = None,
    seed: int | None = None,
    max_tokens: int | None = None,
    model: str | None = None,
    **_ignored: Any,
) -> JsonObject | Iterator[JsonObject]:
    """A llama-cpp-python chat completion handler (the `LlamaChatCompletionHandler` protocol).

    Renders with `render_prompt`, generates greedily (temperature 0, repeat penalty 1; the
    request's sampling options, grammar, logit_bias and response_format are ignored) until
    ``<|im_end|>``, `max_tokens` (default `DEFAULT_MAX_TOKENS`) or a request stop string,
    and parses with `parse_reply`. The request's seed is passed through.
    ``tool_choice="none"`` hides the tools and parses no calls; a named or "required"
    choice is treated as "auto" (nothing is forced).

    Returns:
        An OpenAI ``chat.completion`` dict. `usage` is real: prompt_tokens = tokens of the
        rendered prompt, completion_tokens = generated tokens. An extra ``runner`` object
        carries llama.cpp's own timings for this call (see `_PerfWindow`). With
        ``stream=True``, the same reply as a short iterator of ``chat.completion.chunk`` dicts.

    Raises:
        ValueError: from llama-cpp-python when the prompt exceeds the context window
            (the server turns it into an OpenAI-style 400).
    """
    if functions and not tools:
        tools = [{"type": "function", "function": f} for f in functions]
    if tool_choice == "none":
        tools = None
    chat_template = llama.metadata.get("tokenizer.chat_template")
    prompt = render_prompt(messages, tools, default_system_prompt(chat_template))
    prompt_tokens = llama.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
    extra_stop = [stop] if isinstance(stop, str) else list(stop or [])
    with _PerfWindow(llama, prompt_tokens) as perf:
        completion: Any = llama.create_completion(
            prompt=prompt_tokens,
            max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            temperature=0.0,
            repeat_penalty=1.0,
            stop=[*STOP_STRINGS, *extra_stop],
            seed=seed,
            model=model,
            stream=False,
        )
    choice = completion["choices"][0]
    parsed = parse_reply(choice["text"], _tool_names(tools), _count_prior_calls(messages))
    response = _chat_completion(completion, parsed, perf.timings)
    return _as_chunks(response) if stream else response


def _chat_completion(completion: Any, parsed: ParsedReply, timings: JsonObject | None) -> JsonObject:
    """Wrap a llama-cpp-python text completion and its parsed reply as a chat.completion."""
    choice = completion["choices"][0]
    message: JsonObject = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = parsed.tool_calls
    response: JsonObject = {
        "id": "chat" + str(completion["id"]),
        "object": "chat.completion",
        "created": completion["created"],
        "model": completion["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if parsed.tool_calls else choice["finish_reason"],
            }
        ],
        "usage": completion["usage"],
    }
    if timings is not None:
        response["runner"] = timings
    return response


class _PerfWindow:
    """Measures one generation with llama.cpp's own counters; `timings` is set on success.

    The ``runner`` timings: prompt_eval_ms / prompt_eval_tokens (batched decodes) and
    eval_ms / eval_tokens (single-token decodes) from ``llama_perf_context``, reset right
    before the call, in ms and tokens; cached_prompt_tokens = prompt tokens whose KV entries
    were reused from the previous request (the common prefix with the tokens in the context,
    minus the one token llama-cpp-python re-decodes to refresh logits); handler_ms = wall time
    of the generation call, ms. Left None (no ``runner`` field) if llama's internals change.
    """

    def __init__(self, llama: Llama, prompt_tokens: Sequence[int]) -> None:
        self.timings: JsonObject | None = None
        self.cached = _reusable_prefix(llama, prompt_tokens)
        self.ctx: Any = getattr(getattr(llama, "_ctx", None), "ctx", None)
        self.started = 0.0

    def __enter__(self) -> _PerfWindow:
        import llama_cpp

        if self.ctx is not None:
            llama_cpp.llama_perf_context_reset(self.ctx)
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        import llama_cpp

        wall_ms = (time.perf_counter() - self.started) * 1000.0
        if self.ctx is None or exc_info[0] is not None:
            return
        data = llama_cpp.llama_perf_context(self.ctx)
        self.timings = {
            "prompt_eval_ms": round(data.t_p_eval_ms, 3),
            "prompt_eval_tokens": int(data.n_p_eval),
            "eval_ms": round(data.t_eval_ms, 3),
            "eval_tokens": int(data.n_eval),
            "cached_prompt_tokens": self.cached,
            "handler_ms": round(wall_ms, 3),
        }


def _reusable_prefix(llama: Llama, prompt_tokens: Sequence[int]) -> int:
    """Tokens `Llama.generate` will keep from its KV cache for this prompt (its own rule)."""
    previous = getattr(llama, "_input_ids", None)
    if previous is None or len(prompt_tokens) == 0:
        return 0
    common = 0
    for a, b in zip(previous.tolist(), prompt_tokens):
        if a != b:
            break
        common += 1
    return min(common, len(prompt_tokens) - 1)


def _as_chunks(response: JsonObject) -> Iterator[JsonObject]:
    """The finished reply as OpenAI stream chunks: role+content, tool calls, finish."""
    choice = response["choices"][0]
    message = choice["message"]
    base = {k: response[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    delta: JsonObject = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(message["tool_calls"])]
    yield base | {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}
    yield base | {
        "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}]
    }


def register(name: str = HANDLER_NAME) -> None:
    """Register `hermes_chat_handler` with llama-cpp-python under `name` (idempotent).

    Must run in the process that serves requests: the registry is a per-process singleton,
    consulted by name at request time.
    """
    from llama_cpp import llama_chat_format

    # The registry is untyped and its protocol uses TypedDicts; our handler takes plain dicts.
    registry: Any = llama_chat_format.LlamaChatCompletionHandlerRegistry
    registry().register_chat_completion_handler(name, hermes_chat_handler, overwrite=True)
