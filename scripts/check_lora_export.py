"""Runs `benchmarks.export_check` (its docstring says what it checks and how)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/

from benchmarks.export_check import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
