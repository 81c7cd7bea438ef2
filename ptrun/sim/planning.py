"""Planning: the layouts a run would train in, from the real Controller (`ptrun.auto.controller.start`, then
`Controller.decide` at each decision point), given a stand-in model of the analytic sizes. Nothing here is
measured or re-implemented: only what the trainer measures (unit memory, a profile) is estimated."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from ptrun.auto.controller import Controller, start
from ptrun.auto.intervals import epoch_steps, interval_at
from ptrun.config import ConfigError, PtrunConfig
from ptrun.costs.units import ModelCosts
from ptrun.freezing.policies import POLICIES
from ptrun.freezing.policy import MEASURES
from ptrun.layout import fill as layout
from ptrun.layout import needs_resolve
from ptrun.layout.fill import ACTIVATION_PER_OUTPUT, device_budget, fit_memory
from ptrun.layout.first import starting_micro_batch
from ptrun.layout.partition import NEEDS_PROFILE
from ptrun.layout.plan import Plan
from ptrun.sim.cluster import GB, Cluster
from ptrun.sim.pricing import unit_seconds

COMBINATIONS: dict[str, tuple[str, dict[str, bool]]] = {
    "baseline": ("baseline (no freezing, static K0 x DP)", dict(freeze=False, pipe=False, dp=False, cache=False)),
    "freeze": ("freeze only", dict(freeze=True, pipe=False, dp=False, cache=False)),
    "freeze+pipe+cache": ("freeze + AutoPipe + AutoCache", dict(freeze=True, pipe=True, dp=False, cache=True)),
    "freeze+pipe+dp": ("freeze + AutoPipe + AutoDP", dict(freeze=True, pipe=True, dp=True, cache=False)),
    "all": ("freeze + AutoPipe + AutoDP + AutoCache", dict(freeze=True, pipe=True, dp=True, cache=True)),
}
"""Figure 9's component combinations: name -> (label, the `auto.*` switches)."""

DATASET_SAMPLES = {"imagefolder": 1_281_167, "cifar100": 50_000, "cifar10": 50_000, "squad": 88_524, "digits": 1_437}
"""Training samples per source: ImageNet-1k's train split (imagefolder is taken to be ImageNet), CIFAR,
SQuAD v1.1's train features at length 384 / stride 128 (BERT tokenizer; more at 256), digits' 80% split."""

GLUE_SAMPLES = {
    "cola": 8_551,
    "sst2": 67_349,
    "mrpc": 3_668,
    "qqp": 363_846,
    "mnli": 392_702,
    "qnli": 104_743,
    "rte": 2_490,
    "wnli": 635,
}


def default_samples(cfg: PtrunConfig) -> int | None:
    """Training samples of the recipe's dataset, or None when unknown (`--samples` must say)."""
    if cfg.data.name == "glue":
        return GLUE_SAMPLES.get(cfg.data.task or "")
    if cfg.data.name in DATASET_SAMPLES:
        return DATASET_SAMPLES[cfg.data.name]
    # inner import: start-up (reads the user's files: only when the table has no answer)
    from ptrun.data.sources import train_samples

    return train_samples(cfg.data, cfg.model.task)


def combination_config(cfg: PtrunConfig, name: str) -> PtrunConfig:
    """`cfg` with the `auto.*` switches of one Figure-9 combination."""
    return replace(cfg, auto=replace(cfg.auto, **COMBINATIONS[name][1]))


def plannable(cfg: PtrunConfig, costs: ModelCosts | None = None, cluster: Cluster | None = None) -> PtrunConfig:
    """`cfg` with a freeze policy that needs no gradient norms (assumption 6), and with `pipe.length=auto`
    resolved for `cluster`'s devices from `costs` (what the trainer measures, estimated: see `fit_memory`)."""
    on_devices = costs is not None and cluster is not None
    # the global batch at the cluster's world is the config's already (`ptrun.compose.for_cluster` filled it)
    if on_devices and needs_resolve(cfg.pipe, on_devices=True, fixed_world=False):
        cfg, _ = layout.resolve(
            cfg, cluster.world_size, layout.Devices(device_budget(cfg, cluster), fit_memory(costs, cfg))
        )
    policy = POLICIES[cfg.freeze.policy]
    if policy.priced_as is not None:
        return replace(cfg, freeze=replace(cfg.freeze, policy=policy.priced_as))
    measure = policy.measure
    if measure is not None and cfg.auto.freeze:
        raise ConfigError(
            f"freeze.policy={cfg.freeze.policy!r} is not allowed: it needs measured "
            f"{MEASURES[measure]}; simulate with alpha, linear, schedule or none"
        )
    return cfg


