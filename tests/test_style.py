"""The code's style, checked by ruff with the settings in pyproject.toml: pyflakes, pycodestyle (lines up to 120
columns, one statement a line) and ruff's formatter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str, source: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ruff", *args]
    return subprocess.run(command, cwd=ROOT, input=source, capture_output=True, text=True)


def test_ruff_check_and_format_pass():
    checked = ruff("check", "--output-format", "concise", ".")
    assert checked.returncode == 0, checked.stdout[-3000:]
    formatted = ruff("format", "--check", ".")
    assert formatted.returncode == 0, formatted.stdout[-3000:]


def test_ruff_reads_the_project_settings():
    """The checks the style test relies on are on, from the settings in pyproject.toml: an unused import, two
    statements on a line, a line of 121 columns, unsorted imports, `Optional[X]` for `X | None` and a `zip`
    that does not say whether its lengths must match each fail."""
    source = "import sys\nimport os\nfrom typing import Optional\n\nx: Optional[int] = 1; y = 2\n"
    source += "z = '" + "a" * 115 + "'\nw = list(zip(sys.argv, sys.argv))\n"
    done = ruff("check", "--output-format", "concise", "--stdin-filename", "m.py", "-", source=source)
    assert done.returncode == 1
    found = set(re.findall(r": ([A-Z]+\d+) ", done.stdout))
    assert found == {"F401", "E702", "E501", "I001", "UP045", "B905"}, done.stdout
