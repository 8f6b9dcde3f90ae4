"""Text fitted to a terminal: tables whose text columns share the width that is left (ids and
numbers never cut, text cut with "…"), lines on stderr (`say`, `error`, `wrap`), and the live
lines a run and a pull redraw there.

`print_table` fits every table to the console (80 columns when piped, or `$COLUMNS`).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
import time
from typing import Any


def console() -> Any:
    """A rich console for stdout: the terminal's width, else $COLUMNS, else 80 when piped.
    Tables shorten their text columns to fit and never wrap a number (`--json` has it all)."""
    from rich.console import Console

    return Console()


def terminal_width() -> int:
    """The terminal's width in columns ($COLUMNS, else 80 when piped)."""
    return shutil.get_terminal_size((80, 24)).columns


def stderr_width() -> int | None:
    """The width lines on stderr wrap to: its terminal's ($COLUMNS when set, at least 40);
    None when stderr is not a terminal (a file, a pipe): there a message stays on one line,
    whole for grep and for logs."""
    if not sys.stderr.isatty():
        return None
    given = os.environ.get("COLUMNS", "")
    try:
        columns = int(given) if given.isdigit() else os.get_terminal_size(sys.stderr.fileno()).columns
    except OSError:
        columns = 80
    return max(columns or 80, 40)


def error(message: str) -> None:
    """An error on stderr as "error: MESSAGE", each line as `wrap` gives it (not wrapped when
    stderr is no terminal); a line break in the message starts a new paragraph, indented two
    columns."""
    for i, part in enumerate(f"error: {message}".splitlines() or [""]):
        print(wrap(part if i == 0 else "  " + part), file=sys.stderr, flush=True)


def say(line: str) -> None:
    """One line on stderr (progress and notices; stdout carries the result)."""
    print(line, file=sys.stderr, flush=True)


def wrap(line: str, width: int | None = None) -> str:
    """`line` unchanged if it fits in `width` columns (default: stderr's, see `stderr_width`;
    unchanged when stderr is no terminal), else wrapped to it with continuation lines indented
    two columns (a word longer than the width, a path or a URL, stays whole)."""
    width = width or stderr_width()
    if width is None or len(line) <= width:
        return line
    indent = " " * (len(line) - len(line.lstrip(" ")))
    return textwrap.fill(line, width, initial_indent="", subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False)


def print_table(columns: list[tuple[str, str]], rows: list[list[str]]) -> None:
    """Print a compact table that fits the console. Each column is (header, kind): "id" and
    "num" cells are never cut or wrapped; "text" columns share the width that is left, each
    taking no more than its longest cell needs so the others get the rest, cut at the end
    with "…" ("path": cut at the start, where names differ least), and the rightmost goes
    first when one would get fewer than 8 characters it needs. When the whole cells still do
    not fit, the other columns go too, rightmost first; the first column (a row's id) always
    stays, whole, even wider than the console."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    def build(keep: list[int], widths: dict[int, int]) -> Table:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0), collapse_padding=True)
        for i in keep:
            header, kind = columns[i]
            table.add_column(header, no_wrap=True, width=widths.get(i), justify="right" if kind == "num" else "left")
        for row in rows:
            table.add_row(*(cut(row[i], widths.get(i, len(row[i])), columns[i][1]) for i in keep))
        return table

    def width_of(table: Table) -> int:
        probe = Console(file=io.StringIO(), width=10_000)
        probe.print(table)
        return max(len(line.rstrip()) for line in probe.file.getvalue().splitlines())  # type: ignore[attr-defined]

    need = {i: max([len(columns[i][0]), *(len(row[i]) for row in rows)]) for i in range(len(columns))}

    def shared(texts: list[int], room: int) -> dict[int, int]:
        """`room` columns over `texts`, the narrowest needs served first."""
        widths: dict[int, int] = {}
        for n, i in enumerate(sorted(texts, key=need.__getitem__)):
            widths[i] = max(1, min(need[i], room // (len(texts) - n)))
            room -= widths[i]
        return widths

    out = console()
    keep = list(range(len(columns)))
    widths: dict[int, int] = {}
    while True:
        texts = [i for i in keep if columns[i][1] in ("text", "path")]
        if not texts:
            break
        widths = shared(texts, out.width - width_of(build(keep, dict.fromkeys(texts, 1))) + len(texts))
        if all(widths[i] >= min(8, need[i]) for i in texts):
            break
        keep.remove(texts[-1])
    while len(keep) > 1 and width_of(build(keep, widths)) > out.width:
        keep.pop()
    out.width = max(out.width, width_of(build(keep, widths)))  # one id wider than the console: whole
    print_unpadded(out, build(keep, widths))


def cut(cell: str, share: int, kind: str = "text") -> str:
    """`cell` in at most `share` characters: "text" cut at the end with "…", "path" at the
    start (where names differ least); other kinds are never cut."""
    if kind not in ("text", "path") or len(cell) <= share:
        return cell
    if share <= 1:
        return "…"
    return "…" + cell[-(share - 1):] if kind == "path" else cell[: share - 1] + "…"


class TurnLine:
    """The live per-turn line on stderr: turn N, elapsed, tokens so far and the
    reply's tail, redrawn as chunks stream in on a terminal (one line, fitted to its width);
    elsewhere one line per finished turn. `close()` ends a line left open by a turn that
    failed or was interrupted, so what is printed next starts on a line of its own."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.width = terminal_width()
        self.drawn_at = 0.0
        self.open = False

    def __call__(self, p: Any) -> None:
        head = f"  turn {p.turn:<2} {p.elapsed_ms / 1000:5.1f} s  {p.tokens:>4} tokens"
        room = self.width - len(head) - 5  # one line, or the \r redraw leaves wrapped rows behind
        text = " ".join(p.text.split())
        tail = ("…" + text[-(room - 1):] if len(text) > room else text) if room > 8 else ""
        line = head + (f'  "{tail}"' if tail else "")
        if not self.tty:
            if p.done:
                print(line, file=sys.stderr, flush=True)
            return
        now = time.perf_counter()
        if p.done or now - self.drawn_at >= 0.1:
            self.drawn_at = now
            sys.stderr.write("\r\x1b[2K" + line + ("\n" if p.done else ""))
            sys.stderr.flush()
            self.open = not p.done

    def close(self) -> None:
        if self.open:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.open = False


