"""Grading a suite run: its final reply against the task's answer check (correct, wrong or
abstained), before which every reply is checked for what is no answer at all (chat-protocol
text, a pasted tool result, tool-call JSON, a list of tools).

Grading imports nothing from the steering: what counts as protocol text, an echo or an
abstention is decided here (`reply_fault`, `abstains`), not by the policies that steer a model.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from runner.suite.format import Check, FileCheck, Task

PROTOCOL_TEXT = re.compile(r"</?tool_(?:call|response)>|<\|im_(?:start|end)\|>")
"""Chat-protocol markup: an answer containing it pasted the transcript, it did not answer."""
TOOL_JSON = re.compile(r'"(?:name|arguments|parameters|properties|function|type)"\s*:')
"""A JSON key of a tool call or a tool schema: an answer containing one wrote a call or pasted
the tools as text, it did not answer."""
TOOL_LIST_MAX_OTHER_WORDS = 6
"""An answer naming two or more tools with fewer other words than this is a list of tools."""
ECHO_LINE_CHARS = 40
"""A tool-result line at least this long, found verbatim in a reply, makes the reply a copy."""

ABSTAINS = re.compile(
    r"\b(?:(?:is|are|was|were|'s)(?:n't| not) (?:mentioned|found|listed|specified|present|available|included|stated|"
    r"given|provided|defined|configured|recorded|shown|there|in (?:the|any))"
    r"|not (?:mentioned|listed|specified|stated|recorded|provided|given) (?:in|anywhere)"
    r"|no (?:information|mention|record|data|details?|entry|indication|reference)s?\b"
    r"|(?:does|do|did)(?:n't| not) (?:say|mention|contain|specify|include|list|state|show|give|record)"
    r"|(?:cannot|can't|could not|couldn't|unable to) (?:find|determine|tell|locate|see)"
    r"|there (?:is|are) no (?:\w+ )?(?:information|mention|record|data|details?|entry|file)"
    r"|information (?:is )?not (?:available|there)|not (?:available|found) in)")
"""An answer that says the information is not there (an abstention), in the ways models say it."""
Verdict = Literal["correct", "wrong", "abstained"]


class Grade(BaseModel):
    correct: bool
    why: str | None = None
    """Why a wrong answer is wrong; None when correct."""
    verdict: Verdict = "wrong"
    """correct; abstained (said the information is not there, on a task that has it); wrong."""


def grade(task: Task, answer: str, tool_runs: int, tool_results: list[str] = []) -> Grade:  # noqa: B006
    """Grade an answer: correct, wrong, or abstained (it says the information is not there,
    on a task whose folder holds it). Before the task's own patterns, `reply_fault` holds for
    every task: an answer that is no answer (protocol text, a pasted tool result, tool JSON, a
    list of tools) is wrong.

    Args:
        tool_runs: how many tool calls really ran.
        tool_results: the text of every tool result the run saw.
    """
    found = _grade(task, answer, tool_runs, tool_results)
    if found.correct:
        return found.model_copy(update={"verdict": "correct"})
    if not (task.check and task.check.absent) and answer.strip() and abstains(answer):
        return found.model_copy(update={"verdict": "abstained", "why": "says the information is not there"})
    return found


def _grade(task: Task, answer: str, tool_runs: int, tool_results: list[str]) -> Grade:
    text = answer.lower()
    check = task.check or Check()
    fault = reply_fault(answer, tool_results)
    if fault is not None:
        return Grade(correct=False, why=fault)
    if check.absent and not abstains(answer):
        return Grade(correct=False, why="does not say the information is not there")
    missing = [p for p in check.all if not re.search(p, text)]
    if missing:
        return Grade(correct=False, why=f"does not match {missing[0]!r}")
    wrong = next((p for p in check.none if re.search(p, text)), None)
    if wrong is not None:
        return Grade(correct=False, why=f"gives a wrong answer ({wrong!r})")
    if tool_runs < task.min_tool_runs:
        return Grade(correct=False, why=f"{tool_runs} tool runs, the task needs {task.min_tool_runs}")
    return Grade(correct=True)


def reply_fault(answer: str, tool_results: list[str]) -> str | None:
    """Why a final reply is no answer at all, whatever the task, or None: it is empty, holds
    chat-protocol text, reproduces a tool result verbatim (pasting the evidence back is not an
    answer), holds tool-call or tool-schema JSON, or is a list of tool names."""
    text = answer.lower()
    if not text.strip():
        return "no answer"
    if PROTOCOL_TEXT.search(text):
        return "contains tool-protocol text"
    if echoes(answer, tool_results):
        return "reproduces a tool result verbatim"
    if TOOL_JSON.search(text):
        return "is a tool call or tool schema written as JSON"
    if lists_tools(text):
        return "lists tool names"
    return None


def abstains(answer: str) -> bool:
    """True if `answer` says the information is not there (`ABSTAINS`)."""
    return ABSTAINS.search(answer.lower()) is not None


def echoes(answer: str, tool_results: list[str]) -> bool:
    """True if `answer` reproduces a tool result: one of its lines of `ECHO_LINE_CHARS`+
    characters, or two of its consecutive lines, appear verbatim (case and runs of whitespace
    ignored). Quoting a short phrase or one short line (a one-line note) is allowed."""
    flat = " ".join(answer.lower().split())
    for result in tool_results:
        lines = [line for line in (" ".join(raw.lower().split()) for raw in result.splitlines()) if line]
        if any(len(line) >= ECHO_LINE_CHARS and line in flat for line in lines):
            return True
        if any(f"{a} {b}" in flat for a, b in itertools.pairwise(lines)):
            return True
    return False


def lists_tools(text: str) -> bool:
    """True if `text` names three or more of runner's tools, or two or more with fewer than
    `TOOL_LIST_MAX_OTHER_WORDS` other words: a list of tools, not an answer."""
    from runner.catalog import NAMES

    named = {name for name in NAMES if re.search(rf"\b{re.escape(name)}\b", text)}
    if len(named) >= 3:
        return True
    other = [w for w in re.findall(r"[a-z0-9_.]+", text) if w not in named]
    return len(named) >= 2 and len(other) < TOOL_LIST_MAX_OTHER_WORDS


DAMAGE_LOST_SHARE = 0.5
"""A file the task names for an edit is damaged when it lost more than this share of its
distinct non-blank lines (and more than one): a file replaced by a fragment of itself."""


class EndGrade(BaseModel):
    """The workspace after a run, graded against the task's `end` (or `refused`)."""

    right: bool
    why: str | None = None
    """The first thing wrong with the files; None when right."""
    damaged: list[str] = []
    """Files the run damaged: a file the task does not name changed or gone, or a file it
    names for an edit that lost most of its lines (`DAMAGE_LOST_SHARE`)."""


