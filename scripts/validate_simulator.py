"""Runs `ptrun.sim.validate` (its docstring says what it measures and how)."""

from ptrun.sim.validate import main

if __name__ == "__main__":  # spawned workers import this file again as __mp_main__
    raise SystemExit(main())
