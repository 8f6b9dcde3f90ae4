"""Writes that cannot destroy a file, and a result that says what they did: write_file replaces
a file only when told to overwrite it; a write waits for approval showing the diff it would
make; edit_file points at the closest text when its `old` is not found; the run's result lists
the writes done, refused and failed, and a run whose writes were all refused says nothing was
written."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from runner.cancel import CancelToken
from runner.tools import EditFile, Tool, ToolContext, ToolError, WriteFile, change_preview
from tests.conftest import cli
from tests.fakeprovider import Answer, FakeProvider, completion, tool_call

PYPROJECT = "".join([
    "[project]\n", 'name = "tidy"\n', 'version = "0.4.2"\n', 'description = "Tidy up folders"\n',
    'requires-python = ">=3.10"\n', "dependencies = [\n", '    "click>=8",\n', "]\n", "\n",
    "[project.scripts]\n", 'tidy = "tidy.cli:main"\n', "\n",
])


def call(tool: Tool, folder: Path, **args: Any) -> str:
    ctx = ToolContext(cancel=CancelToken(), workspace=folder, ledger=folder.parent / "ledger.jsonl",
                      idempotency_key=f"r/{len(args)}/{sorted(args.items())}")
    return asyncio.run(tool.run(tool.parse(json.dumps(args)), ctx))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    (folder / "tidy").mkdir(parents=True)
    (folder / "pyproject.toml").write_text(PYPROJECT)
    (folder / "tidy" / "cli.py").write_text("def main():\n\tprint('tidy')\n")
    return folder


def test_write_file_replaces_a_file_only_when_told_to_overwrite_it(project: Path) -> None:
    with pytest.raises(ToolError) as refused:
        call(WriteFile(), project, path="pyproject.toml", content="version = '0.4.3'")
    assert str(refused.value) == ('pyproject.toml exists (179 bytes) and write_file would replace all of it. To '
                                  'change part of it, use edit_file; to replace it, call write_file again with '
                                  '"overwrite": true.')
    assert (project / "pyproject.toml").read_text() == PYPROJECT
    assert call(WriteFile(), project, path="new.txt", content="a\n") == "Created new.txt (2 bytes)."
    assert call(WriteFile(), project, path="new.txt", content="b\n", overwrite=True) == "Replaced new.txt (2 bytes)."
    assert "overwrite" in WriteFile().schema()["function"]["parameters"]["properties"]


def test_a_change_preview_is_a_unified_diff_with_its_counts() -> None:
    bumped = PYPROJECT.replace("0.4.2", "0.4.3")
    preview = change_preview("pyproject.toml", PYPROJECT, bumped, edit=True)
    assert (preview.action, preview.removed_lines, preview.added_lines) == ("edit", 1, 1)
    assert preview.diff.splitlines()[:3] == ["--- a/pyproject.toml", "+++ b/pyproject.toml", "@@ -1,6 +1,6 @@"]
    assert '-version = "0.4.2"' in preview.diff.splitlines() and '+version = "0.4.3"' in preview.diff.splitlines()
    fragment = change_preview("pyproject.toml", PYPROJECT, "version = '0.4.3'")
    assert (fragment.action, fragment.removed_lines, fragment.added_lines) == ("replace", 12, 1)
    assert fragment.diff.endswith("+version = '0.4.3'\n\\ No newline at end of file")
    created = change_preview("new.txt", None, "a\nb\n")
    assert (created.action, created.removed_lines, created.added_lines) == ("create", 0, 2)
    assert created.diff.startswith("--- /dev/null\n+++ b/new.txt")
    long = change_preview("big.txt", "".join(f"{i}\n" for i in range(500)), "")
    assert long.removed_lines == 500 and long.diff.endswith("more lines of the diff")


def test_edit_file_points_at_the_closest_text_when_old_is_not_found(project: Path) -> None:
    with pytest.raises(ToolError) as quotes:
        call(EditFile(), project, path="pyproject.toml", old="version = '0.4.2'", new="version = '0.4.3'")
    assert str(quotes.value) == ("the text of old does not occur in pyproject.toml. The closest text is at line 3; "
                                 "copy it exactly (quotes, spaces and line breaks included) into old:\n"
                                 'version = "0.4.2"')
    with pytest.raises(ToolError, match=r"at lines 1-2 \(it differs only in spaces, tabs or line breaks\).*\n"
                                        r"def main\(\):\n\tprint\('tidy'\)$"):
        call(EditFile(), project, path="tidy/cli.py", old="def main():\n    print('tidy')", new="x")
    with pytest.raises(ToolError, match=r"does not occur in pyproject\.toml; read_file it and copy the exact text"):
        call(EditFile(), project, path="pyproject.toml", old="something else entirely, nothing alike", new="x")


def _model(*steps: tuple[str, dict[str, Any]] | str, asked_again: str | None = None) -> Any:
    """A model that makes the calls `steps` names one turn each (a str: its answer), whatever
    the tools said; asked for an answer alone (tool_choice "none"), it says `asked_again` (None:
    its last step)."""
    def answer(body: dict[str, Any]) -> Answer:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        step = steps[min(turn, len(steps) - 1)]
        if body.get("tool_choice") == "none":
            step = asked_again or steps[-1]
        if isinstance(step, str):
            return completion({"role": "assistant", "content": step})
        name, args = step
        return completion({"role": "assistant", "content": None,
                           "tool_calls": [tool_call(f"c{turn + 1}", name, json.dumps(args))]})
    return answer


def test_a_rejected_write_changes_nothing_and_the_result_says_so(project: Path, tmp_path: Path) -> None:
    """The bump-the-version prompt, in place with approval: a fragment written without overwrite
    is refused at once, and so is the same fragment with overwrite (it would drop most of the
    file); the edit is put to the person with its one-line diff; rejected, the run says nothing
    was written, and the model's answer that it bumped the version gets one more request, then
    fails the run."""
    runs = tmp_path / "runs"
    fragment = {"path": "pyproject.toml", "content": "version = '0.4.3'"}
    model = _model(("write_file", fragment), ("write_file", {**fragment, "overwrite": True}),
                   ("edit_file", {"path": "pyproject.toml", "old": 'version = "0.4.2"', "new": 'version = "0.4.3"'}),
                   "I bumped the version to 0.4.3.")
    with FakeProvider(model) as fake:
        first = cli("run", "Bump the version in pyproject.toml from 0.4.2 to 0.4.3.", "--base-url", fake.base_url,
                    "--model", "m", "--workspace", str(project), runs_dir=runs)
        assert first.returncode == 3, first.stderr
        said = " ".join(first.stdout.split())
        assert "waiting for approval: edit_file(" in said and "call id c3" in said
        assert "edit pyproject.toml: 1 lines removed, 1 added" in said
        assert '+version = "0.4.3"' in said and '-version = "0.4.2"' in said
        assert ("writes: nothing written; 2 refused (write_file pyproject.toml: pyproject.toml exists (179 bytes) "
                "and write_file would replace all of it; write_file pyproject.toml: write_file would replace "
                "pyproject.toml (10 lines) with 1 line(s), keeping 0 of its lines: that drops most of the file)") in said
        run_id = next(line.split()[-1] for line in first.stdout.splitlines() if "run id:" in line)
        shown = cli("show", run_id, runs_dir=runs).stdout
        assert "edit pyproject.toml: 1 lines removed, 1 added" in shown
        third = cli("resume", run_id, "--reject", "c3", "--reason", "not now", "--json", runs_dir=runs)
    assert third.returncode == 1, third.stderr
    result = json.loads(third.stdout)
    assert (project / "pyproject.toml").read_text() == PYPROJECT
    assert result["status"] == "failed" and result["error"]["type"] == "no_answer" and result["files_changed"] == []
    assert "says a file was changed, and no write was made (write_file pyproject.toml" in result["reason"]
    assert [(w["call_id"], w["tool"], w["path"], w["outcome"]) for w in result["writes"]] == [
        ("c1", "write_file", "pyproject.toml", "refused"), ("c2", "write_file", "pyproject.toml", "refused"),
        ("c3", "edit_file", "pyproject.toml", "refused")]
    assert "declined by the user: not now" in result["writes"][2]["detail"]
    asked = fake.requests[-1]
    assert asked["tool_choice"] == "none" and "declined" in asked["messages"][-1]["content"]


def test_an_approved_edit_is_listed_as_done_with_the_file_it_changed(project: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    model = _model(("edit_file", {"path": "pyproject.toml", "old": 'version = "0.4.2"', "new": 'version = "0.4.3"'}),
                   "Bumped.")
    with FakeProvider(model) as fake:
        first = cli("run", "Bump the version.", "--base-url", fake.base_url, "--model", "m", "--workspace",
                    str(project), "--json", runs_dir=runs)
        run_id = json.loads(first.stdout)["run_id"]
        done = cli("resume", run_id, "--approve", "c1", "--json", runs_dir=runs)
    result = json.loads(done.stdout)
    assert (project / "pyproject.toml").read_text() == PYPROJECT.replace("0.4.2", "0.4.3")
    assert result["files_changed"] == ["pyproject.toml"]
    assert [(w["outcome"], w["detail"]) for w in result["writes"]] == [
        ("done", "Edited pyproject.toml at line 3: replaced 17 characters with 17.")]


def test_an_answer_that_says_the_write_was_declined_is_taken(project: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    edit = {"path": "pyproject.toml", "old": 'version = "0.4.2"', "new": 'version = "0.4.3"'}
    model = _model(("edit_file", edit), "I updated the version to 0.4.3.",
                   asked_again="The version was not changed: you declined the edit.")
    with FakeProvider(model) as fake:
        first = cli("run", "Bump the version in pyproject.toml to 0.4.3.", "--base-url", fake.base_url,
                    "--model", "m", "--workspace", str(project), runs_dir=runs)
        run_id = next(line.split()[-1] for line in first.stdout.splitlines() if "run id:" in line)
        done = cli("resume", run_id, "--reject", "c1", "--json", runs_dir=runs)
    result = json.loads(done.stdout)
    assert result["status"] == "completed" and result["answer"] == "The version was not changed: you declined the edit."
    assert result["files_changed"] == [] and (project / "pyproject.toml").read_text() == PYPROJECT
