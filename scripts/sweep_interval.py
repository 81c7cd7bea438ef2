"""Runs `ptrun.bench.sweep_interval` (its docstring says what it measures and how)."""
from ptrun.bench.sweep_interval import main

raise SystemExit(main())
