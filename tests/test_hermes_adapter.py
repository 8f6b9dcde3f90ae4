"""The local model path: the Hermes chat adapter as pure functions (render, parse), and the real
embedded llama.cpp server on the packaged SmolLM2 model, over loopback HTTP, no mocks.

The server tests check plumbing only, never the 135M model's judgement: a valid
chat.completion with real usage, tool results reaching the prompt (prompt_tokens grow by at
least the result's own token count), null assistant content accepted, and the KV prefix reused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jinja2.sandbox
import pytest

from runner import models
from runner.chat_adapter import default_system_prompt, parse_reply, render_prompt
from runner.errors import LocalServerError
from runner.local import LocalServer

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files in the workspace.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file from the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "file name"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "delete_file",
            "description": "Delete a file from the workspace (needs approval).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "scan_archive",
            "description": "Scan the archive (slow).",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
NAMES = [t["function"]["name"] for t in TOOLS]

# Qwen2.5-Instruct's chat template, verbatim from
# https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct/blob/7ae557604adf67be50417f59c2c2f167def9a775/tokenizer_config.json
# (the Qwen GGUF carries the same template). Our fixed renderer must match it byte for byte.
QWEN25_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    '    {%- for tool in tools %}\n        {{- "\\n" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n'
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n{%- else %}\n'
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n        {{- \'<|im_start|>\' + message.role }}\n'
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"
)

RESULT_TEXT = " ".join(
    f"zebra{i} quartz lantern{i % 7} obsidian meridian" if i % 5 == 0 else f"ledger{i} harbor"
    for i in range(150)
)  # ~300 words, distinctive


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def conversation(system: bool = True) -> list[dict[str, Any]]:
    """A conversation exercising every rendering rule (OpenAI shapes: arguments are strings)."""
    head = [{"role": "system", "content": "You are a careful agent."}] if system else []
    return head + [
        {"role": "user", "content": "Which file mentions a timeout?"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_0", "list_files", {})]},
        {"role": "tool", "tool_call_id": "call_0", "content": "errors.log\naccess.log\nnotes.txt"},
        {
            "role": "assistant",
            "content": "Reading both logs.",
            "tool_calls": [
                call("call_1", "read_file", {"path": "errors.log"}),
                call("call_2", "read_file", {"path": "ça.log"}),
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "worker 7 timed out after 30000 ms"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Error: no such file"},
        {"role": "assistant", "content": "errors.log mentions the timeout."},
        {"role": "user", "content": "Thanks."},
    ]


def qwen_reference(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """Render with Qwen's own jinja template the way transformers does (HF `tojson`)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, **_: json.dumps(value, ensure_ascii=False)
    hf_messages = json.loads(json.dumps(messages))
    for message in hf_messages:
        if message["role"] == "assistant" and message["content"] is None:
            message["content"] = ""
        for tool_call in message.get("tool_calls") or []:  # HF convention: arguments are objects
            tool_call["function"]["arguments"] = json.loads(tool_call["function"]["arguments"])
    template = env.from_string(QWEN25_TEMPLATE)
    return template.render(messages=hf_messages, tools=tools, add_generation_prompt=True)


# --- renderer --------------------------------------------------------------------------------


@pytest.mark.parametrize("system", [True, False])
@pytest.mark.parametrize("with_tools", [True, False])
def test_renderer_matches_qwen25_own_template(system: bool, with_tools: bool) -> None:
    messages = conversation(system)
    tools = TOOLS if with_tools else None
    default = default_system_prompt(QWEN25_TEMPLATE)
    assert default == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    assert render_prompt(messages, tools, default) == qwen_reference(messages, tools)


def test_tool_results_and_calls_appear_in_the_prompt() -> None:
    prompt = render_prompt(conversation(), TOOLS)
    listing = "errors.log\naccess.log\nnotes.txt"
    assert f"<|im_start|>user\n<tool_response>\n{listing}\n</tool_response><|im_end|>" in prompt
    assert "worker 7 timed out after 30000 ms" in prompt
    assert '<tool_call>\n{"name": "read_file", "arguments": {"path": "errors.log"}}\n</tool_call>' in prompt
    assert prompt.count("\n</tools>\n") == 1 and "\n" + json.dumps(TOOLS[3]) + "\n</tools>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_null_and_empty_assistant_content_render_the_same() -> None:
    with_null = conversation()
    with_empty = json.loads(json.dumps(with_null))
    with_empty[2]["content"] = ""
    assert with_null[2]["content"] is None
    assert render_prompt(with_null, TOOLS) == render_prompt(with_empty, TOOLS)


def test_content_parts_and_missing_content_are_text() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert "<|im_start|>user\nab<|im_end|>" in render_prompt(messages)
    assert "<|im_start|>tool" not in render_prompt([{"role": "tool", "tool_call_id": "x", "content": None}])


