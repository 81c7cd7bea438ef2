"""`ptrun plan`: project ptrun's speedup to a cluster without running it.

- `costs`: per-unit parameters, forward FLOPs and activation bytes of a ViT or BERT from its sizes,
  `hf_costs` those of the other Hugging Face families from their config.json, `config_costs` the model a
  config would build (`costs_from_config`), `profiles` measured seconds from a profile JSON;
- `cluster`: the machines (device FLOP/s, links, host memory and disk for AutoCache), presets `paper`
  and `this_machine`;
- `simulate`: runs the real `Controller` over the recipe's epochs for each component combination of the
  paper's Figure 9 and prices every epoch's Plan with a small time model (its assumptions are in that
  module's docstring); `planning` gets the plans, `pricing` prices one;
- `report`: what `ptrun plan` prints;
- `measure`: measures this machine's profile and the `this_machine` preset's constants
  (`python scripts/measure_cpu_costs.py`); `validate`: checks the simulator against measured runs
  (`python scripts/validate_simulator.py`).

What the simulated numbers are, next to the paper's, and which assumption explains each difference:
docs/simulator.md.
"""

import importlib

_MODULE_OF = {
    "PRESETS": "cluster",
    "Cluster": "cluster",
    "get_cluster": "cluster",
    "ModelCosts": "costs",
    "bert_costs": "costs",
    "costs_from_config": "config_costs",
    "load_profile": "profiles",
    "save_profile": "profiles",
    "vit_costs": "costs",
    "COMBINATIONS": "simulate",
    "EpochRecord": "simulate",
    "speedups": "simulate",
}
"""Where each name of the package lives, imported when first asked for: the launcher reads the stand-in's
costs (`ptrun.sim.fill`) without the simulator. The functions named as their modules (`simulate.simulate`,
`report.report`) are imported from them."""

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'ptrun.sim' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ptrun.sim.{_MODULE_OF[name]}"), name)
