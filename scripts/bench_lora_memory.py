"""Runs `benchmarks.lora_memory` (its docstring says what it measures and how)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/

from benchmarks.lora_memory import main  # noqa: E402

if __name__ == "__main__":
    main()