def test_smollm2_default_system_prompt_comes_from_its_gguf() -> None:
    from llama_cpp import Llama

    vocab = Llama(model_path=str(models.resolve("smollm2-135m-instruct")), vocab_only=True, verbose=False)
    default = default_system_prompt(vocab.metadata["tokenizer.chat_template"])
    assert default == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    prompt = render_prompt([{"role": "user", "content": "hi"}], None, default)
    assert prompt.startswith(f"<|im_start|>system\n{default}<|im_end|>")
    assert default_system_prompt(None) is None


# --- parser ----------------------------------------------------------------------------------


def test_tagged_calls_become_tool_calls_with_conversation_wide_ids() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "list_files", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "notes.txt"}}\n</tool_call>'
    )
    reply = parse_reply(text, NAMES, first_index=3)
    assert reply.content == "Let me look."
    assert [c["id"] for c in reply.tool_calls] == ["call_3", "call_4"]
    assert reply.tool_calls[1]["function"] == {"name": "read_file", "arguments": '{"path": "notes.txt"}'}
    assert all(c["type"] == "function" for c in reply.tool_calls)


def test_only_calls_means_null_content_and_missing_close_tag_is_tolerated() -> None:
    reply = parse_reply('<tool_call>\n{"name": "scan_archive", "arguments": {}}', NAMES)
    assert reply.content is None and reply.tool_calls[0]["function"]["name"] == "scan_archive"
    no_arguments = parse_reply('<tool_call>{"name": "list_files"}</tool_call>', NAMES)
    assert json.loads(no_arguments.tool_calls[0]["function"]["arguments"]) == {}
    as_string = json.dumps({"name": "read_file", "arguments": json.dumps({"path": "a"})})
    string_arguments = parse_reply(f"<tool_call>{as_string}</tool_call>", NAMES)
    assert json.loads(string_arguments.tool_calls[0]["function"]["arguments"]) == {"path": "a"}


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "list_files", "arguments": {}}',
        'I would call {"name": "read_file", "arguments": {"path": "errors.log"}} next.',
        '```json\n{"name": "list_files", "arguments": {}}\n```',
    ],
)
def test_untagged_json_in_prose_never_becomes_a_call(text: str) -> None:
    reply = parse_reply(text, NAMES)
    assert reply.tool_calls == [] and reply.content == text.strip()


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "read_file", "arguments": {"path": "a"}',  # truncated JSON
        "read_file(path='a')",  # not JSON
        '["read_file"]',  # not an object
        '{"name": "read_file", "arguments": ["a"]}',  # arguments not an object
        '{"name": "format_disk", "arguments": {}}',  # unknown tool
        '{"arguments": {}}',  # no name
    ],
)
def test_invalid_blocks_stay_as_content(body: str) -> None:
    text = f"<tool_call>\n{body}\n</tool_call>"
    reply = parse_reply(text, NAMES)
    assert reply.tool_calls == [] and reply.content == text


def test_surplus_closing_brackets_are_forgiven_other_trailing_text_is_not() -> None:
    slip = parse_reply('<tool_call>\n{"name": "list_files", "arguments": {}}\n}\n</tool_call>', NAMES)
    assert [c["function"]["name"] for c in slip.tool_calls] == ["list_files"]
    junk = '<tool_call>{"name": "list_files", "arguments": {}} and more</tool_call>'
    assert parse_reply(junk, NAMES).tool_calls == []


def test_a_bad_block_does_not_hide_a_good_one() -> None:
    good = '<tool_call>{"name": "list_files", "arguments": {}}</tool_call>'
    text = '<tool_call>{"name": "nope"}</tool_call> then ' + good
    reply = parse_reply(text, NAMES)
    assert [c["function"]["name"] for c in reply.tool_calls] == ["list_files"]
    assert reply.content == '<tool_call>{"name": "nope"}</tool_call> then'


def test_the_forced_parts_of_a_call_are_known_in_advance() -> None:
    from runner.chat_adapter import CallForcer

    forcer = CallForcer(TOOLS)
    assert forcer.forced("I will look.") == ""  # prose: the model chooses
    assert forcer.forced("I will look.<tool_call>") == '\n{"name": "'
    assert forcer.forced('<tool_call>\n{"name": "') == ""  # four tools: the model picks one
    assert forcer.forced('<tool_call>\n{"name": "rea') == 'd_file", "arguments": '
    assert forcer.forced('<tool_call>\n{"name": "list') == '_files", "arguments": {}}\n</tool_call>'
    assert forcer.forced('<tool_call>\n{"name": "read_file", "arguments": {"pa') == ""
    assert forcer.forced('<tool_call>{"name": "list_files", "arguments": {}}</tool_call>') == ""
    named = CallForcer(TOOLS, only="scan_archive")
    assert named.forced('<tool_call>\n{"name": "') == 'scan_archive", "arguments": {}}\n</tool_call>'
    assert CallForcer([]).forced("<tool_call>") == ""


# --- the real server on the packaged SmolLM2 ---------------------------------------------------


@pytest.fixture
def server(smollm2_server: LocalServer) -> LocalServer:
    return smollm2_server


