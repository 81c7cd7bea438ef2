"""Runs `benchmarks.plain_loop` (its docstring says what it trains and how)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks/

from benchmarks.plain_loop import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
