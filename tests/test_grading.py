"""The suite's grading: echoes of tool output and wrong answers are graded wrong,
the scripted provider's honest answers are graded right. Pure: the suite definition as checked
in, tool results as the real tools produce them over the checked-in workspace."""

from __future__ import annotations

import asyncio
import json

import pytest

from runner.cancel import CancelToken
from runner.harness import workspace_template
from runner.replies import echoes
from runner.suite import Task, load_suite
from runner.suite.grading import grade
from runner.tools import BASIC_TOOLS, ToolContext

TASKS = {t.id: t for t in load_suite().tasks}


def tool_output(name: str, **args: str) -> str:
    """What the real tool returns over the checked-in workspace."""
    tool = next(cls() for cls in BASIC_TOOLS if cls.name == name)
    ctx = ToolContext(cancel=CancelToken(), workspace=workspace_template(), idempotency_key="k", call_id="c")
    return str(asyncio.run(tool.run(tool.parse(json.dumps(args)), ctx)))


LISTING = tool_output("list_files")
NOTES = tool_output("read_file", path="notes.txt")
ERRORS = tool_output("read_file", path="errors.log")


@pytest.mark.parametrize(("task", "answer", "results", "runs"), [
    ("timeout_file", "errors.log mentions a timeout: worker 7 timed out after 30000 ms.", [LISTING, ERRORS], 2),
    ("count_files", "There are 3 files in the workspace.", [LISTING], 1),
    ("read_notes", f"notes.txt says: {NOTES.strip()}", [NOTES], 1),
    ("read_each", "I read access.log (HTTP requests), errors.log (worker 7 timed out after 30000 ms) "
                  "and notes.txt (rotate your logs).", [LISTING, ERRORS, NOTES, "x"], 4),
    ("largest_file", "The largest file is errors.log (423 bytes).", [LISTING], 1),
    ("rotate_logs", "Yes: notes.txt is about rotating logs. It says: Remember to rotate your logs.", [LISTING, NOTES], 2),
])
def test_the_scripted_answers_are_right(task: str, answer: str, results: list[str], runs: int) -> None:
    found = grade(TASKS[task], answer, runs, results)
    assert found.correct, found.why


def test_an_echo_of_the_tool_protocol_is_wrong() -> None:
    """SmolLM2's old 'correct' answers: the raw tool response pasted back."""
    echo = f"<tool_response>\n{LISTING}\n</tool_response>"
    for task in ("timeout_file", "largest_file", "rotate_logs"):
        found = grade(TASKS[task], echo, 1, [LISTING])
        assert not found.correct and found.why == "holds the chat's tool-protocol markup"
    assert not grade(TASKS["count_files"], '<tool_call>{"name": "list_files"}</tool_call> 3', 1, []).correct


def test_a_verbatim_copy_of_a_tool_result_is_wrong() -> None:
    listing_echo = "Here you go: " + LISTING
    assert echoes(listing_echo, [LISTING])
    assert grade(TASKS["largest_file"], listing_echo, 1, [LISTING]).why == "reproduces a tool result verbatim"
    line = ERRORS.splitlines()[2]  # one long log line, copied with other spacing and case
    assert len(line) >= 40 and echoes("The answer: " + " ".join(line.upper().split()), [ERRORS])
    assert not grade(TASKS["timeout_file"], f"errors.log says {line}", 2, [ERRORS]).correct
    # Quoting a phrase, or a one-line note, is not an echo.
    assert not echoes("worker 7 timed out after 30000 ms", [ERRORS])
    assert not echoes(f"It says: {NOTES.strip()}", [NOTES])


@pytest.mark.parametrize(("task", "answer"), [
    ("largest_file", "The largest file is access.log."),
    ("largest_file", "notes.txt is the biggest one."),
    ("timeout_file", "access.log mentions a timeout."),
    ("count_files", "There are 4 files."),
    ("count_files", "I count two files, not 3."),
    ("rotate_logs", "No, there is no such file; errors.log is about errors."),
    ("read_notes", "It says the worker timed out."),
])
def test_each_task_names_its_wrong_answers(task: str, answer: str) -> None:
    found = grade(TASKS[task], answer, 5, [])
    assert not found.correct and found.why is not None


def test_too_few_tool_runs_is_wrong() -> None:
    answer = "I read access.log, errors.log and notes.txt."
    assert grade(TASKS["read_each"], answer, 4, []).correct
    assert grade(TASKS["read_each"], answer, 1, []).why == "1 tool runs, the task needs 4"


def test_task_model_is_the_checked_in_one() -> None:
    assert isinstance(TASKS["read_each"], Task) and TASKS["read_each"].min_tool_runs == 4


@pytest.mark.parametrize("answer", [
    '{"name": "read_file", "arguments": {"path": "errors.log"}}',
    '```json\n{"name": "list_files", "arguments": {}}\n```',
    'The file is errors.log. {"name": "read_file", "arguments": {"path": "errors.log"}}',
    '[{"type": "function", "function": {"name": "read_file", "description": "Read errors.log"}}]',
    '{"properties": {"path": {"type": "string"}}} errors.log',
])
def test_tool_call_or_schema_json_is_wrong(answer: str) -> None:
    found = grade(TASKS["timeout_file"], answer, 2, [LISTING, ERRORS])
    assert not found.correct and found.why == "writes a tool call or a tool schema as JSON"


@pytest.mark.parametrize("answer", [
    "list_files, read_file, delete_file",
    "list_files and read_file: errors.log",
    "I can use list_files, read_file, delete_file and scan_archive to find out; errors.log.",
])
def test_a_list_of_tool_names_is_wrong(answer: str) -> None:
    found = grade(TASKS["timeout_file"], answer, 2, [LISTING, ERRORS])
    assert not found.correct and found.why == "lists tool names"


def test_naming_a_tool_in_a_real_answer_is_fine() -> None:
    answer = "I used list_files and then read_file on each log: errors.log mentions the timeout of worker 7."
    assert grade(TASKS["timeout_file"], answer, 2, [LISTING, ERRORS]).correct
