"""ptrun's benchmarks, measured side by side in one invocation: `harness` (what they share), `peers` (ptrun
against `plain_loop`, the plain PyTorch loop, and plain DDP), `speedup` (the paper's Figure 9 breakdown),
`pipeline`, `pipedream`, `cache`, the sweeps, the `soak` test, and `readme` (the README's tables, generated
from their JSON). Each runs as `python scripts/NAME.py ...` from a clone (scripts/ holds their entry points)."""
