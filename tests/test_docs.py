"""The docs as a newcomer reads them: a README that fits an afternoon, reference pages of a
bounded size (the history lives in docs/journal.md), and no link that leads nowhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize(("page", "most_lines"), [("README.md", 200), ("docs/local-models.md", 350)])
def test_a_page_stays_within_its_size(page: str, most_lines: int) -> None:
    lines = len((ROOT / page).read_text().splitlines())
    assert lines <= most_lines, f"{page}: {lines} lines"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    targets = {m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", text)}
    missing = [t for t in sorted(targets) if t and "://" not in t and not (page.parent / t).exists()]
    assert not missing, missing
