"""Runs `ptrun.bench.sweep_microbatches` (its docstring says what it measures and how)."""
from ptrun.bench.sweep_microbatches import main

raise SystemExit(main())
