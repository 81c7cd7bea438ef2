"""Runs `ptrun.bench.peers` (its docstring says what it measures and how)."""
from ptrun.bench.peers import main

raise SystemExit(main())
