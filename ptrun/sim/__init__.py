"""`ptrun plan`: project ptrun's speedup to a cluster without running it.

- the model's costs (`ptrun.costs`, below the layout, which the launcher reads too): per-unit parameters,
  forward FLOPs and activation bytes; `profiles` measured seconds from a profile JSON;
- `cluster`: the machines (device FLOP/s, links, host memory and disk for AutoCache), presets `paper`
  and `this_machine`;
- `simulate`: runs the real `Controller` over the recipe's epochs for each component combination of the
  paper's Figure 9 and prices every epoch's Plan with a small time model (its assumptions are in that
  module's docstring); `planning` gets the plans, `pricing` prices one;
- `report`: what `ptrun plan` prints;

Measuring this machine's profile and the `this_machine` preset's constants (`python -m benchmarks.cpu_costs`)
and checking the simulator against measured runs (`python -m benchmarks.simulator_check`) are measurement
tooling, in the repository's `benchmarks/`, not part of the package.

What the simulated numbers are, next to the paper's, and which assumption explains each difference:
docs/simulator.md.
"""

import importlib

_MODULE_OF = {
    "PRESETS": "cluster",
    "Cluster": "cluster",
    "get_cluster": "cluster",
    "ModelCosts": "ptrun.costs.units",
    "bert_costs": "ptrun.costs.units",
    "costs_from_config": "ptrun.costs.from_config",
    "load_profile": "profiles",
    "save_profile": "profiles",
    "vit_costs": "ptrun.costs.units",
    "COMBINATIONS": "simulate",
    "EpochRecord": "simulate",
    "speedups": "simulate",
}
"""Where each name of the package lives (a module of `ptrun.sim`, or a whole module path), imported when first
asked for. The functions named as their modules (`simulate.simulate`,
`report.report`) are imported from them."""

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'ptrun.sim' has no attribute {name!r}")
    module = _MODULE_OF[name]
    return getattr(importlib.import_module(module if "." in module else f"ptrun.sim.{module}"), name)
