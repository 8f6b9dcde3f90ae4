"""inkwell: render plain-text notes as small HTML pages."""

from inkwell.render import render_note

__all__ = ["render_note"]
