"""Runs `ptrun.bench.plain_loop` (its docstring says what it trains and how)."""

from ptrun.bench.plain_loop import main

if __name__ == "__main__":
    raise SystemExit(main())
