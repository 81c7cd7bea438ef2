"""Runs `ptrun.bench.soak` (its docstring says what it measures and how)."""
from ptrun.bench.soak import main

raise SystemExit(main())
