"""Suites are data: a folder of one's own run with `runner suite --suite DIR` (a fake provider
on loopback plays the model), its mistakes reported one per line, a subset with --task, and
answers graded correct, wrong or abstained with a Wilson interval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from runner.suite import SUITE_TOOLS, Check, Task, load_suite, shipped_suites, wilson
from runner.suite.grading import grade
from tests.conftest import cli
from tests.fakeprovider import Answer, FakeProvider, completion, error, tool_call

SUITE = {
    "name": "pantry",
    "system": "You answer questions about the files in a folder.",
    "tasks": [
        {"id": "eggs", "prompt": "How many eggs are left?", "check": {"all": [r"\b(6|six)\b"]}, "min_tool_runs": 1},
        {"id": "milk", "prompt": "Is there milk?", "check": {"all": [r"\bno\b"], "none": [r"^yes"]}},
        {"id": "owner", "prompt": "Who owns the pantry?", "check": {"absent": True, "none": ["alice"]}},
    ],
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    suite = tmp_path / "pantry"
    (suite / "workspace").mkdir(parents=True)
    (suite / "workspace" / "stock.txt").write_text("eggs: 6\nmilk: 0\n")
    (suite / "suite.json").write_text(json.dumps(SUITE))
    return suite


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    answers = {"How many eggs are left?": "There are 6 eggs left.", "Is there milk?": "The file does not mention milk.",
               "Who owns the pantry?": "The files do not say who owns the pantry."}

    def handler(body: dict[str, Any]) -> Answer:
        question = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if not any(m["role"] == "tool" for m in body["messages"]):
            return completion({"role": "assistant", "content": None,
                               "tool_calls": [tool_call("c1", "read_file", '{"path": "stock.txt"}')]})
        return completion({"role": "assistant", "content": answers[question]})

    with FakeProvider(lambda body: error(500, "unset")) as server:
        server.handler = handler
        yield server


def test_a_suite_folder_never_seen_runs_on_an_endpoint_and_is_graded(folder: Path, fake: FakeProvider,
                                                                      tmp_path: Path) -> None:
    done = cli("suite", "--suite", str(folder), "--base-url", fake.base_url, "--model", "fake", "--json",
               runs_dir=tmp_path / "runs")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [s["name"] for s in report["suites"]] == ["pantry"]
    verdicts = {r["task"]: r["verdict"] for r in report["results"]}
    assert verdicts == {"eggs": "correct", "milk": "abstained", "owner": "correct"}
    [score] = report["scores"]
    assert (score["n"], score["correct"], score["wrong"], score["abstained"]) == (3, 2, 0, 1)
    assert [t["function"]["name"] for t in fake.requests[0]["tools"]] == list(SUITE_TOOLS)
    assert all("pantry" not in (r["messages"][0]["content"] or "") for r in fake.requests)  # the runs read its files


def test_the_report_table_names_the_suite_and_the_scores(folder: Path, fake: FakeProvider, tmp_path: Path) -> None:
    done = cli("suite", "--suite", str(folder), "--base-url", fake.base_url, "--model", "fake",
               runs_dir=tmp_path / "runs")
    assert done.returncode == 0, done.stderr
    assert "runner suite pantry" in done.stdout
    assert "2/3   (67%, 21%-94%)  0 wrong  1 abstained" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


def test_task_picks_a_subset_and_an_unknown_one_is_named(folder: Path, fake: FakeProvider, tmp_path: Path) -> None:
    done = cli("suite", "--suite", str(folder), "--task", "eggs", "--base-url", fake.base_url, "--model", "fake",
               "--json", runs_dir=tmp_path / "runs")
    assert done.returncode == 0, done.stderr
    assert [r["task"] for r in json.loads(done.stdout)["results"]] == ["eggs"]
    done = cli("suite", "--suite", str(folder), "--task", "bread", "--base-url", fake.base_url, "--model", "fake",
               runs_dir=tmp_path / "runs")
    assert done.returncode == 2 and "--task bread: no such task; tasks: eggs, milk, owner" in done.stderr
    done = cli("suite", "--suite", str(folder), "--task", "egs", "--base-url", fake.base_url, "--model", "fake",
               runs_dir=tmp_path / "runs")
    assert done.returncode == 2 and "--task egs: no such task; did you mean eggs?" in done.stderr
    done = cli("suite", "--provider", "scripted", "--task", "zzz", runs_dir=tmp_path / "runs")
    assert done.returncode == 2 and "tasks: timeout_file, count_files, read_notes, read_each, largest_file, " \
        "rotate_logs" in " ".join(done.stderr.split()) and "more" not in done.stderr  # the six-task suite, whole


def test_every_mistake_of_a_suite_file_is_a_line_of_its_own(folder: Path, tmp_path: Path) -> None:
    bad = dict(SUITE, colour="red", tasks=[{"id": "a b", "prompt": "", "check": {"all": ["x"]}},
                                          {"id": "ok", "prompt": "Fine?", "check": {"all": ["yes"]}, "min_tool_runs": -1}])
    (folder / "suite.json").write_text(json.dumps(bad))
    done = cli("suite", "--suite", str(folder), "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
               runs_dir=tmp_path / "runs")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[0].endswith("suite.json has 4 mistake(s):")
    assert any(line.strip().startswith("colour: not a field") for line in lines)
    assert any(line.strip().startswith("tasks[0].id:") for line in lines)
    assert any(line.strip().startswith("tasks[0].prompt:") for line in lines)
    assert any(line.strip().startswith("tasks[1].min_tool_runs:") for line in lines)


def test_patterns_ids_and_the_workspace_are_checked_too(folder: Path, tmp_path: Path) -> None:
    bad = dict(SUITE, tools=["read_file", "rm_rf"], tasks=[
        {"id": "a", "prompt": "A?", "check": {"all": ["("]}}, {"id": "a", "prompt": "B?", "check": {}}])
    (folder / "suite.json").write_text(json.dumps(bad))
    (folder / "workspace" / "stock.txt").unlink()
    (folder / "workspace").rmdir()
    done = cli("suite", "--suite", str(folder), "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
               runs_dir=tmp_path / "runs")
    assert done.returncode == 2
    text = done.stderr
    for what in ("workspace/: there is no folder", "tools: 'rm_rf' is not a tool of the demo catalog",
                 "tasks[0].check.all[0]: not a regular expression", "tasks[1].id: 'a' is the id of an earlier task",
                 "tasks[1].check: give `all` patterns"):
        assert what in text
    done = cli("suite", "--suite", str(tmp_path / "nowhere"), runs_dir=tmp_path / "runs")
    assert done.returncode == 2 and "no such folder" in done.stderr


def test_the_scripted_provider_is_for_the_six_task_suite_only(folder: Path, tmp_path: Path) -> None:
    done = cli("suite", "--suite", str(folder), "--provider", "scripted", runs_dir=tmp_path / "runs")
    assert done.returncode == 2 and "answers only the six-task suite" in done.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything is written


def test_abstaining_is_graded_apart_from_wrong() -> None:
    task = Task(id="t", prompt="Which port?", check=Check(all=[r"\b5432\b"], none=[r"\b8080\b"]), min_tool_runs=0,
                shape="question")
    assert grade(task, "The database listens on port 5432.", 1).verdict == "correct"
    assert grade(task, "It listens on port 8080.", 1).verdict == "wrong"
    assert grade(task, "The files do not mention a port.", 1).verdict == "abstained"
    assert grade(task, "There is no information about the port in the files.", 1).verdict == "abstained"
    absent = Task(id="a", prompt="Which SMTP server?", check=Check(absent=True, none=["mail.example"]), min_tool_runs=0,
                  shape="question")
    assert grade(absent, "The configuration does not specify an SMTP server.", 1).verdict == "correct"
    assert grade(absent, "It sends mail through mail.example.", 1).verdict == "wrong"
    assert grade(absent, "The files don't mention it, but it is probably mail.example.", 1).verdict == "wrong"


def test_wilson_interval() -> None:
    low, high = wilson(10, 16)
    assert (round(low, 3), round(high, 3)) == (0.386, 0.815)
    assert wilson(0, 0) == (0.0, 1.0) and wilson(5, 5)[1] == 1.0


def test_the_shipped_suites_load_and_the_six_task_suite_is_the_default() -> None:
    suites = [load_suite(f) for f in shipped_suites()]
    assert len(suites) >= 6 and sum(len(s.tasks) for s in suites) >= 48
    six = load_suite()
    assert six.default and len(six.tasks) == 6 and six.name == "six-task"
