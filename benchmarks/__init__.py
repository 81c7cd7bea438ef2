"""ptrun's benchmarks, beside the package and not in its wheel: `harness` (what they share), `peers` (ptrun
against `plain_loop`, the plain PyTorch loop, and plain DDP), `speedup` (the paper's Figure 9 breakdown),
`pipeline`, `pipedream`, `cache`, the sweeps, the `soak` test, the simulator's `cpu_costs` and
`simulator_check`, and `results_page` (docs/results.md and the README's results, generated from their JSON).
Each runs from the repository root as `python -m benchmarks.NAME ...`."""
