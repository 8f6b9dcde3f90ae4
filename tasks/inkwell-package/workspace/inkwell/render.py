"""Notes to HTML."""

import html

from inkwell import config
from inkwell.text import slugify_title, wrap_lines


def render_heading(line: str) -> str:
    level = len(line) - len(line.lstrip("#"))
    title = line[level:].strip()
    return f'<h{level} id="{slugify_title(title)}">{html.escape(title)}</h{level}>'


def render_note(text: str, width: int | None = None) -> str:
    """The note `text` as HTML: '#' lines as headings, other paragraphs wrapped at `width`
    (default: the config's)."""
    width = width or config.DEFAULT_WIDTH
    out = []
    for block in text.split("\n\n"):
        first = block.lstrip()
        hashes = len(first) - len(first.lstrip("#"))
        if 0 < hashes <= config.MAX_HEADING_LEVEL:
            out.append(render_heading(first))
        else:
            out.append("<p>" + "<br>".join(html.escape(line) for line in wrap_lines(block, width)) + "</p>")
    return "\n".join(out)
