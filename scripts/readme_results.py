"""Writes docs/results.md and the README's measured number from docs/results/*.json (`ptrun.bench.results_page`)."""

from ptrun.bench.results_page import main

if __name__ == "__main__":  # spawned workers import this file again as __mp_main__
    raise SystemExit(main())
