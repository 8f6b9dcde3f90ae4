"""The chat-completions request body as OpenAI's API checks it: pydantic models of the body,
its messages (one model per role) and its tools, and the 400 a body that fails them gets.

A field OpenAI requires and the body lacks (a tool's function name, a message's role, a tool
message's ``tool_call_id``, an assistant call's id…) or a value of the wrong type is refused
before anything is rendered, with OpenAI's wording and its ``param`` in OpenAI's spelling
(``messages[2].tool_call_id``). Fields these models do not name pass through unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError
from pydantic_core import ErrorDetails

from runner.engine import ChatRequest

FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]+$"
"""What OpenAI accepts as a function name (up to `FUNCTION_NAME_MAX_CHARS`)."""
FUNCTION_NAME_MAX_CHARS = 64
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    """One part of a list-valued content (``{"type": "text", "text": ...}``, an image…)."""

    type: str


Content = str | list[ContentPart]


class FunctionCallIn(_Open):
    name: str
    arguments: str
    """The arguments as a JSON string, as OpenAI's replies carry them."""


class ToolCallIn(_Open):
    id: str
    type: Literal["function"]
    function: FunctionCallIn


class SystemMessage(_Open):
    role: Literal["system", "developer"]
    """``developer`` (OpenAI's name for system instructions to newer models) is read as system."""
    content: Content


class UserMessage(_Open):
    role: Literal["user"]
    content: Content


class AssistantMessage(_Open):
    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: list[ToolCallIn] | None = None


class ToolMessage(_Open):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


class FunctionMessage(_Open):
    """The result of a legacy ``function_call``."""

    role: Literal["function"]
    content: str | None
    name: str


def _role(value: Any) -> str | None:
    role = value.get("role") if isinstance(value, dict) else getattr(value, "role", None)
    return {"developer": "system"}.get(role, role) if role in ROLES else None


Message = Annotated[
    Annotated[SystemMessage, Tag("system")] | Annotated[UserMessage, Tag("user")]
    | Annotated[AssistantMessage, Tag("assistant")] | Annotated[ToolMessage, Tag("tool")]
    | Annotated[FunctionMessage, Tag("function")],
    Discriminator(_role, custom_error_type="role", custom_error_message="role"),
]


class FunctionDefinition(_Open):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN, max_length=FUNCTION_NAME_MAX_CHARS)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON schema object; None: the function takes no arguments."""
    strict: bool | None = None


class ToolDefinition(_Open):
    type: Literal["function"]
    function: FunctionDefinition


class NamedToolChoice(_Open):
    class Named(_Open):
        name: str

    type: Literal["function"]
    function: Named


class StreamOptions(_Open):
    include_usage: bool = False


class ChatBody(_Open):
    """The part of an OpenAI chat request this server reads; other fields are ignored
    (sampling is always greedy)."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDefinition] | None = None
    functions: list[FunctionDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    parallel_tool_calls: bool | None = None
    """None: the request does not say; the server's default applies (`Backend.parallel_default`)."""
    grammar_tools: list[ToolDefinition] | None = None
    """runner's own field: narrower definitions of some of `tools` that the reply's calls must
    match, while the prompt shows `tools` (`ChatRequest.grammar_tools`)."""
    logprobs: bool = False
    """Return each generated token's log probability (``choices[].logprobs.content``)."""
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    """With `logprobs`: how many of the likeliest tokens each entry lists beside its own."""
    response_format: dict[str, Any] | None = None
    """``json_object`` / ``json_schema``: a reply that can call no tool follows it (a grammar)."""
    n: int = Field(default=1, ge=1, le=1)
    """Replies per request: one (greedy decoding would give n identical ones)."""

    def to_request(self, parallel_default: bool) -> ChatRequest:
        """The engine's request; `parallel_default` stands where the body does not say."""
        tools = ([t.model_dump(exclude_none=True) for t in self.tools] if self.tools else
                 [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in self.functions or []])
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        parallel = self.parallel_tool_calls if self.parallel_tool_calls is not None else parallel_default
        choice = self.tool_choice.model_dump() if isinstance(self.tool_choice, NamedToolChoice) else self.tool_choice
        return ChatRequest(
            messages=[{"content": None} | m.model_dump(exclude_none=True)
                      | ({"role": "system"} if m.role == "developer" else {}) for m in self.messages],
            tools=tools, tool_choice=choice, stop=stop,
            max_tokens=self.max_completion_tokens or self.max_tokens,
            parallel_tool_calls=parallel,
            grammar_tools=[t.model_dump(exclude_none=True) for t in self.grammar_tools or []],
            top_logprobs=(self.top_logprobs or 0) if self.logprobs else None,
            response_format=self.response_format,
        )


class BodyError(ValueError):
    """A body that fails `ChatBody`, as OpenAI words it.

    Attributes:
        param: the field, in OpenAI's spelling (``tools[0].function.name``).
        code: OpenAI's code: ``missing_required_parameter``, ``invalid_type`` or ``invalid_value``.
    """

    def __init__(self, message: str, param: str, code: str) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def parse_body(raw: dict[str, Any]) -> ChatBody:
    """`raw` as a `ChatBody`.

    Raises:
        BodyError: the first field that fails, named.
    """
    try:
        return ChatBody.model_validate(raw)
    except ValidationError as exc:
        # Of the branches of a union, the one that got furthest says what is wrong.
        raise _body_error(max(exc.errors(), key=lambda e: len(_field_path(e["loc"])))) from None


def _body_error(problem: ErrorDetails) -> BodyError:
    loc = _field_path(problem["loc"])
    kind = problem["type"]
    if kind == "role":  # the message's role is missing or no role at all
        param = _param([*loc, "role"])
        if "role" in (problem.get("input") or {}):
            return BodyError(f"Invalid value for '{param}': expected one of {', '.join(map(repr, ROLES))}.",
                             param, "invalid_value")
        return BodyError(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    param = _param(loc)
    if kind == "missing":
        return BodyError(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    if kind.endswith("_type") or kind in ("model_type", "dict_type", "list_type"):
        return BodyError(f"Invalid type for '{param}': {problem['msg']}.", param, "invalid_type")
    return BodyError(f"Invalid value for '{param}': {problem['msg']}.", param, "invalid_value")


def _field_path(loc: tuple[int | str, ...]) -> list[int | str]:
    """A pydantic location without the union branches it tried (a message's role tag after
    ``messages[i]``, a type label such as ``str`` or ``NamedToolChoice``): OpenAI's ``param``
    names none."""
    out: list[int | str] = []
    for i, part in enumerate(loc):
        tag = i >= 2 and loc[i - 2] == "messages" and isinstance(loc[i - 1], int)
        label = isinstance(part, str) and (part in ("str", "int", "bool") or not part.isidentifier()
                                           or part[0].isupper())
        if not (tag or label):
            out.append(part)
    return out


def _param(loc: list[int | str]) -> str:
    """A pydantic location as OpenAI spells a parameter: ``messages[1].tool_call_id``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out
