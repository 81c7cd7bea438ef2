"""Runs `ptrun.bench.memory` (its docstring says what it measures and how)."""
from ptrun.bench.memory import main

raise SystemExit(main())
