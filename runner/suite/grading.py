"""Grading a suite run: its final reply against the task's answer check (correct, wrong or
abstained), and the files it left against the task's end state.

What a reply is (an answer, an abstention, or no answer at all: protocol text, a pasted tool
result, tool JSON, a list of tools, ...) is `runner.replies.classify`'s judgement, the one the
steering uses too; grading imports nothing from the steering itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from runner import replies
from runner.suite.format import Check, FileCheck, Task

Verdict = Literal["correct", "wrong", "abstained"]


class Grade(BaseModel):
    correct: bool
    why: str | None = None
    """Why a wrong answer is wrong; None when correct."""
    verdict: Verdict = "wrong"
    """correct; abstained (said the information is not there, on a task that has it); wrong."""


def grade(task: Task, answer: str, tool_runs: int, tool_results: Sequence[str] = (),
          tool_names: Sequence[str] | None = None) -> Grade:
    """Grade an answer: correct, wrong, or abstained (it says the information is not there,
    on a task whose folder holds it). Before the task's own patterns, a reply that is no
    answer at all (`runner.replies.classify`) is wrong, and so is one that reproduces a tool
    result verbatim (`runner.replies.echoes`: a long line or two lines of one; pasting the
    evidence back is not an answer); on a task graded by its files, only a reply that is no
    message at all (`_message`).

    Args:
        tool_runs: how many tool calls really ran.
        tool_results: the text of every tool result the run saw.
        tool_names: the tools the run offered (None: every built-in tool's name).
    """
    if tool_names is None:
        from runner.catalog import NAMES

        tool_names = NAMES
    kind = _message(answer) if task.graded_files else replies.classify(answer, task.prompt, tool_results, tool_names)
    if kind.kind != "no_answer" and not task.graded_files and replies.echoes(answer, tool_results):
        kind = replies.ReplyClass("no_answer", "reproduces a tool result verbatim")
    found = _grade(task, answer, kind, tool_runs)
    if found.correct:
        return found.model_copy(update={"verdict": "correct"})
    if not (task.check and task.check.absent) and kind.kind == "abstention":
        return found.model_copy(update={"verdict": "abstained", "why": "says the information is not there"})
    return found


def _message(reply: str) -> replies.ReplyClass:
    """What the reply of a task graded by its files is: such a task asks for an action, not an
    answer, so a reply that says what was done, asks back or restates the request is a
    message; only an empty one, or one holding the protocol's markup or tool JSON, is not."""
    if not reply.strip() or replies.PROTOCOL.search(reply) or replies.TOOL_JSON.search(reply):
        return replies.ReplyClass("no_answer", "is empty or protocol text")
    return replies.ReplyClass("answer")


def _grade(task: Task, answer: str, kind: replies.ReplyClass, tool_runs: int) -> Grade:
    text = answer.lower()
    check = task.check or Check()
    if kind.kind == "no_answer":
        return Grade(correct=False, why=kind.why)
    if check.absent and kind.kind != "abstention":
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
