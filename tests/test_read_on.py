"""No read cut without saying so: every tool result runner shortens ends with one line saying
what it left out and how to read on, a single long line and a binary file included; read on
to the end, the parts join up to the file byte for byte."""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from runner.cancel import CancelToken
from runner.tools import (
    BINARY_PEEK_BYTES,
    MAX_READ_CHARS,
    FolderReadFile,
    ReadFile,
    Tool,
    ToolContext,
    ToolError,
    cap_text,
)
from tests.fakeprovider import Answer, FakeProvider, completion, tool_call

READ_ON = re.compile(r"read on with (?:start_line=(\d+))?(?:, )?(?:offset=(\d+))?\]$")


def read(tool: Tool, folder: Path, max_chars: int | None = None, **args: Any) -> str:
    ctx = ToolContext(cancel=CancelToken(), workspace=folder, max_chars=max_chars)
    return asyncio.run(tool.run(tool.parse(json.dumps(args)), ctx))


def read_to_the_end(tool: Tool, folder: Path, path: str, max_chars: int | None = None,
                    first: dict[str, Any] | None = None) -> tuple[bytes, list[str]]:
    """Every part of the file as the tool gives it, following each result's read-on line to the
    end: the parts joined (as bytes: text as UTF-8, hex as bytes), and the results' last lines."""
    args: dict[str, Any] = first or {}
    parts: list[bytes] = []
    markers: list[str] = []
    for _ in range(100_000):
        result = read(tool, folder, max_chars, path=path, **args)
        if max_chars is not None:
            assert len(result) <= max_chars
        body, _, marker = result.rpartition("\n[")
        if not _ or "\n" in marker or not marker.endswith("]"):  # no read-on line: the rest of the file
            parts.append(result.encode())
            return b"".join(parts), markers
        markers.append(marker)
        parts.append(bytes.fromhex(body) if marker.startswith("binary file") else body.encode())
        found = READ_ON.search(marker)
        if found is None:  # a binary file read to its end
            assert marker.endswith("to its end]"), marker
            return b"".join(parts), markers
        start, offset = found.groups()
        args = {k: int(v) for k, v in (("start_line", start), ("offset", offset)) if v is not None}
    raise AssertionError("the reads never reached the end")


@pytest.fixture
def files(tmp_path: Path) -> Path:
    rng = random.Random(54)
    folder = tmp_path / "files"
    folder.mkdir()
    record = '{"id": %d, "name": "item-%d", "tags": ["a", "b"], "ok": true}, '
    line = "[" + "".join(record % (i, i) for i in range(1_700))
    (folder / "minified.json").write_text(line[:100_000 - 1] + "]")  # one line of 100 KB, no line break
    log = "".join(f"2026-12-06T02:{i % 60:02d}:00 worker {i % 17} handled request {i} in {rng.randint(1, 999)} ms\n"
                  for i in range(140_000))
    long_lines = "".join("x" * 40_000 + f" end of long line {i}\n" for i in range(5))
    big = (log[:5_000_000] + long_lines + log[5_000_000:])
    (folder / "big.log").write_text(big[:10_000_000 - 3] + "\r\n.")  # 10 MB, a CRLF and no final break
    (folder / "multibyte.txt").write_text("Grüße, 世界! 🎉 naïve café — ünïcödé ✓ 😀😀 " * 2_000)
    blob = bytes(rng.randrange(256) for _ in range(70_000))
    (folder / "blob.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" + blob)
    return folder


NAMES = ["minified.json", "big.log", "multibyte.txt", "blob.bin"]


@pytest.mark.parametrize("name", NAMES)
def test_the_folder_read_read_on_to_the_end_joins_up_to_the_file(files: Path, name: str) -> None:
    joined, markers = read_to_the_end(FolderReadFile(), files, name)
    assert joined == (files / name).read_bytes()
    assert markers and all(re.search(r"(not shown|left); read on with|to its end]$", m) for m in markers)


@pytest.mark.parametrize("name", ["minified.json", "multibyte.txt", "blob.bin"])
def test_the_demo_read_reads_on_with_the_offset_its_last_line_names(files: Path, name: str) -> None:
    joined, markers = read_to_the_end(ReadFile(), files, name)
    assert joined == (files / name).read_bytes() and markers


@pytest.mark.parametrize("name", ["minified.json", "multibyte.txt", "blob.bin"])
def test_under_a_local_models_cap_every_part_fits_and_they_still_join_up(files: Path, name: str) -> None:
    joined, markers = read_to_the_end(FolderReadFile(), files, name, max_chars=3_000)
    assert joined == (files / name).read_bytes() and len(markers) > 10


def test_a_single_line_of_100_kb_is_cut_with_the_characters_left_and_read_on_inside_it(files: Path) -> None:
    first = read(FolderReadFile(), files, path="minified.json")
    body, _, marker = first.rpartition("\n[")
    assert len(body) == MAX_READ_CHARS and len(first) <= MAX_READ_CHARS + 200
    assert marker == (f"line 1 of 1 cut at the size cap: characters 1-{MAX_READ_CHARS} of its 100000 shown, "
                      f"{100_000 - MAX_READ_CHARS} left; read on with start_line=1, offset={MAX_READ_CHARS}]")
    second = read(FolderReadFile(), files, path="minified.json", start_line=1, offset=MAX_READ_CHARS)
    assert second.startswith((files / "minified.json").read_text()[MAX_READ_CHARS:MAX_READ_CHARS + 100])
    with pytest.raises(ToolError, match="offset 100000 is past its end"):
        read(FolderReadFile(), files, path="minified.json", offset=100_000)


