"""Runs `ptrun.bench.soak` (its docstring says what it measures and how)."""

from ptrun.bench.soak import main

if __name__ == "__main__":  # spawned workers import this file again as __mp_main__
    raise SystemExit(main())