class PullLine:
    """Progress of a parts pull on stderr: one redrawn line on a terminal, else a line per part."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.label = ""
        self.drawn_at = 0.0

    def __call__(self, done_bytes: int, total_bytes: int, label: str) -> None:
        line = f"  {done_bytes / 1e6:7.0f} of {total_bytes / 1e6:.0f} MB  {label}"
        if not self.tty:
            if not label.startswith("unpacking"):
                print(line, file=sys.stderr, flush=True)
            return
        now = time.perf_counter()
        if label != self.label or now - self.drawn_at >= 0.2:
            self.label, self.drawn_at = label, now
            sys.stderr.write("\r\x1b[2K" + line[: terminal_width() - 1])
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty and self.label:
            sys.stderr.write("\n")
            sys.stderr.flush()

    def __enter__(self) -> PullLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wrapped(line: str, width: int, indent: str = "      ") -> list[str]:
    """`line` wrapped at `width` with a hanging indent; words (ids, paths) are never split,
    nor is a shell-quoted word ('a path with spaces'). A line that gives a command or a path
    to copy ("resume with: runner resume ID ...", "trace: PATH") is never broken inside it:
    too long, its label goes on a line of its own and the command whole on the next."""
    if len(line) <= width:
        return [line]
    if copyable := _COPYABLE.match(line):
        lead, label, command = copyable.groups()
        return [lead + label, lead + "  " + command]
    glued = re.sub(r"'[^']*'", lambda quoted: quoted.group().replace(" ", _GLUE), line)
    return [part.replace(_GLUE, " ") for part in textwrap.wrap(
        glued, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)]


_COPYABLE = re.compile(r"^(\s*)([a-z].*?:)\s+((?:runner |/|~|\.{1,2}/).*)$")
"""A line whose text after its label is a command or a path to copy."""

_GLUE = "\ue000"
"""Stands for a space inside a quoted word while a line is wrapped (a private-use character)."""

def print_unpadded(out: Any, renderable: Any) -> None:
    """Print a rich renderable (a table) through the console `out`, without the spaces rich
    pads each line with to the table's width."""
    with out.capture() as captured:
        out.print(renderable)
    print("".join(line.rstrip() + "\n" for line in captured.get().splitlines()), end="")


def fit(line: str, width: int) -> str:
    """`line` cut to `width` characters, ending in "…" when cut."""
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def when(ts: float) -> str:
    """A Unix time as "YYYY-MM-DD HH:MM" in UTC."""
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))
