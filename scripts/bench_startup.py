"""Runs `ptrun.bench.startup` (its docstring says what it measures and how)."""

from ptrun.bench.startup import main

if __name__ == "__main__":  # spawned workers import this file again as __mp_main__
    raise SystemExit(main())
