"""What the model sees besides the conversation: the system prompt a new run gets (the
folder's listing, leave to abstain), the tools each request offers and the narrower set its
calls must match (path choices), and a tool result's text (a table's rows named by column, its
extremes, one line for a result that repeats an earlier one).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import runner.steering.texts as texts
from runner.state import Message, RunState, ToolCall
from runner.steering.questions import COMPARES, FOLDER_QUESTION, SIZE_QUESTION, question_words
from runner.steering.registry import on
from runner.steering.turns import read_on, read_on_stall
from runner.steering.view import TABLE_FILES, View, call_label, path_of, view

TABLE_ROWS_MAX = 200
"""table_rows and table_extremes work on tables of at most this many lines (header included)."""
HINT_MAX_BYTES = 200_000
"""listing_hints reads files up to this size for the question's words (larger ones get no hint)."""
LISTING_MAX_ENTRIES = 60
"""At most this many files are listed in the system prompt (a line says how many more there are)."""
NUMBER = r"^[-+]?[$€£]?\d+(?:\.\d+)?%?$"
DATE = r"^\d{4}-\d{2}(?:-\d{2})?(?:[T ]\d{2}:\d{2}(?::\d{2})?)?$"
"""Values `table_extremes` compares: numbers (a currency sign or % allowed) and ISO dates."""


def opening(state: RunState, folder: Path | None) -> None:
    """What the policies add to a new run before it is first saved: listing_in_prompt and
    abstain_option extend the system prompt, or make one, once. Whoever saves a new run calls
    it with the folder its tools will read."""
    v = view(state)
    wanted = [name for name in ("listing_in_prompt", "abstain_option") if on(v, name)]
    if not wanted or state.turns:
        return
    if not (state.messages and state.messages[0].role == "system"):
        state.messages.insert(0, Message(role="system", content=""))
    system = state.messages[0]
    text = system.content or ""
    if "listing_in_prompt" in wanted and folder is not None and not v.prompt_listing \
            and texts.LISTING.split("{")[0] not in text:
        text += _listing_text(v, folder)
    if "abstain_option" in wanted and texts.ABSTAIN not in text:
        text += texts.ABSTAIN
    system.content = text.lstrip("\n") if not (system.content or "") else text


def _listing_text(v: View, folder: Path) -> str:
    words = question_words(v.question) if on(v, "listing_hints") else []
    extremes = on(v, "listing_extremes") and bool(SIZE_QUESTION.search(v.question))
    listing = folder_listing(folder, hints=words, extremes=extremes)
    files = len([line for line in listing.splitlines() if " bytes)" in line])
    more = listing.rsplit("... and ", 1)[-1].split(" ", 1)[0] if "... and " in listing else "0"
    count = files + int(more)
    return texts.LISTING.format(count=f"{count} file{'s' if count != 1 else ''}", listing=listing)


def folder_listing(folder: Path, max_entries: int = LISTING_MAX_ENTRIES,
                   hints: list[tuple[str, str]] | None = None, extremes: bool = False) -> str:
    """Every file under `folder` the folder tools show (hidden entries and what a `.gitignore`
    ignores left out), as ``path (N bytes)`` lines in path order, at most `max_entries`; with
    `hints`, each line says which of them the file holds; with `extremes`, a last line names
    the largest and the smallest of all the files."""
    from runner.tools import Folder

    shown = Folder(folder)
    found = sorted((path, size) for path, _, size in shown.files(shown.root))
    lines = [f"{path} ({size} bytes){_hint(folder / path, path, hints or [])}" for path, size in found[:max_entries]]
    if len(found) > max_entries:
        lines.append(f"... and {len(found) - max_entries} more files")
    if extremes and len(found) > 1:
        (small, small_size), (large, large_size) = min(found, key=_by_size), max(found, key=_by_size)
        lines.append(texts.EXTREMES.format(large=large, large_size=large_size, small=small, small_size=small_size))
    return "\n".join(lines) or "(no files)"


def _by_size(entry: tuple[str, int]) -> tuple[int, str]:
    return entry[1], entry[0]


def _hint(path: Path, name: str, words: list[tuple[str, str]]) -> str:
    """The question's words whose stem the file's name or text holds, as ``; matches a, b``."""
    if not words:
        return ""
    try:
        text = name.lower() + "\n" + (path.read_text(encoding="utf-8", errors="replace").lower()
                                      if path.stat().st_size <= HINT_MAX_BYTES else "")
    except OSError:
        return ""
    found = [word for word, stem in words if stem in text]
    return f"; matches the question's {', '.join(found)}" if found else ""


