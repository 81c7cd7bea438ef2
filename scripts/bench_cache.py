"""Runs `ptrun.bench.cache` (its docstring says what it measures and how)."""
from ptrun.bench.cache import main

raise SystemExit(main())
