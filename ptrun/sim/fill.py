"""The layout a launch fills in before any worker starts: `pipe.length=auto` and an unset micro-batch count made
numbers, so the config the workers read (and the run directory's config.yaml) holds what the run trains with.

As `ptrun plan` does, nothing is built or measured: the planner's stand-in gives each unit's memory from the
model's analytic sizes (`ptrun.sim.costs`), and the devices the workers will use give the budget (a GPU's
memory from NVML, or the host's memory shared by its workers). What remains for the workers is the world size a
rendezvous of several machines counts: they check the filled layout against it
(`ptrun.train.startup.check_world`)."""

from __future__ import annotations

import os

from ptrun.config import LauncherConfig, PtrunConfig, parse_nnodes
from ptrun.config.gpus import visible_gpu_memory_without_torch
from ptrun.config.launcher import visible_gpus, workers_per_node
from ptrun.sim.adapter_costs import adapter_params, trained_params
from ptrun.sim.config_costs import costs_from_config
from ptrun.sim.costs import ModelCosts

ACTIVATION_PER_OUTPUT = 6.0
"""Bytes autograd keeps per byte of a unit's output, for the planner (which measures nothing). Measured with
`ptrun.parallel.fit.measure_unit_memory` on the digits ViT: 4.4-7.6 for its attention and MLP halves."""


def fit_memory(costs: ModelCosts, cfg: PtrunConfig):
    """The planner's per-unit memory: float32 parameters from the analytic sizes (with any adapters'), gradients
    and optimizer state for those that train (all of them, or the adapters and the head's:
    `ptrun.sim.adapter_costs`); activations from the unit's output size (`ACTIVATION_PER_OUTPUT`)."""
    from ptrun.parallel.fit import UnitMemory, state_copies

    copies = state_copies(cfg.optim.name)
    added, trained = adapter_params(costs, cfg), trained_params(costs, cfg)
    state = [4.0 * (n + a + (copies - 1) * t) for n, a, t in zip(costs.params, added, trained)]
    return UnitMemory(state, [ACTIVATION_PER_OUTPUT * a for a in costs.act_bytes])


def device_bytes(lc: LauncherConfig) -> int:
    """What one device of this machine holds, as the workers' `ptrun.parallel.fit.device_budget` counts it: the
    smallest visible GPU's memory where the workers use CUDA, else the host's memory shared by this machine's
    workers (`launcher.nproc_per_node`)."""
    if visible_gpus(lc):
        total = visible_gpu_memory_without_torch()
        if total is None:  # device UUIDs, MIG instances, ROCm: only torch can tell
            import torch

            total = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
        return total
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // workers_per_node(lc)


def fill_layout(cfg: PtrunConfig, costs: ModelCosts | None = None):
    """`cfg` with `pipe.length` and `pipe.microbatches` made numbers for the job the launcher starts
    (`ptrun.parallel.fit.resolve_length`, on the stand-in's memory, `costs` or the config's), and the choice
    when K was chosen (None otherwise; `cfg` itself when nothing is `auto`). The world is the machines the
    launcher waits for at least, times the workers of each (`launcher.nproc_per_node`). ConfigError when no
    layout fits."""
    from ptrun.parallel.fit import memory_budget, resolve_length

    from ptrun.config.layout import fill_batch

    pipe, lc = cfg.pipe, cfg.launcher
    fewest, most = parse_nnodes(lc.nnodes)
    world = fewest * workers_per_node(lc)
    if pipe.length != "auto" and pipe.microbatches is not None:
        # a per-pipeline batch becomes the global one where the world is known (else the workers fill it)
        return (fill_batch(cfg, world) if fewest == most else cfg), None
    memory = None
    if pipe.length == "auto":
        memory = fit_memory(costs or costs_from_config(cfg.model, cfg.data), cfg)
    budget = memory_budget(cfg.device.memory, device_bytes(lc)) if memory is not None else 0
    return resolve_length(cfg, None, (), world, budget, memory=memory)
