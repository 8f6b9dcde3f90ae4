"""Text helpers."""

import re
import textwrap


def slugify_title(title: str) -> str:
    """A heading's id: lower case, every run of characters other than letters and digits
    turned into one '-', none at either end."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def wrap_lines(text: str, width: int) -> list[str]:
    """The paragraph `text` wrapped at `width` characters."""
    return textwrap.wrap(text, width=width)