def chat(server: LocalServer, messages: list[dict[str, Any]], max_tokens: int = 8) -> dict[str, Any]:
    reply = httpx.post(
        f"{server.base_url}/chat/completions",
        json={
            "model": "smollm2",
            "messages": messages,
            "tools": TOOLS,
            "temperature": 0,
            "max_tokens": max_tokens,
        },
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def first_turn() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are an agent working in a folder of log files. Use the tools."},
        {"role": "user", "content": "Read notes.txt and tell me what it says."},
    ]


def test_server_answers_a_valid_chat_completion(server: LocalServer) -> None:
    models_list = httpx.get(f"{server.base_url}/models", timeout=10).json()
    assert models_list["data"][0]["id"] == server.model_name == "smollm2"
    body = chat(server, first_turn())
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in {"stop", "length", "tool_calls"}
    for tool_call in choice["message"].get("tool_calls") or []:
        assert tool_call["function"]["name"] in NAMES
        assert isinstance(json.loads(tool_call["function"]["arguments"]), dict)
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    timings = body["runner"]
    assert timings["prompt_eval_tokens"] + timings["cached_prompt_tokens"] >= usage["prompt_tokens"] - 1


def test_tool_result_reaches_the_model_and_the_prefix_is_reused(server: LocalServer) -> None:
    turn1 = chat(server, first_turn())
    p1 = turn1["usage"]["prompt_tokens"]
    messages = first_turn() + [
        {"role": "assistant", "content": None, "tool_calls": [call("call_0", "read_file", {"path": "x"})]},
        {"role": "tool", "tool_call_id": "call_0", "content": RESULT_TEXT},
    ]
    turn2 = chat(server, messages)  # also proves assistant content: null is accepted
    p2 = turn2["usage"]["prompt_tokens"]
    root = server.base_url.removesuffix("/v1")
    counted = httpx.post(f"{root}/extras/tokenize/count", json={"input": RESULT_TEXT}, timeout=10).json()["count"]
    assert counted > 300  # counted by the model's own tokenizer
    assert p2 - p1 >= counted
    # Turn 2 starts with turn 1's prompt: its messages' KV entries are kept, all but the
    # assistant header, which is always evaluated again (whole messages only, see Engine).
    header = httpx.post(f"{root}/extras/tokenize/count", json={"input": "<|im_start|>assistant\n"}, timeout=10).json()["count"]
    assert turn2["runner"]["cached_prompt_tokens"] == p1 - header
    assert turn2["runner"]["prompt_eval_tokens"] == p2 - turn2["runner"]["cached_prompt_tokens"] < p2 - p1 + header + 1


def test_empty_and_null_assistant_content_give_the_same_prompt(server: LocalServer) -> None:
    base = first_turn() + [
        {"role": "assistant", "content": None, "tool_calls": [call("call_0", "list_files", {})]},
        {"role": "tool", "tool_call_id": "call_0", "content": "errors.log\naccess.log\nnotes.txt"},
    ]
    empty = json.loads(json.dumps(base))
    empty[2]["content"] = ""
    assert chat(server, base, 1)["usage"]["prompt_tokens"] == chat(server, empty, 1)["usage"]["prompt_tokens"]


def test_bad_requests_get_clear_errors(server: LocalServer) -> None:
    url = f"{server.base_url}/chat/completions"
    not_json = httpx.post(url, content=b"{nope", headers={"content-type": "application/json"}, timeout=10)
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]["message"]
    bad_role = httpx.post(url, json={"messages": [{"role": "robot", "content": "x"}]}, timeout=10)
    assert bad_role.status_code == 400 and bad_role.json()["error"]["param"] == "messages[0].role"
    no_messages = httpx.post(url, json={"model": "smollm2", "max_tokens": 4}, timeout=10)
    assert no_messages.status_code == 400, no_messages.text
    assert no_messages.json()["error"]["param"] == "messages"
    empty = httpx.post(url, json={"messages": []}, timeout=10)
    assert empty.status_code == 400
    bad_choice = httpx.post(url, json={"messages": first_turn(), "tools": TOOLS, "tool_choice": "always"}, timeout=10)
    assert bad_choice.status_code == 400 and "tool_choice" in bad_choice.json()["error"]["message"]
    unknown = {"type": "function", "function": {"name": "format_disk"}}
    named_unknown = httpx.post(url, json={"messages": first_turn(), "tools": TOOLS, "tool_choice": unknown}, timeout=10)
    assert named_unknown.status_code == 400 and "format_disk" in named_unknown.json()["error"]["message"]
    required_no_tools = httpx.post(url, json={"messages": first_turn(), "tool_choice": "required"}, timeout=10)
    assert required_no_tools.status_code == 400
    health = httpx.get(server.base_url.removesuffix("/v1") + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["pid"] == server.pid


def test_startup_failures_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LocalServerError, match="model file not found"):
        LocalServer(tmp_path / "missing.gguf").start()
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"not a gguf at all")
    server = LocalServer(corrupt, startup_timeout_s=60, log_path=tmp_path / "server.log")
    with pytest.raises(LocalServerError, match="exited with code") as caught:
        server.start()
    assert str(server.log_path) in str(caught.value) and "Failed to load model" in str(caught.value)
    assert server.pid is None  # stopped and forgotten
