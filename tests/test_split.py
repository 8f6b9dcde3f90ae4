"""The development set's split holds: techniques are chosen on dev, so nothing the harness
shows a model may name what only a test workspace holds."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from runner import steering
from runner.resources import tasks_dir
from runner.steering import texts
from runner.suite import load_suite, shipped_suites

ROOT = Path(__file__).resolve().parent.parent
HARNESS_MODULES = [*(f"runner/steering/{p.name}" for p in sorted((ROOT / "runner/steering").glob("*.py"))), "runner/tools.py"]
"""Where the text the harness adds to a conversation lives (tool results and errors, the
messages it writes)."""
TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:/-]*[A-Za-z0-9]")


def _words(text: str) -> set[str]:
    """Every word, name and value of `text`, lower-cased, with each dotted or slashed part of one."""
    out = set()
    for token in TOKEN.findall(text.lower()):
        out.add(token)
        out.update(p for p in re.split(r"[@/]", token) if len(p) >= 3)
    return {w for w in out if len(w) >= 3}


MONTHS_AND_DAYS = {"january", "february", "march", "april", "may", "june", "july", "august", "september",
                   "october", "november", "december", "monday", "tuesday", "wednesday", "thursday", "friday",
                   "saturday", "sunday"}
"""Capitalised, but English words, not names a workspace holds."""


def _names_and_values(text: str) -> set[str]:
    """What identifies a workspace rather than English: tokens holding a digit or one of
    ``._@:/`` (values, file names, addresses, keys) and capitalised words (names)."""
    out = set()
    for token in TOKEN.findall(text):
        if re.search(r"[0-9._@:/]", token) or (token[0].isupper() and not token.isupper()):
            out |= _words(token)
    return out - MONTHS_AND_DAYS


def _held(folder: Path, distinctive: bool = False) -> set[str]:
    pick = _names_and_values if distinctive else _words
    words: set[str] = set()
    for path in folder.rglob("*"):
        rel = path.relative_to(folder).as_posix()
        words |= _words(rel) if distinctive else pick(rel)
        if path.is_file():
            words |= pick(path.read_text(encoding="utf-8"))
    return words


def _string_literals(path: Path) -> list[str]:
    return [node.value for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def _only_in_test() -> set[str]:
    """The file names, values and names a test workspace holds that no other workspace does."""
    dev = _held(tasks_dir() / "workspace")
    test: set[str] = set()
    for folder in shipped_suites():
        suite = load_suite(folder)
        if suite.split == "test":
            test |= _held(suite.workspace, distinctive=True)
        else:
            dev |= _held(suite.workspace)
    return test - dev


def _seen_by_models() -> dict[str, str]:
    """Everything the harness shows a model that is not a test task's own prompt, by where it comes from."""
    from runner.catalog import SIMPLE

    seen = {module: "\n".join(_string_literals(ROOT / module)) for module in HARNESS_MODULES}
    seen["tool schemas"] = json.dumps([cls().schema() for cls in SIMPLE.values()])
    seen["models/manifest.json"] = json.dumps(
        [{k: v for k, v in m.items() if k not in ("parts", "sha256", "description")}
         for m in json.loads((ROOT / "models/manifest.json").read_text())["models"]])
    for folder in [tasks_dir(), *shipped_suites()]:
        suite = load_suite(folder)
        seen[f"{suite.name}/suite.json system and tools"] = suite.system + " " + " ".join(suite.tools or [])
        if suite.split != "test":
            seen[f"{suite.name} prompts"] = "\n".join(t.prompt for t in suite.tasks)
    from runner.loop import GENERIC_TOOL_ERROR

    seen["policy texts"] = "\n".join([GENERIC_TOOL_ERROR, *steering.POLICIES.values(), *texts.CORRECTIONS.values(),
                                      texts.ASK_FOR_ANSWER, texts.ASK_WITH_RESULTS, texts.ASK_WITHOUT_RESULTS, texts.NUDGE,
                                      texts.LISTING, texts.ABSTAIN])
    return seen


def test_the_split_is_by_whole_workspace_and_about_even() -> None:
    suites = [load_suite(f) for f in shipped_suites()]
    assert {s.split for s in suites} == {"dev", "test"}
    dev = sum(len(s.tasks) for s in suites if s.split == "dev")
    test = sum(len(s.tasks) for s in suites if s.split == "test")
    assert dev + test >= 48 and len(suites) >= 6
    assert abs(dev - test) <= max(dev, test) * 0.2
    workspaces = [s.workspace.resolve() for s in suites]
    assert len(set(workspaces)) == len(workspaces)  # no workspace is in both halves


def test_nothing_the_harness_shows_names_what_only_a_test_workspace_holds() -> None:
    leaked = {where: sorted(_words(text) & _only_in_test()) for where, text in _seen_by_models().items()}
    assert not {where: words for where, words in leaked.items() if words}


def test_the_check_finds_a_leak() -> None:
    only = _only_in_test()
    assert {"bergen", "keller", "oncall@relay.example"} <= only
    assert _words("Look in itinerary.md first.") & only  # a test file's name in harness text is caught


@pytest.mark.parametrize("folder", shipped_suites(), ids=lambda p: p.name)
def test_no_answer_follows_from_the_prompt_alone(folder: Path) -> None:
    """A check's required patterns must not match the task's own prompt (an echo of the question passes no task)."""
    for task in load_suite(folder).tasks:
        for pattern in task.check.all if task.check else []:
            assert not re.search(pattern, task.prompt.lower()), (task.id, pattern)
