"""Runs `ptrun.bench.pipedream` (its docstring says what it measures and how)."""
from ptrun.bench.pipedream import main

raise SystemExit(main())
