"""The inkwell command."""

import argparse
from pathlib import Path

from inkwell import config
from inkwell.render import render_note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inkwell")
    parser.add_argument("notes", type=Path)
    parser.add_argument("--out", type=Path, default=Path(config.OUTPUT_DIR))
    parser.add_argument("--theme", default=config.DEFAULT_THEME)
    args = parser.parse_args(argv)
    args.out.mkdir(exist_ok=True)
    for note in sorted(args.notes.glob("*.txt")):
        page = render_note(note.read_text())
        (args.out / f"{note.stem}.html").write_text(page)
    return 0
