"""Runs `benchmarks.pipedream` (its docstring says what it measures and how)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/

from benchmarks.pipedream import main  # noqa: E402

if __name__ == "__main__":  # spawned workers import this file again as __mp_main__
    raise SystemExit(main())