def grade_end_state(task: Task, before: Path, after: Path) -> EndGrade | None:
    """Grade the files a run left in `after` (its copy of the workspace; the workspace itself
    when no tool wrote) against `before` (the workspace as the suite holds it) and the task's
    `end`; None for a task whose files are not graded. With `refused`, every file must be as
    it was and none added."""
    if not task.graded_files:
        return None
    old, new = _files(before), _files(after)
    end = task.end
    named = set(end.files) | set(end.deleted) if end and not task.refused else set()
    kept = set(end.unchanged) if end and end.unchanged is not None and not task.refused else set(old) - named
    problems: list[str] = []
    damaged: list[str] = []
    for path in sorted(kept):
        if path not in new:
            problems.append(f"{path} is gone")
            damaged.append(path)
        elif old.get(path) != new[path]:
            problems.append(f"{path} changed")
            damaged.append(path)
    problems += [f"{path} was added" for path in sorted(set(new) - set(old) - named)]
    if end is not None and not task.refused:
        problems += [f"{path} is still there" for path in end.deleted if path in new]
        for path, check in end.files.items():
            if check.content is None and path in old and path in new and _lost_most(old[path], new[path]):
                problems.append(f"{path} lost most of its lines")
                damaged.append(path)
            problem = _file_problem(path, check, new.get(path))
            if problem is not None:
                problems.append(problem)
    return EndGrade(right=not problems, why=problems[0] if problems else None, damaged=sorted(set(damaged)))


def _files(folder: Path) -> dict[str, bytes]:
    """Every regular file under `folder`, by path relative to it (with /), with its bytes; not
    the write tools' ledger a run's copy keeps (`runner.tools.LEDGER_NAME`)."""
    from runner.tools import LEDGER_NAME

    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p != folder / LEDGER_NAME}


def _file_problem(path: str, check: FileCheck, data: bytes | None) -> str | None:
    """What is wrong with one file the task names, or None."""
    if data is None:
        return f"{path} is missing"
    text = data.decode("utf-8", errors="replace")
    if check.content is not None:
        return None if text == check.content else f"{path} does not hold the expected content"
    missing = next((p for p in check.all if not re.search(p, text, re.MULTILINE)), None)
    if missing is not None:
        return f"{path} does not match {missing!r}"
    wrong = next((p for p in check.none if re.search(p, text, re.MULTILINE)), None)
    return None if wrong is None else f"{path} matches {wrong!r}"


def _lost_most(old: bytes, new: bytes) -> bool:
    """True if `new` lost more than `DAMAGE_LOST_SHARE` of `old`'s distinct non-blank lines, and more than one."""
    lines = {line.strip() for line in old.decode("utf-8", errors="replace").splitlines() if line.strip()}
    now = {line.strip() for line in new.decode("utf-8", errors="replace").splitlines()}
    lost = len(lines - now)
    return lost > 1 and lost > DAMAGE_LOST_SHARE * len(lines)
