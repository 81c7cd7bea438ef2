"""`ptrun plan`: project ptrun's speedup to a cluster without running it.

- `costs`: per-unit parameters, forward FLOPs and activation bytes of a ViT or BERT from its config
  (or measured seconds from a profile JSON);
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

from ptrun.sim.cluster import PRESETS, Cluster, get_cluster
from ptrun.sim.costs import ModelCosts, bert_costs, costs_from_config, load_profile, save_profile, vit_costs
from ptrun.sim.report import report
from ptrun.sim.simulate import COMBINATIONS, EpochRecord, simulate, speedups

__all__ = ["COMBINATIONS", "Cluster", "EpochRecord", "ModelCosts", "PRESETS", "bert_costs", "costs_from_config",
           "get_cluster", "load_profile", "report", "save_profile", "simulate", "speedups", "vit_costs"]
