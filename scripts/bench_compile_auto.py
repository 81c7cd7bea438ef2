"""Runs `ptrun.bench.compile_auto` (its docstring says what it measures and how)."""

from ptrun.bench.compile_auto import main

if __name__ == "__main__":  # spawned workers import this file again as __mp_main__
    raise SystemExit(main())
