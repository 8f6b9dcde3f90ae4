"""No run is ever hidden by one bad byte: a property over every byte position of a real
5-turn run's journal. For each position, the byte flipped and the byte deleted: `runs` lists
every run of the store (the damaged one as `damaged`), `show` and `trace` print what they
have, and the run's state is no older than the save before the damaged record, which is what
`runner repair` rebuilds it from (repaired for a sample of positions: each line's first, middle
and last byte and its newline). Then a journal cut at every line boundary, and one of zero
bytes. In-process calls on the real FileStore: one replay per case, no process per byte."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner import render
from runner.store import FileStore
from tests.conftest import cli_json

_LINES = 13  # the header, the new run, 5 replies, 5 tool results, the stop


@dataclass(frozen=True)
class Journal:
    runs: Path
    run_id: str
    other: str
    data: bytes
    lines: list[bytes]
    seqs: list[int]
    """The seq of the record on each line (0 for the header)."""
    turns: int


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    """A folder in memory where there is one (/dev/shm): ~50,000 journal rewrites should not
    wait on a shared disk."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="runner-bytes-") as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    runs = tmp_path_factory.mktemp("bytes") / "runs"
    code, out = cli_json("run", "--scenario", "runaway", "--max-turns", "5", runs_dir=runs)
    assert code == 3 and out["turns"] == 5, out
    code, other = cli_json("run", "--scenario", "plan", runs_dir=runs)
    assert code == 0
    data = (runs / out["run_id"] / "journal.jsonl").read_bytes()
    lines = data.split(b"\n")[:-1]
    assert len(lines) == _LINES and data.endswith(b"\n")
    seqs = [json.loads(line[:-9]).get("seq", 0) for line in lines]
    return Journal(runs, out["run_id"], other["run_id"], data, lines, seqs, out["turns"])


def _floor(j: Journal, position: int) -> int:
    """The save before the record that holds `position` (the newline ending a line belongs
    to that line): what the run must be recovered to, at least."""
    line = j.data.count(b"\n", 0, position)
    return max(1, j.seqs[line - 1] if line >= 1 else 1)


def _check(j: Journal, store: FileStore, damaged: bytes, position: int, repair: bool) -> None:
    (j.runs / j.run_id / "journal.jsonl").write_bytes(damaged)
    listed = {i.state.run_id: i for i in store.list_runs()}
    assert set(listed) == {j.run_id, j.other} and store.problems == [], (position, store.problems)
    info = listed[j.run_id]
    assert info.shown_status == "damaged", (position, info.shown_status)
    assert info.state.seq >= _floor(j, position), (position, info.state.seq)
    if not repair:
        return
    assert render.transcript(info.state, store.read_trace(j.run_id), "text", 80, False, info, "")
    assert render.trace_lines(store.read_trace(j.run_id), info, 80)
    folder = j.runs / j.run_id
    kept = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    report = store.repair(j.run_id)
    assert report.kept_seq >= _floor(j, position), (position, report)
    repaired = store.info(j.run_id)
    assert repaired.shown_status in ("interrupted", "max_turns_exceeded"), (position, repaired.shown_status)
    for name in list(p.name for p in folder.iterdir()):  # back as it was, for the next position
        if name not in kept:
            (folder / name).unlink()
    for name, content in kept.items():
        (folder / name).write_bytes(content)


def _sampled(j: Journal, line: int) -> set[int]:
    start = sum(len(x) + 1 for x in j.lines[:line])
    end = start + len(j.lines[line])
    return {start, (start + end) // 2, end - 1, end}  # first, middle, last byte, the newline


@pytest.mark.parametrize("line", range(_LINES))
def test_one_flipped_or_deleted_byte_anywhere_hides_no_run(journal: Journal, line: int, tmp_path: Path) -> None:
    j = Journal(tmp_path / "runs", journal.run_id, journal.other, journal.data, journal.lines, journal.seqs,
                journal.turns)
    shutil.copytree(journal.runs, j.runs)
    store = FileStore(j.runs)
    start = sum(len(x) + 1 for x in j.lines[:line])
    sample = _sampled(j, line)
    for position in range(start, start + len(j.lines[line]) + 1):  # the line's bytes and its newline
        flipped = bytearray(j.data)
        flipped[position] ^= 0x01
        _check(j, store, bytes(flipped), position, repair=position in sample)
        _check(j, store, j.data[:position] + j.data[position + 1:], position, repair=position in sample)


def test_a_journal_cut_anywhere_or_emptied_hides_no_run(journal: Journal, tmp_path: Path) -> None:
    shutil.copytree(journal.runs, tmp_path / "runs")
    j = Journal(tmp_path / "runs", journal.run_id, journal.other, journal.data, journal.lines, journal.seqs,
                journal.turns)
    store = FileStore(j.runs)
    ends = [sum(len(x) + 1 for x in j.lines[:n]) for n in range(_LINES)]
    for cut in sorted({0, *ends, *(e - 1 for e in ends if e), *(e + 7 for e in ends)}):
        _check(j, store, j.data[:cut], cut, repair=True)
    (j.runs / j.run_id / "journal.jsonl").write_bytes(b"")
    info = store.info(j.run_id)
    assert info.shown_status == "damaged" and info.state.seq == 1  # as created: the snapshot holds it
