"""The layout: where each unit of the model runs, and every decision of it.

- `plan`: `Plan`, one layout as a small immutable value;
- `owners`: which ranks hold each unit under a plan, and what changes hands between two (AutoDP's ranks);
- `partition`: the partitioners, one table from `pipe.partition` to its function;
- `microbatches`: M, the micro-batch count, by AutoPipe's table and the schedule's rules;
- `fit`: the memory model: K for `pipe.length=auto`, the shortest pipeline whose largest stage fits a device's
  memory, and every layout checked against a device (the planner's first, a change decided in a run);
- `fill`: the one entry, `resolve(cfg, world, devices)`, which the launch, `ptrun plan` and the workers' world
  check call (`ptrun.compose`'s steps) where `needs_resolve` (here) says it has work, the launching machine's
  devices (`this_machine`: the model's analytic costs from `ptrun.costs`, the devices' memory) and what one
  device offers a stage (`device_budget`);
- `first`: the first plan of a run, from `pipe.*` and the model's units;
- `microtune`, `tuning`: `pipe.microbatches=auto`, the micro-batch counts timed on the engines the caller
  builds (it is handed the factory), and their disk cache;
- `autopipe`: the next plan after a freeze (AutoPipe), and the unfrozen layouts micro-batch tuning times.

It imports no runtime: the timing takes a factory of runtimes, and the costs sit below it (`ptrun.costs`)."""

from ptrun.layout.fill import needs_resolve

__all__ = ["needs_resolve"]