def stand_in(costs: ModelCosts) -> SimpleNamespace:
    """What the start reads of a LayeredModel: its blocks, and units whose parameters have the analytic sizes
    (meta-device tensors: no memory), and how many return every token (the costs say)."""
    # inner import: start-up (a refused `ptrun plan` imports no torch)
    import torch
    from torch import nn

    units = []
    for n in costs.params:
        unit = nn.Module()
        unit.weight = nn.Parameter(torch.empty(int(n), device="meta"))
        units.append(unit)
    sequence_units = len(units) if costs.sequence_units is None else costs.sequence_units
    return SimpleNamespace(units=units, num_blocks=costs.num_blocks, sequence_units=sequence_units)


def start_profile(cfg: PtrunConfig, costs: ModelCosts, cluster: Cluster) -> tuple[SimpleNamespace | None, float | None]:
    """For the time-based partitioners, the profile the trainer would measure (one micro-batch's forward +
    backward seconds and output bytes per unit) and the stage link's bandwidth; (None, None) for the others."""
    if cfg.pipe.partition not in NEEDS_PROFILE:
        return None, None
    micro = starting_micro_batch(cfg.pipe, cluster.world_size, cfg.train.global_batch_size, cfg.auto.microbatch_table)
    fb, _ = unit_seconds(costs, cluster)
    return (
        SimpleNamespace(time_s=[t * micro for t in fb], activation_bytes=[a * micro for a in costs.act_bytes]),
        cluster.intra_gbs * GB,
    )


def plan_epochs(
    costs: ModelCosts, cluster: Cluster, cfg: PtrunConfig, samples: int | None = None
) -> tuple[Controller, list[Plan]]:
    """The Controller for `cfg` on `cluster`'s world, and the Plan of every epoch as the trainer gets them
    (the same `start`, then `decide` at each decision point, without gradient norms). Nothing is measured
    here: `pipe.microbatches=auto` plans with the M AutoPipe's table gives. `samples` (the training-set size)
    gives the steps of an epoch, which `freeze.every_steps` needs (without it, intervals are `freeze.every`)."""
    cfg = plannable(cfg, costs, cluster)
    profile, bandwidth = start_profile(cfg, costs, cluster)
    t = cfg.train
    steps = epoch_steps(samples, t.global_batch_size, t.max_steps_per_epoch) if samples else None
    controller = start(
        cfg, stand_in(costs), cluster.world_size, profile=profile, bandwidth=bandwidth, steps_per_epoch=steps
    )
    from ptrun.layout.fit import check_fits  # inner import: start-up (torch)

    # The first layout must fit a device (later ones only shorten the active part: frozen units keep no
    # gradients or optimizer state).
    check_fits(fit_memory(costs, cfg), controller.first, t.global_batch_size, device_budget(cfg, cluster))
    plans, interval = [controller.first], 0
    for epoch in range(1, t.epochs):
        # Every decision up to this boundary; the epoch is priced in the layout it starts with (decisions
        # inside an epoch, `freeze.every` < 1, count from the next boundary: the estimate is conservative).
        plan = plans[-1]
        # at a boundary the epoch's steps do not matter
        reached = interval_at(epoch, 0, steps or 1, controller.interval_epochs)
        while interval < reached:
            interval += 1
            plan = controller.decide(interval, plan, None)
        plans.append(plan)
    return controller, plans


__all__ = [
    "ACTIVATION_PER_OUTPUT",
    "COMBINATIONS",
    "DATASET_SAMPLES",
    "GLUE_SAMPLES",
    "combination_config",
    "default_samples",
    "device_budget",
    "fit_memory",
    "plan_epochs",
    "plannable",
    "stand_in",
    "start_profile",
]
