"""Runs `ptrun.bench.export_check` (its docstring says what it checks and how)."""

from ptrun.bench.export_check import main

if __name__ == "__main__":
    raise SystemExit(main())
