"""Runs `ptrun.bench.sweep_alpha` (its docstring says what it measures and how)."""
from ptrun.bench.sweep_alpha import main

raise SystemExit(main())