def offered_tools(state: RunState, schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``tools`` array the next request sends: `schemas` as they are, or with path_choices
    read_file's ``path`` limited to the files the system prompt lists (when it lists them all).
    The same on every request of a run, so the prompt's cached prefix holds."""
    files = _listed_files(view(state))
    return _with_paths(schemas, files) if files else schemas


def grammar_tools(state: RunState, schemas: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """With path_choices, after a review of an answer from unrelated files, or while
    related_first or read_on_stall asks for another read: read_file with its ``path`` limited
    to the listed files not read yet, sent as runner's ``grammar_tools``; None otherwise."""
    v = view(state)
    files = _listed_files(v)
    note = v.last_note
    unrelated_review = note is not None and note.kind == "review" and note.detail == "unrelated"
    if not files or not (unrelated_review or read_on(v) or read_on_stall(v)):
        return None
    unread = set(v.unread)
    if not (narrower := [f for f in files if f in unread]):
        return None
    return [s for s in _with_paths(schemas, narrower) if v.role(s.get("function", {}).get("name", "")) == "read"]


def _listed_files(v: View) -> list[str]:
    """With path_choices, the files the system prompt lists, when it lists them all; else []."""
    return [path for path, _ in v.prompt_listing] if on(v, "path_choices") else []


def _with_paths(schemas: list[dict[str, Any]], files: list[str]) -> list[dict[str, Any]]:
    """`schemas` with the string ``path`` of runner's read tool limited to `files`."""
    out = []
    for schema in schemas:
        function = schema.get("function", {})
        path = function.get("parameters", {}).get("properties", {}).get("path")
        if function.get("name") == "read_file" and isinstance(path, dict) and path.get("type") == "string":
            parameters = function["parameters"]
            schema = {**schema, "function": {**function, "parameters": {
                **parameters, "properties": {**parameters["properties"], "path": {**path, "enum": files}}}}}
        out.append(schema)
    return out


def tool_result_text(state: RunState, call: ToolCall, text: str, signature: str) -> str:
    """The text the model reads for a successful call's result: `text`, with table_rows and
    table_extremes followed by a table's rows named by column and its columns' extremes; with
    repeat_results, one line pointing to an earlier call with the same signature whose result
    read the same."""
    v = view(state)
    rows = _read_table(v, call, text) if (on(v, "table_rows") or on(v, "table_extremes")) else None
    if rows is not None:
        text = _table_extremes(v, rows, _table_rows(v, rows, text))
    if on(v, "repeat_results") and _same_as_before(v, signature, text):
        return texts.REPEATED_RESULT.format(call=call_label(call))
    return text


def _same_as_before(v: View, signature: str, text: str) -> bool:
    """An earlier successful call with this signature got `text` (as capped) as its result."""
    from runner.tools import cap_text

    earlier = {r.call_id for r in v.state.tool_runs if r.ok and r.signature == signature}
    shown = cap_text(text, v.state.config.max_tool_result_chars)[0]
    return any(m.role == "tool" and m.tool_call_id in earlier and m.content == shown for m in v.messages)


def _table_rows(v: View, rows: list[list[str]], text: str) -> str:
    """With table_rows, `text` followed by the same rows with each value named by its column."""
    if not on(v, "table_rows"):
        return text
    named = ["; ".join(f"{column}={value}" for column, value in zip(rows[0], row)) for row in rows[1:]]
    return text.rstrip("\n") + texts.TABLE_ROWS + "\n".join(named)


def _table_extremes(v: View, rows: list[list[str]], text: str) -> str:
    """With table_extremes and a question that compares, `text` followed by a line per column of
    numbers or ISO dates (ids left out; blank cells skipped): its highest and lowest value and
    every row holding each, the other values named by column; else `text`."""
    asked = v.question
    if not on(v, "table_extremes") or not COMPARES.search(asked) or FOLDER_QUESTION.search(asked):
        return text  # a question that compares the files themselves (the largest file) is not about rows
    header, body = rows[0], rows[1:]
    lines = []
    for i, column in enumerate(header):
        values = [value for row in body if (value := row[i].strip())]  # a blank cell holds no value
        key = _comparable(column, values)
        if key is None:
            continue
        high, low = max(values, key=key), min(values, key=key)
        lines.append(texts.EXTREME_ROW.format(column=column, high=high, low=low,
                                              high_rows=_rows_holding(header, body, i, high, key),
                                              low_rows=_rows_holding(header, body, i, low, key)))
    if not lines:
        return text
    return text.rstrip("\n") + texts.TABLE_EXTREMES.format(count=len(body)) + "\n".join(lines)


def _comparable(column: str, values: list[str]) -> Callable[[str], Any] | None:
    """How to order a column's values: as numbers, or as ISO dates (text order); None for an id
    column, one of text, or one whose values are all the same."""
    import re

    name = column.strip().lower()
    if name == "id" or name.endswith(("_id", " id")) or len(set(values)) < 2:
        return None
    if all(re.match(NUMBER, v) for v in values):
        return lambda v: float(v.strip("$€£%"))
    if all(re.match(DATE, v) for v in values):
        return str
    return None


def _rows_holding(header: list[str], body: list[list[str]], column: int, value: str, key: Callable[[str], Any]) -> str:
    """The rows whose `column` orders equal to `value`, each as its other values named by column."""
    return " | ".join("; ".join(f"{h}={v}" for j, (h, v) in enumerate(zip(header, row)) if j != column and v.strip())
                      for row in body if row[column].strip() and key(row[column].strip()) == key(value))


def _read_table(v: View, call: ToolCall, text: str) -> list[list[str]] | None:
    """A CSV or TSV file's text read whole by runner's read tool as rows (the header first), or
    None when the call read no such file, or the text is not a table of at most
    `TABLE_ROWS_MAX` lines, each with as many values as the header (two or more)."""
    path = (path_of(call) or "").lower()
    if v.role(call.function.name) != "read" or not path.endswith(TABLE_FILES):
        return None
    rows = [row for row in csv.reader(text.splitlines(), delimiter="\t" if path.endswith(".tsv") else ",") if row]
    if len(rows) < 2 or len(rows) > TABLE_ROWS_MAX or len(rows[0]) < 2 or any(len(r) != len(rows[0]) for r in rows):
        return None
    return rows
