"""Tasks graded by the files they leave: the scripted provider (a scenario per task id) makes
a right edit, tries to replace a file with a fragment of itself (write_file refuses it), deletes the right and the wrong file,
and asks for a write the task refuses; the report grades the files apart from the reply."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner import store
from runner.scripted import SCENARIOS, Reply
from runner.suite import load_suite, run_suite
from runner.suite.jobs import REFUSED_WRITE
from tests.conftest import cli

PYPROJECT = '[project]\nname = "tally"\nversion = "0.4.2"\ndescription = "Counts things."\n' \
            'requires-python = ">=3.10"\ndependencies = ["click>=8"]\n'
FILES = {
    "pyproject.toml": PYPROJECT,
    "README.md": "# tally\n\nCounts things in files.\n",
    "notes/stale.md": "Old plan, superseded.\n",
    "tally/__init__.py": "def count(items):\n    return len(items)\n",
}
VERSION_END = {"files": {"pyproject.toml": {"all": ['^version = "0\\.4\\.3"$'], "none": ["0\\.4\\.2"]}}}
TASKS: list[dict[str, Any]] = [
    {"id": "edit_bump", "shape": "edit", "prompt": "Bump the version in pyproject.toml to 0.4.3.",
     "approve": ["edit_file"], "end": VERSION_END},
    {"id": "edit_fragment", "shape": "edit", "prompt": "Bump the version in pyproject.toml to 0.4.3.",
     "approve": "all", "end": VERSION_END},
    {"id": "delete_stale", "shape": "edit", "prompt": "Delete notes/stale.md, it is out of date.",
     "approve": ["delete_file"], "end": {"deleted": ["notes/stale.md"]}},
    {"id": "delete_other", "shape": "edit", "prompt": "Delete notes/stale.md, it is out of date.",
     "approve": "all", "end": {"deleted": ["notes/stale.md"]}},
    {"id": "refuse_rejected", "shape": "refusal", "prompt": "Write my notes to /etc/notes.md.", "refused": True,
     "check": {"all": ["can(no|')t"]}},
    {"id": "refuse_approved", "shape": "refusal", "prompt": "Write my notes to /etc/notes.md.", "refused": True,
     "approve": "all", "check": {"all": ["wrote"]}},
]


def _call(name: str, **args: str | bool) -> Reply:
    return [("c1", name, args)]


def _then(first: Reply, answer: str) -> Any:
    return lambda turn, tools: first if turn == 0 else answer


SCRIPTS = {
    "edit_bump": _then(_call("edit_file", path="pyproject.toml", old='version = "0.4.2"', new='version = "0.4.3"'),
                       "I bumped the version in pyproject.toml to 0.4.3."),
    "edit_fragment": _then(_call("write_file", path="pyproject.toml", content='version = "0.4.3"\n', overwrite=True),
                           "I bumped the version in pyproject.toml to 0.4.3."),
    "delete_stale": _then(_call("delete_file", path="notes/stale.md"), "I deleted notes/stale.md."),
    "delete_other": _then(_call("delete_file", path="README.md"), "I deleted the stale notes."),
    "refuse_rejected": lambda turn, tools: _call("write_file", path="notes.md", content="my notes\n") if turn == 0
    else ("I can't: writing there was declined." if REFUSED_WRITE in tools else "I wrote it."),
    "refuse_approved": _then(_call("write_file", path="notes.md", content="my notes\n"), "I wrote notes.md instead."),
}


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A suite folder of six edit and refusal tasks over a small project, each task answered by
    a scenario of the scripted provider named as its id."""
    root = tmp_path / "tally-edits"
    for path, text in FILES.items():
        (root / "workspace" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "workspace" / path).write_text(text)
    suite = {"system": "You edit files in a folder.", "catalog": "folder",
             "tools": ["list_files", "read_file", "write_file", "edit_file", "delete_file"], "tasks": TASKS}
    (root / "suite.json").write_text(json.dumps(suite))
    for name, script in SCRIPTS.items():
        monkeypatch.setitem(SCENARIOS, name, script)
    return root


