"""Tools, workspace safety, sloppy tool calls, the client's normalisation."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from runner import store
from runner.cancel import CancelToken
from runner.harness import workspace_template
from runner.tools import DeleteFile, ListFiles, PermanentToolError, ReadFile, ToolContext, ToolError
from tests.conftest import drive, scripted_run


def ctx(ws: Path) -> ToolContext:
    return ToolContext(cancel=CancelToken(), workspace=ws)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return store.workspace_path(tmp_path, "r1", workspace_template())


def read(ws: Path, path: str) -> str:
    tool = ReadFile()
    return asyncio.run(tool.run(tool.parse(f'{{"path": "{path}"}}'), ctx(ws)))


def test_workspace_holds_three_files_errors_log_largest(ws: Path) -> None:
    listing = asyncio.run(ListFiles().run(ListFiles().parse("{}"), ctx(ws))).splitlines()
    assert [line.split()[0] for line in listing] == ["access.log", "errors.log", "notes.txt"]
    sizes = {p.name: p.stat().st_size for p in ws.iterdir()}
    assert max(sizes, key=sizes.__getitem__) == "errors.log"
    assert "worker 7" in read(ws, "errors.log") and "30000 ms" in read(ws, "errors.log")
    assert "rotate your logs" in read(ws, "notes.txt")


def test_list_files_shows_the_files_of_subfolders_by_path_and_leaves_hidden_and_ignored_ones_out(tmp_path: Path) -> None:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "store.py").write_text("x = 1\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    (tmp_path / "src" / ".cache").write_text("")
    (tmp_path / "README.md").write_text("# hi\n")
    (tmp_path / "runs" / "20261204-x").mkdir(parents=True)  # runner's runs folder, as `runner run` makes it
    (tmp_path / "runs" / ".gitignore").write_text("*\n")
    (tmp_path / "runs" / "20261204-x" / "state.json").write_text("{}")
    listing = asyncio.run(ListFiles().run(ListFiles().parse("{}"), ctx(tmp_path)))
    assert listing.splitlines() == ["README.md (5 bytes)", "src/pkg/store.py (6 bytes)"]
    assert "x = 1" in read(tmp_path, "src/pkg/store.py")


@pytest.mark.parametrize("path", ["../secrets.env", "/etc/passwd", "sub/../../x", "..\u002f..\u002fetc"])
def test_paths_outside_the_workspace_are_refused(ws: Path, path: str) -> None:
    with pytest.raises(PermanentToolError, match="permission denied"):
        read(ws, path)


def test_symlink_escape_is_refused(ws: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    os.symlink(secret, ws / "link.txt")
    with pytest.raises(PermanentToolError, match="outside the workspace"):
        read(ws, "link.txt")


def test_missing_file_tells_the_model_what_exists(ws: Path) -> None:
    with pytest.raises(ToolError, match=r"no such file: timeout\.log\. The top folder holds: access\.log, errors\.log, "
                                        r"notes\.txt\.$"):
        read(ws, "timeout.log")
    for i in range(14):
        (ws / f"extra{i:02}.txt").write_text("x")
    (ws / "sub").mkdir()
    with pytest.raises(ToolError, match=r"holds: access\.log, errors\.log, extra00\.txt, .* and 6 more\.$"):
        read(ws, "timeout.log")


def test_delete_touches_only_the_run_copy(ws: Path) -> None:
    tool = DeleteFile()
    c = ctx(ws)
    c.idempotency_key = "k1"
    assert asyncio.run(tool.run(tool.parse('{"path": "access.log"}'), c)) == "Deleted access.log."
    assert not (ws / "access.log").exists()
    assert (workspace_template() / "access.log").exists()
    # the same key again is a no-op that reports the same outcome
    assert asyncio.run(tool.run(tool.parse('{"path": "access.log"}'), c)) == "Deleted access.log."


@pytest.mark.parametrize("raw, message", [
    ('{"path": ', "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"file": "x"}', "path: Field required"),
    ('{"path": 3}', "path: Input should be a valid string"),
])
def test_bad_arguments_become_readable_errors(raw: str, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        ReadFile().parse(raw)


def test_schema_comes_from_the_pydantic_model() -> None:
    schema = ReadFile().schema()
    assert schema["function"]["name"] == "read_file"
    assert schema["function"]["parameters"]["required"] == ["path"]
    assert ListFiles().schema()["function"]["parameters"] == {"type": "object", "properties": {}}


def test_sloppy_tool_calls_are_normalised_and_answered(provider: str, runs: Path) -> None:
    """Empty and duplicate call ids, object arguments, trailing spaces, unknown tools and
    malformed JSON arrive over HTTP; every call gets exactly one readable answer."""
    state = drive(scripted_run("quirks"), provider, runs)
    assert state.status == "completed"
    calls = [c for m in state.messages for c in (m.tool_calls or [])]
    ids = [c.id for c in calls]
    assert len(ids) == 6 and len(set(ids)) == 6 and all(ids)
    assert all(isinstance(c.function.arguments, str) and c.function.arguments == c.function.arguments.strip()
               for c in calls)
    answers = {m.tool_call_id: m.content for m in state.messages if m.role == "tool"}
    assert set(answers) == set(ids)
    texts = [t or "" for t in answers.values()]
    assert "Remember to rotate your logs.\n" in texts
    assert any("no such file: missing.txt" in t for t in texts)
    assert any("unknown tool 'launch_rockets'" in t for t in texts)
    assert any("not valid JSON" in t for t in texts)
    assert any("path: Field required" in t for t in texts)
    assert state.tool_run_count == 3  # list, read notes, read missing; the rest never ran


def test_null_assistant_content_is_sent_as_empty_string(provider: str) -> None:
    from runner.client import _request_messages
    from runner.state import FunctionCall, Message, ToolCall

    msg = Message(role="assistant", content=None, tool_calls=[ToolCall(id="a", function=FunctionCall(name="x"))])
    assert _request_messages([msg])[0][0]["content"] == ""
