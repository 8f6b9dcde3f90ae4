"""Defaults for rendering."""

DEFAULT_WIDTH = 27
"""Lines of body text are wrapped at this many characters."""

DEFAULT_THEME = "paper"
MAX_HEADING_LEVEL = 4
"""Lines starting with up to this many '#' become headings; deeper ones stay text."""
OUTPUT_DIR = "site"