def test_a_cut_inside_a_line_falls_between_characters(files: Path) -> None:
    data = (files / "multibyte.txt").read_bytes()
    text = data.decode()
    for cap in range(1_000, 1_040):  # caps whose byte count would fall inside a character, and others
        shown = read(FolderReadFile(), files, max_chars=cap + 200, path="multibyte.txt")
        body = shown.rpartition("\n[")[0]
        assert body == text[:cap] and data.startswith(body.encode())  # whole characters, however many bytes each
    assert any(data[n] & 0xC0 == 0x80 for n in range(1_000, 1_040))  # a cut by bytes there would split one


def test_line_reads_keep_their_line_and_say_how_many_lines_and_characters_are_left(tmp_path: Path) -> None:
    (tmp_path / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    assert read(FolderReadFile(), tmp_path, path="long.txt", start_line=3, end_line=4) == (
        "line 3\nline 4\n\n[lines 3-4 of 10; 6 more lines (43 characters) not shown; read on with start_line=5]")
    assert read(FolderReadFile(), tmp_path, path="long.txt", start_line=9) == "line 9\nline 10\n"
    assert read(FolderReadFile(), tmp_path, path="long.txt", start_line=2, offset=3) == "e 2\n" + "".join(
        f"line {i}\n" for i in range(3, 11))


def test_a_binary_file_is_shown_as_hex_from_its_first_bytes(files: Path) -> None:
    shown = read(FolderReadFile(), files, path="blob.bin")
    body, _, marker = shown.rpartition("\n[")
    assert body.startswith("89504e470d0a1a0a0000") and len(body) == 2 * BINARY_PEEK_BYTES
    assert marker == (f"binary file of 70010 bytes, shown as hex: bytes 0-{BINARY_PEEK_BYTES - 1}; "
                      f"{70_010 - BINARY_PEEK_BYTES} bytes left; read on with offset={BINARY_PEEK_BYTES}]")
    with pytest.raises(ToolError, match=r"binary file .* it has no lines"):
        read(FolderReadFile(), files, path="blob.bin", start_line=2)


def test_the_folder_read_documents_its_offset_and_the_demo_schema_stays_as_measured() -> None:
    folder_read = FolderReadFile().schema()["function"]
    assert "offset" in folder_read["parameters"]["properties"] and "offset" in folder_read["description"]
    assert list(ReadFile().schema()["function"]["parameters"]["properties"]) == ["path"]


def test_the_runs_cap_leaves_one_line_saying_what_it_left_out() -> None:
    text = "é" * 50_000
    capped, omitted = cap_text(text, 20_000)
    body, _, marker = capped.rpartition("\n[")
    assert len(capped) == 20_000 and body == text[:len(body)] and omitted == 50_000 - len(body)
    assert marker.startswith(f"cut: characters 1-{len(body)} of 50000 shown, {omitted} left out; ")
    assert cap_text("short", 20_000) == ("short", 0)


class Dump(Tool):
    """A tool of one's own that returns more than a run keeps."""

    name = "dump"
    description = "Dump the database."
    read_only = True

    def run_sync(self, args: Any, ctx: ToolContext) -> str:
        return "".join(f"row {i}: {'ü' * 40}\n" for i in range(2_000))


def test_a_result_of_ones_own_tool_cut_by_the_runs_cap_says_so_once(tmp_path: Path) -> None:
    from tests.conftest import drive, scripted_run

    def answer(body: dict[str, Any]) -> Answer:
        if any(m["role"] == "tool" for m in body["messages"]):
            return completion({"role": "assistant", "content": "Dumped."})
        return completion({"role": "assistant", "content": None, "tool_calls": [tool_call("c1", "dump", "{}")]})

    config = scripted_run("fake", prompt="Dump it.", max_tool_result_chars=5_000)
    with FakeProvider(answer) as fake:
        state = drive(config, fake.base_url, tmp_path / "runs", tools=[Dump()])
    result = next(m.content or "" for m in state.messages if m.role == "tool")
    full = Dump().run_sync(None, ToolContext(cancel=CancelToken(), workspace=tmp_path))
    assert len(result) <= 5_000 and result.count("\n[") == 1
    body, _, marker = result.rpartition("\n[")
    assert full.startswith(body) and f"of {len(full)} shown, {len(full) - len(body)} left out;" in marker
    trace = [json.loads(line) for line in (tmp_path / "runs" / state.run_id / "trace.jsonl").read_text().splitlines()]
    assert [e.get("omittedChars") for e in trace if e["type"] == "tool_result"] == [len(full) - len(body)]


def test_a_search_match_cut_to_a_line_says_so_and_how_to_see_it_whole(files: Path) -> None:
    from runner.tools import MAX_LINE_CHARS, SearchFiles

    found = read(SearchFiles(), files, pattern='"id": 0,', path="minified.json").splitlines()
    assert found[0].startswith('minified.json:1: [{"id": 0,') and found[0].endswith(" ...")
    assert len(found[0]) == len("minified.json:1: ") + MAX_LINE_CHARS + len(" ...")
    assert found[-1] == (f"(1 match; 1 file searched; 1 line cut at {MAX_LINE_CHARS} characters (...): read_file "
                         "with its start_line shows it whole)")
