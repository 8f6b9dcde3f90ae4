"""Work on a folder of one's own: the folder catalog's tools, the sandbox (a copy, or the folder
itself with a verdict before every write), the ledger kept out of the user's folder, and the
demo catalog kept exactly as the six-task suite's prompt needs it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from runner import catalog
from runner.cancel import CancelToken
from runner.harness import workspace_template
from runner.state import DEFAULT_TOOLS, Endpoint, RunConfig
from runner.store import FileStore
from runner.tools import (
    MAX_LIST_ENTRIES,
    MAX_READ_CHARS,
    MAX_SEARCH_MATCHES,
    EditFile,
    FolderListFiles,
    FolderReadFile,
    ListFiles,
    ReadFile,
    ScanArchive,
    SearchFiles,
    Tool,
    ToolContext,
    ToolError,
    WriteFile,
)
from tests.conftest import cli
from tests.fakeprovider import Answer, FakeProvider, completion, tool_call

GOLDEN = Path(__file__).parent / "golden" / "demo_tool_schemas.json"


def call(tool: Tool, folder: Path, ledger: Path | None = None, key: str | None = None, **args: Any) -> str:
    ctx = ToolContext(cancel=CancelToken(), workspace=folder, ledger=ledger, idempotency_key=key)
    return asyncio.run(tool.run(tool.parse(json.dumps(args)), ctx))


# --- the demo catalog stays as the six-task suite's prompt has it ----------------------------


def test_the_demo_catalog_offers_the_same_tools_with_the_same_schemas() -> None:
    """The default catalog's names, order and schemas are those the local model's suite scores
    were measured with (frozen in tests/golden/demo_tool_schemas.json)."""
    tools = catalog.build(RunConfig(endpoint=Endpoint(model="m")))
    assert [t.name for t in tools] == list(DEFAULT_TOOLS) == ["list_files", "read_file", "delete_file", "scan_archive"]
    assert [t.schema() for t in tools] == json.loads(GOLDEN.read_text())


def test_old_arguments_give_the_packaged_workspace_as_before() -> None:
    ws = workspace_template()
    listing = "access.log (195 bytes)\nerrors.log (423 bytes)\nnotes.txt (30 bytes)"
    assert call(ListFiles(), ws) == call(FolderListFiles(), ws) == listing
    for name in ("access.log", "errors.log", "notes.txt"):
        assert call(ReadFile(), ws, path=name) == call(FolderReadFile(), ws, path=name) == (ws / name).read_text()


def test_a_run_on_a_folder_offers_the_folder_tools() -> None:
    config = RunConfig(endpoint=Endpoint(model="m"), builtin_tools="folder", tools=list(catalog.FOLDER_TOOLS))
    names = [t.name for t in catalog.build(config)]
    assert names == ["list_files", "read_file", "search_files", "write_file", "edit_file", "delete_file"]
    assert catalog.child_tools(config) == ["list_files", "read_file", "search_files"]


# --- list_files, read_file, search_files --------------------------------------------------------


@pytest.fixture
def own(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    (folder / "src" / "deep").mkdir(parents=True)
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: main\n")
    (folder / ".env").write_text("TOKEN=x\n")
    (folder / ".gitignore").write_text("build/\n*.tmp\n")
    (folder / "build").mkdir()
    (folder / "build" / "out.bin").write_bytes(b"\0" * 10)
    (folder / "scratch.tmp").write_text("temporary\n")
    (folder / "README.md").write_text("# Project\nA timeout happens here.\n")
    (folder / "src" / "app.py").write_text("def main():\n    raise TimeoutError('timed out')\n")
    (folder / "src" / "deep" / "util.py").write_text("X = 1\n")
    (folder / "src" / ".gitignore").write_text("generated.py\n")
    (folder / "src" / "generated.py").write_text("G = 2\n")
    return folder


def test_list_files_leaves_out_hidden_and_ignored_entries_unless_asked(own: Path) -> None:
    assert call(FolderListFiles(), own).splitlines() == ["README.md (34 bytes)", "src/"]
    assert call(FolderListFiles(), own, recursive=True).splitlines() == [
        "README.md (34 bytes)", "src/app.py (48 bytes)", "src/deep/util.py (6 bytes)"]
    assert call(FolderListFiles(), own, path="src").splitlines() == ["src/app.py (48 bytes)", "src/deep/"]
    every = call(FolderListFiles(), own, include_hidden=True).splitlines()
    assert {".env (8 bytes)", ".git/", "build/", "scratch.tmp (10 bytes)"} <= set(every)
    with pytest.raises(ToolError, match="no such folder: nowhere"):
        call(FolderListFiles(), own, path="nowhere")


def test_a_file_listed_or_a_folder_read_says_which_tool_fits(own: Path) -> None:
    with pytest.raises(ToolError, match=r"^README\.md is a file, not a folder: read it with read_file$"):
        call(FolderListFiles(), own, path="README.md")
    with pytest.raises(ToolError, match=r"^src/deep is a folder, not a file: list it with list_files$"):
        call(FolderReadFile(), own, path="src/deep")


def test_list_files_says_how_many_entries_it_left_out(tmp_path: Path) -> None:
    for i in range(MAX_LIST_ENTRIES + 37):
        (tmp_path / f"f{i:04d}.txt").write_text("x")
    lines = call(FolderListFiles(), tmp_path).splitlines()
    assert len(lines) == MAX_LIST_ENTRIES + 1
    assert lines[-1].startswith(f"... 37 more entries not shown ({MAX_LIST_ENTRIES} of {MAX_LIST_ENTRIES + 37} shown)")


def test_read_file_reads_a_line_range_and_says_where_it_cut(tmp_path: Path) -> None:
    (tmp_path / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    assert call(FolderReadFile(), tmp_path, path="long.txt", start_line=3, end_line=4) == (
        "line 3\nline 4\n\n[lines 3-4 of 10; 6 more lines (43 characters) not shown; read on with start_line=5]")
    assert call(FolderReadFile(), tmp_path, path="long.txt", start_line=9) == "line 9\nline 10\n"
    big = "".join(f"{i:05d} " + "y" * 94 + "\n" for i in range(1, 401))  # 400 lines of 101 characters
    (tmp_path / "big.txt").write_text(big)
    text = call(FolderReadFile(), tmp_path, path="big.txt")
    shown = MAX_READ_CHARS // 101
    assert text.endswith(f"\n\n[lines 1-{shown} of 400 (cut at the size cap); {400 - shown} more lines "
                         f"({(400 - shown) * 101} characters) not shown; read on with start_line={shown + 1}]")
    assert len(text) < MAX_READ_CHARS + 200
    with pytest.raises(ToolError, match="past its end"):
        call(FolderReadFile(), tmp_path, path="long.txt", start_line=11)
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01" * 20)
    assert call(FolderReadFile(), tmp_path, path="blob.bin") == (
        "0001" * 20 + "\n[binary file of 40 bytes, shown as hex: bytes 0-39, to its end]")


def test_search_files_gives_file_and_line_and_skips_ignored_files(own: Path) -> None:
    result = call(SearchFiles(), own, pattern=r"time[d ]?out", ignore_case=True)
    assert result.splitlines() == ["README.md:2: A timeout happens here.",
                                   "src/app.py:2: raise TimeoutError('timed out')",
                                   "(2 matches; 3 files searched)"]
    assert call(SearchFiles(), own, pattern="G = 2") == "No line matches 'G = 2' (3 files searched)."
    with pytest.raises(ToolError, match="not a regular expression"):
        call(SearchFiles(), own, pattern="(unclosed")
    assert call(SearchFiles(), own, pattern="time", ignore_case=True, path="src/app.py").splitlines() == [
        "src/app.py:2: raise TimeoutError('timed out')", "(1 match; 1 file searched)"]  # one file, by its path
    with pytest.raises(ToolError, match=r"no such file or folder: src/nope\.py"):
        call(SearchFiles(), own, pattern="time", path="src/nope.py")
    # smart case: a pattern in lower case matches any case, one with a capital only itself
    assert call(SearchFiles(), own, pattern="a timeout").splitlines()[0] == "README.md:2: A timeout happens here."
    assert call(SearchFiles(), own, pattern="A timeout").splitlines()[0] == "README.md:2: A timeout happens here."
    assert call(SearchFiles(), own, pattern="TimeoutError").startswith("src/app.py:2:")
    assert call(SearchFiles(), own, pattern="TIMEOUT").startswith("No line matches")
    assert call(SearchFiles(), own, pattern="a timeout", ignore_case=False).startswith("No line matches")


def test_search_files_caps_its_matches(tmp_path: Path) -> None:
    (tmp_path / "many.txt").write_text("hit\n" * (MAX_SEARCH_MATCHES + 5))
    lines = call(SearchFiles(), tmp_path, pattern="hit").splitlines()
    assert lines[MAX_SEARCH_MATCHES].startswith("... 5 more matches not shown")


# --- write_file, edit_file: clear errors, idempotent through a ledger outside the folder ------


def test_write_and_edit_are_idempotent_through_a_ledger_outside_the_folder(own: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "run" / "ledger.jsonl"
    said = call(WriteFile(), own, ledger, "r/c1", path="notes/todo.txt", content="a\nb\n")
    assert said == "Created notes/todo.txt (4 bytes)." and (own / "notes" / "todo.txt").read_text() == "a\nb\n"
    (own / "notes" / "todo.txt").write_text("changed by hand\n")
    assert call(WriteFile(), own, ledger, "r/c1", path="notes/todo.txt", content="a\nb\n") == said  # done already
    assert (own / "notes" / "todo.txt").read_text() == "changed by hand\n"
    edited = call(EditFile(), own, ledger, "r/c2", path="src/app.py", old="timed out", new="took too long")
    assert edited == "Edited src/app.py at line 2: replaced 9 characters with 13."
    assert call(EditFile(), own, ledger, "r/c2", path="src/app.py", old="timed out", new="took too long") == edited
    assert (own / "src" / "app.py").read_text().count("took too long") == 1
    assert [json.loads(line)["op"] for line in ledger.read_text().splitlines()] == ["write", "edit"]
    assert not [p for p in own.rglob("*") if "ledger" in p.name or p.name == ".deleted.jsonl"]


def test_edit_file_says_when_the_snippet_is_missing_or_not_unique(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x = 1\ny = 1\nx = 1\n")
    with pytest.raises(ToolError, match=r"occurs 2 times in a.txt \(at lines 1, 3\)"):
        call(EditFile(), tmp_path, path="a.txt", old="x = 1", new="x = 2")
    with pytest.raises(ToolError, match=r"does not occur in a\.txt"):
        call(EditFile(), tmp_path, path="a.txt", old="z = 1", new="z = 2")
    assert (tmp_path / "a.txt").read_text() == "x = 1\ny = 1\nx = 1\n"


# --- scan_archive reports what it read ----------------------------------------------------------


class QuickScan(ScanArchive):
    step_s = 0.001


def test_scan_archive_reports_only_the_files_it_read(own: Path) -> None:
    (own / "server.log").write_text("INFO up\nERROR disk full\nWARNING slow\nrequest timed out\n")
    text = call(QuickScan(), own)
    assert text.splitlines() == [
        "Scanned 4 files (143 bytes); lines that look like errors, warnings or timeouts:",
        "README.md: 1 timeout", "server.log: 1 error, 1 warning, 1 timeout",
        "src/app.py: 1 error, 1 timeout"]
    assert "errors.log" not in text  # never a file it did not look at
    empty = own / "src" / "deep"
    assert call(QuickScan(), empty) == (
        "Scanned 1 file (6 bytes): no line looks like an error, a warning or a timeout.")


def test_scan_archive_on_the_packaged_workspace() -> None:
    assert call(QuickScan(), workspace_template()).splitlines() == [
        "Scanned 3 files (648 bytes); lines that look like errors, warnings or timeouts:",
        "errors.log: 4 errors, 2 warnings, 2 timeouts"]


# --- a person's own question on their own folder, end to end ------------------------------------


def _writer(path: str, content: str, overwrite: bool = False) -> Any:
    """A provider that lists the folder, writes one file (`overwrite`: one that exists), then
    answers with what it listed."""

    def answer(body: dict[str, Any]) -> Answer:
        messages = body["messages"]
        asked = sum(1 for m in messages if m["role"] == "assistant")
        if asked == 0:
            return completion({"role": "assistant", "content": None,
                               "tool_calls": [tool_call("c1", "list_files", "{}")]})
        if asked == 1:
            args = json.dumps({"path": path, "content": content, **({"overwrite": True} if overwrite else {})})
            return completion({"role": "assistant", "content": None,
                               "tool_calls": [tool_call("c2", "write_file", args)]})
        listing = next(m["content"] for m in messages if m["role"] == "tool")
        return completion({"role": "assistant", "content": f"Listed: {listing}"})

    return answer


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "budget.csv").write_text("month,eur\njan,10\n")
    (mine / "letter.txt").write_text("Dear all,\n")
    return mine


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_question_works_on_the_current_folder_and_a_write_waits_for_a_verdict(folder: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    before = _files(folder)
    with FakeProvider(_writer("summary.txt", "two files\n")) as fake:
        proc = cli("run", "Summarise this folder into summary.txt", "--base-url", fake.base_url, "--model", "m",
                   "--json", runs_dir=runs, cwd=folder)
        assert proc.returncode == 3, proc.stderr
        stopped = json.loads(proc.stdout)
        assert stopped["interruption"]["tool_name"] == "write_file"
        assert _files(folder) == before  # nothing written before the verdict
        listing = fake.requests[1]["messages"][-1]["content"]
        assert listing == "budget.csv (17 bytes)\nletter.txt (10 bytes)"  # this folder, not the demo
        proc = cli("resume", stopped["run_id"], "--approve", "c2", "--json", runs_dir=runs, cwd=folder)
        assert proc.returncode == 0, proc.stderr
    assert _files(folder) == {**before, "summary.txt": "two files\n"}  # written once, and nothing of runner's
    state = FileStore(runs).load(stopped["run_id"])
    assert state.config.workspace == str(folder) and state.config.sandbox == "none"
    assert (runs / stopped["run_id"] / "ledger.jsonl").exists()


def test_sandbox_copy_leaves_the_folder_untouched_after_an_approved_write(folder: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    before = _files(folder)
    with FakeProvider(_writer("letter.txt", "overwritten\n", overwrite=True)) as fake:
        proc = cli("run", "Rewrite the letter", "--base-url", fake.base_url, "--model", "m", "--workspace",
                   str(folder), "--sandbox", "copy", "--json", runs_dir=runs)
        run_id = json.loads(proc.stdout)["run_id"]
        assert proc.returncode == 3, proc.stderr
        resumed = cli("resume", run_id, "--approve", "c2", runs_dir=runs)
        assert resumed.returncode == 0
    assert _files(folder) == before
    assert (runs / run_id / "workspace" / "letter.txt").read_text() == "overwritten\n"
    said = " ".join(resumed.stdout.split())
    assert f"the tools worked on a copy of {folder} (left unchanged): {runs / run_id / 'workspace'}" in said


def test_auto_approve_glob_lets_the_named_tools_write_without_stopping(folder: Path, tmp_path: Path) -> None:
    with FakeProvider(_writer("summary.txt", "ok\n")) as fake:
        proc = cli("run", "Summarise", "--base-url", fake.base_url, "--model", "m", "--folder", str(folder),
                   "--auto-approve", "write_*", "--json", runs_dir=tmp_path / "runs")  # --folder: --workspace's alias
    assert proc.returncode == 0, proc.stderr
    assert (folder / "summary.txt").read_text() == "ok\n"


def test_resume_refuses_in_one_line_when_the_folder_is_gone(folder: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with FakeProvider(_writer("summary.txt", "x\n")) as fake:
        proc = cli("run", "Summarise", "--base-url", fake.base_url, "--model", "m", "--workspace", str(folder),
                   "--json", runs_dir=runs)
    run_id = json.loads(proc.stdout)["run_id"]
    moved = folder.rename(tmp_path / "moved")
    proc = cli("resume", run_id, "--approve", "c2", runs_dir=runs)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and f"works on {folder}, which is gone" in proc.stderr
    with FakeProvider(_writer("summary.txt", "x\n")) as fake:  # where it is now
        proc = cli("resume", run_id, "--approve", "c2", "--workspace", str(moved), "--base-url", fake.base_url,
                   runs_dir=runs)
    assert proc.returncode == 0, proc.stderr
    assert (moved / "summary.txt").read_text() == "x\n"


def test_a_missing_workspace_is_a_usage_error(tmp_path: Path) -> None:
    proc = cli("run", "--scenario", "plan", "--workspace", str(tmp_path / "nowhere"), runs_dir=tmp_path / "runs")
    assert proc.returncode == 2 and "no such folder" in proc.stderr


def test_a_scenario_keeps_the_packaged_workspace_on_a_copy(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = cli("run", "--scenario", "plan", "--json", runs_dir=runs)
    state = FileStore(runs).load(json.loads(proc.stdout)["run_id"])
    assert state.config.workspace is None and state.config.sandbox == "copy"
    assert state.config.builtin_tools == "demo" and state.config.tools == list(DEFAULT_TOOLS)


def test_the_config_file_names_the_workspace(folder: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "runner.toml").write_text(f'workspace = "{folder}"\n')
    with FakeProvider(_writer("summary.txt", "x\n")) as fake:
        proc = cli("run", "Summarise", "--base-url", fake.base_url, "--model", "m", "--json",
                   runs_dir=tmp_path / "runs", cwd=elsewhere)
        assert fake.requests[1]["messages"][-1]["content"] == "budget.csv (17 bytes)\nletter.txt (10 bytes)"
    assert json.loads(proc.stdout)["status"] == "interrupted"


def test_suite_refuses_sandbox_none(tmp_path: Path) -> None:
    proc = cli("suite", "--provider", "scripted", "--sandbox", "none", runs_dir=tmp_path / "runs")
    assert proc.returncode == 2 and "does not go with runner suite" in proc.stderr


def test_the_runs_directory_made_in_the_folder_is_not_shown_to_the_model(folder: Path) -> None:
    """Runs kept in ./runs of the folder itself: runner marks the folder it makes as ignored
    (`.gitignore` of `*`, as venv and pytest do), and the folder tools leave it out."""
    with FakeProvider(_writer("summary.txt", "x\n")) as fake:
        proc = cli("run", "Summarise", "--base-url", fake.base_url, "--model", "m", "--json", runs_dir=None, cwd=folder)
        assert proc.returncode == 3, proc.stderr
        assert fake.requests[1]["messages"][-1]["content"] == "budget.csv (17 bytes)\nletter.txt (10 bytes)"
    assert (folder / "runs" / ".gitignore").read_text().splitlines()[-1] == "*"
    assert call(FolderListFiles(), folder, include_hidden=True).splitlines()[-1] == "runs/"
    assert "journal" not in call(SearchFiles(), folder, pattern="seq")


@pytest.mark.parametrize(("tool", "args", "error"), [
    ("delete_file", {"path": "ghost.txt"}, "no such file: ghost.txt"),
    ("edit_file", {"path": "letter.txt", "old": "Dear nobody", "new": "x"}, "does not occur in letter.txt"),
])
def test_a_write_that_could_only_fail_is_answered_with_its_error_and_not_put_to_a_person(
        folder: Path, tmp_path: Path, tool: str, args: dict[str, str], error: str) -> None:
    def answer(body: dict[str, Any]) -> Answer:
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if not results:
            return completion({"role": "assistant", "content": None,
                               "tool_calls": [tool_call("c1", tool, json.dumps(args))]})
        return completion({"role": "assistant", "content": f"It failed: {results[0]}"})

    before = _files(folder)
    with FakeProvider(answer) as fake:
        proc = cli("run", "Tidy up", "--base-url", fake.base_url, "--model", "m", "--workspace", str(folder),
                   "--json", runs_dir=tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "completed" and error in out["answer"] and out["interruption"] is None
    assert _files(folder) == before
    state = FileStore(tmp_path / "runs").load(out["run_id"])
    assert [(r.tool_name, r.ok, r.source) for r in state.tool_runs] == [(tool, False, "refused")]
    trace = [json.loads(line) for line in (tmp_path / "runs" / out["run_id"] / "trace.jsonl").read_text().splitlines()]
    assert [e["type"] for e in trace if e["type"].startswith(("tool", "approval"))] == ["tool_skipped", "tool_result"]
    skipped = next(e for e in trace if e["type"] == "tool_skipped")
    assert skipped["reason"] == "refused" and error in skipped["detail"]


def test_a_delete_of_a_file_that_exists_still_waits_for_approval(folder: Path, tmp_path: Path) -> None:
    with FakeProvider(lambda body: completion({"role": "assistant", "content": None, "tool_calls": [
            tool_call("c1", "delete_file", '{"path": "letter.txt"}')]})) as fake:
        proc = cli("run", "Tidy up", "--base-url", fake.base_url, "--model", "m", "--workspace", str(folder),
                   "--json", runs_dir=tmp_path / "runs")
    out = json.loads(proc.stdout)
    assert proc.returncode == 3 and out["interruption"]["tool_name"] == "delete_file"
    assert (folder / "letter.txt").exists()



def test_a_read_cuts_at_a_whole_line_under_the_runs_cap_on_results(tmp_path: Path) -> None:
    """A local model's runs keep results under a few thousand characters (its context is 4,096
    tokens): a long file is read in parts that say how to read on, not cut mid-line by the loop."""
    from runner.models import entry_for
    from tests.conftest import drive, scripted_run

    lines = [f"10.0.0.{i % 250} - - [04/Dec/2026:10:{i % 60:02d}] GET /item/{i} 200" for i in range(300)]
    (tmp_path / "access.log").write_text("\n".join(lines) + "\n")
    entry = entry_for("qwen2.5-coder-1.5b-instruct")
    assert entry is not None
    cap = entry.harness_defaults()["max_tool_result_chars"]
    assert cap == 3_000
    assert call(FolderReadFile(), tmp_path, path="access.log").count("\n") == 300  # no cap: whole (16 KB)

    def answer(body: dict[str, Any]) -> Answer:
        if any(m["role"] == "tool" for m in body["messages"]):
            return completion({"role": "assistant", "content": "Read it."})
        return completion({"role": "assistant", "content": None,
                           "tool_calls": [tool_call("c1", "read_file", '{"path": "access.log"}')]})

    with FakeProvider(answer) as fake:
        state = drive(scripted_run("fake", prompt="What is on the last line?", builtin_tools="folder",
                                   tools=list(catalog.FOLDER_TOOLS), workspace=str(tmp_path),
                                   max_tool_result_chars=cap), fake.base_url, None)
    result = next(m.content or "" for m in state.messages if m.role == "tool")
    body, _, marker = result.rpartition("\n[")
    shown = body.splitlines()
    assert len(result) <= cap and marker.startswith(f"lines 1-{len(shown)} of 300 (cut at the size cap); ")
    assert marker.endswith(f"; read on with start_line={len(shown) + 1}]")
    assert shown == lines[:len(shown)] and body.endswith("\n")  # whole lines only
