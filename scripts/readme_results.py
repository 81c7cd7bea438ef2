"""Runs `ptrun.bench.readme` (its docstring says what it measures and how)."""
from ptrun.bench.readme import main

raise SystemExit(main())
