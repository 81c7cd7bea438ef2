"""Runs `ptrun.bench.pipeline` (its docstring says what it measures and how)."""
from ptrun.bench.pipeline import main

raise SystemExit(main())
