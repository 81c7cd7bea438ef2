"""Runs `ptrun.bench.speedup` (its docstring says what it measures and how)."""
from ptrun.bench.speedup import main

raise SystemExit(main())