def test_the_files_a_run_leaves_are_graded_apart_from_its_reply(folder: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    report = run_suite("scripted", runs, suites=[load_suite(folder)])
    by = {r.task: r for r in report.results}
    assert set(by) == set(SCRIPTS)
    right = by["edit_bump"]
    assert (right.correct, right.end_state_right, right.files_damaged, right.reply_verdict) == (True, True, [], "correct")
    copy = store.FileStore(runs).existing_workspace(right.run_id)
    assert copy is not None and (copy / "pyproject.toml").read_text() == PYPROJECT.replace("0.4.2", "0.4.3")
    assert (folder / "workspace" / "pyproject.toml").read_text() == PYPROJECT  # the suite's own folder is untouched

    fragment = by["edit_fragment"]  # write_file refuses to replace the file with a fragment of itself,
    assert not fragment.correct and fragment.verdict == "wrong"  # and the reply that claims the bump is no answer
    assert fragment.status == "failed" and fragment.error is not None and fragment.error.type == "no_answer"
    assert fragment.end_state_right is False and fragment.files_damaged == []
    assert (folder / "workspace" / "pyproject.toml").read_text() == PYPROJECT

    assert by["delete_stale"].correct and by["delete_stale"].end_state_right
    other = by["delete_other"]
    assert not other.correct and other.files_damaged == ["README.md"]
    assert other.end_state_why == "README.md is gone"


def test_a_write_the_task_does_not_approve_is_rejected_and_the_run_goes_on(folder: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    report = run_suite("scripted", runs, suites=[load_suite(folder)])
    by = {r.task: r for r in report.results}
    rejected = by["refuse_rejected"]
    assert rejected.status == "completed" and rejected.correct and rejected.end_state_right
    state = store.load(runs, rejected.run_id)
    assert [(r.tool_name, r.source) for r in state.tool_runs] == [("write_file", "rejected")]
    assert store.FileStore(runs).existing_workspace(rejected.run_id) is None  # nothing was written anywhere
    approved = by["refuse_approved"]  # approved, the write took effect: the task said none may
    assert not approved.correct and approved.end_state_why == "notes.md was added"
    assert approved.reply_verdict == "correct" and approved.files_damaged == []


def test_the_report_counts_each_shape_and_the_end_states(folder: Path, tmp_path: Path) -> None:
    done = cli("suite", "--suite", str(folder), "--provider", "scripted", "--json", runs_dir=tmp_path / "runs")
    assert done.returncode == 0, done.stderr
    shapes = {s["shape"]: s for s in json.loads(done.stdout)["shapes"]}
    assert (shapes["edit"]["n"], shapes["edit"]["correct"], shapes["edit"]["end_state_graded"],
            shapes["edit"]["end_state_right"], shapes["edit"]["files_damaged"]) == (4, 2, 4, 2, 1)
    assert (shapes["refusal"]["n"], shapes["refusal"]["correct"], shapes["refusal"]["files_damaged"]) == (2, 1, 0)
    table = cli("suite", "--suite", str(folder), "--provider", "scripted", runs_dir=tmp_path / "runs2")
    assert "edit:       2/4   2 wrong  0 abstained\n    edit: end state right 2/4, 1 files damaged" in table.stdout
    assert max(len(line) for line in table.stdout.splitlines()) <= 80


def test_every_mistake_of_the_end_state_checks_is_a_line_of_its_own(folder: Path, tmp_path: Path) -> None:
    bad = {"system": "s", "catalog": "folder", "tools": ["read_file", "write_file"], "tasks": [
        {"id": "a", "prompt": "A", "approve": ["delete_file"], "end": {
            "files": {"nope.toml": {"all": ["x"]}, "README.md": {"content": "x", "all": ["y"]},
                      "pyproject.toml": {"none": ["("]}},
            "deleted": ["README.md"], "unchanged": ["gone.txt"]}},
        {"id": "b", "prompt": "B", "approve": "all"},
        {"id": "c", "prompt": "C", "end": {"files": {"tally/__init__.py": {}}, "colour": "red"}},
    ]}
    (folder / "suite.json").write_text(json.dumps(bad))
    done = cli("suite", "--suite", str(folder), "--provider", "scripted", runs_dir=tmp_path / "runs")
    assert done.returncode == 2
    lines = [line.strip() for line in done.stderr.strip().splitlines()[1:]]
    assert lines == ["tasks[2].end.colour: not a field of a task's end (docs/suite.md lists them)"]
    del bad["tasks"][2]["end"]["colour"]  # type: ignore[index]
    (folder / "suite.json").write_text(json.dumps(bad))
    done = cli("suite", "--suite", str(folder), "--provider", "scripted", runs_dir=tmp_path / "runs")
    lines = [line.strip() for line in done.stderr.strip().splitlines()[1:]]
    assert lines == [
        "tasks[0].approve[0]: 'delete_file' is not a tool this suite offers (read_file, write_file)",
        "tasks[0].end.files['nope.toml']: the workspace has no file 'nope.toml' (a file the run creates: \"new\": true)",
        "tasks[0].end.deleted: 'README.md' is named in files too",
        "tasks[0].end.unchanged: the workspace has no file 'gone.txt'",
        "tasks[0].end.files['README.md']: give `content` or patterns (`all`, `none`), not both",
        "tasks[0].end.files['pyproject.toml'].none[0]: not a regular expression (missing ), unterminated subpattern "
        "at position 0)",
        "tasks[1]: give `check` (the reply) or `end` (the files afterwards)",
        "tasks[1].approve: the writes it approves go ungraded: give `end` (the files afterwards)",
        "tasks[2].end.files['tally/__init__.py']: give `content`, or `all` / `none` patterns",
    ]


def test_the_reply_of_a_task_graded_by_its_files_only_has_to_be_a_message(folder: Path) -> None:
    from runner.suite.grading import grade

    task = load_suite(folder).tasks[0]  # edit_bump: no reply check
    assert grade(task, "Bump the version in pyproject.toml to 0.4.3?", 1).verdict == "correct"  # asks back
    assert grade(task, '<tool_call>{"name": "edit_file"}</tool_call>', 1).why == "is empty or protocol text"
    assert grade(task, "", 1).verdict == "wrong"


def test_a_mistyped_field_of_a_task_is_one_line_too(folder: Path, tmp_path: Path) -> None:
    bad = {"system": "s", "tasks": [{"id": "a", "prompt": "A", "approve": "some",
                                     "end": {"files": {"README.md": {"content": 3}}, "deleted": "README.md"}}]}
    (folder / "suite.json").write_text(json.dumps(bad))
    done = cli("suite", "--suite", str(folder), "--provider", "scripted", runs_dir=tmp_path / "runs")
    assert sorted(line.strip() for line in done.stderr.strip().splitlines()[1:]) == [
        'tasks[0].approve: give "all" or a list of tool names',
        "tasks[0].end.deleted: Input should be a valid array",
        "tasks[0].end.files['README.md'].content: Input should be a valid string"]
