"""runner/, scripts/ and tests/ type-check under mypy --strict (the style guide's bar), as part of the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_runner_scripts_and_tests_are_mypy_strict_clean() -> None:
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
