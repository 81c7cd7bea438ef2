"""The layout's one entry, `resolve(cfg, world, devices)`: a config's layout made concrete for `world` workers
(the global batch from a per-pipeline one; with `devices`, `pipe.length=auto` chosen by memory and an unset
micro-batch count following K) and checked against the layout rules where that world is new. The launcher
(`ptrun.compose.for_launch`), `ptrun plan` (`ptrun.sim.planning.plannable`) and the workers' world check
(`ptrun.compose.for_world`) all call it.

Before any worker starts nothing is built or measured: the planner's stand-in gives each unit's memory from the
model's analytic sizes (`ptrun.costs`), and the devices the workers will use give the budget (a GPU's memory
from NVML, or the host's memory shared by its workers): `this_machine`."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ptrun.config import LauncherConfig, PipeConfig, PtrunConfig, check_concrete, data_parallel_width
from ptrun.config.gpus import visible_gpu_memory_without_torch
from ptrun.config.launcher import visible_gpus, workers_per_node
from ptrun.config.layout_rules import batch_at, width_problem
from ptrun.config.rules import require

if TYPE_CHECKING:
    from ptrun.costs.units import ModelCosts

ACTIVATION_PER_OUTPUT = 6.0
"""Bytes autograd keeps per byte of a unit's output, for the planner (which measures nothing). Measured with
`ptrun.layout.fit.measure_unit_memory` on the digits ViT: 4.4-7.6 for its attention and MLP halves."""


@dataclass(frozen=True)
class Devices:
    """What `pipe.length=auto` and an unset micro-batch count are chosen on: the bytes one device offers a
    stage, and the model's per-unit memory (`ptrun.layout.fit.UnitMemory`; None where K is given)."""

    budget: int
    memory: Any | None = None


def fit_memory(costs: ModelCosts, cfg: PtrunConfig):
    """The planner's per-unit memory: float32 parameters from the analytic sizes (with any adapters'), gradients
    and optimizer state for those that train (all of them, or the adapters and the head's:
    `ptrun.costs.adapters`); activations from the unit's output size (`ACTIVATION_PER_OUTPUT`)."""
    from ptrun.costs.adapters import adapter_params, trained_params
    from ptrun.layout.fit import UnitMemory, state_copies  # torch: only where K is chosen

    copies = state_copies(cfg.optim.name)
    added, trained = adapter_params(costs, cfg), trained_params(costs, cfg)
    state = [4.0 * (n + a + (copies - 1) * t) for n, a, t in zip(costs.params, added, trained, strict=True)]
    return UnitMemory(state, [ACTIVATION_PER_OUTPUT * a for a in costs.act_bytes])


def device_bytes(lc: LauncherConfig) -> int:
    """What one device of this machine holds, as the workers' `ptrun.layout.fit.device_budget` counts it: the
    smallest visible GPU's memory where the workers use CUDA, else the host's memory shared by this machine's
    workers (`launcher.nproc_per_node`)."""
    if visible_gpus(lc):
        total = visible_gpu_memory_without_torch()
        if total is None:  # device UUIDs, MIG instances, ROCm: only torch can tell
            import torch

            total = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
        return total
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // workers_per_node(lc)


def this_machine(cfg: PtrunConfig, costs: ModelCosts | None = None) -> Devices:
    """The devices of the machine that launches: with `pipe.length=auto`, the stand-in's memory (`costs`, else
    the config's) and the budget one device offers it; otherwise nothing to weigh."""
    if cfg.pipe.length != "auto":
        return Devices(0)
    from ptrun.costs.from_config import costs_from_config  # only where K is chosen
    from ptrun.layout.fit import memory_budget

    memory = fit_memory(costs or costs_from_config(cfg.model, cfg.data), cfg)
    return Devices(memory_budget(cfg.device.memory, device_bytes(cfg.launcher)), memory)


def fill_batch(cfg: PtrunConfig, world: int) -> PtrunConfig:
    """`cfg` with `train.global_batch_size` filled from `train.pipeline_batch_size` for its integer
    `pipe.length` on `world` workers (whose width rule it must pass); `cfg` itself when the global batch is
    given."""
    t = cfg.train
    if t.global_batch_size is not None:
        return cfg
    problem = width_problem(cfg.pipe, world)
    if problem:
        require(False, *problem)
    return replace(cfg, train=replace(t, global_batch_size=batch_at(t, data_parallel_width(cfg.pipe, world))))


def needs_resolve(pipe: PipeConfig, *, on_devices: bool, fixed_world: bool) -> bool:
    """Whether `resolve` has work, the one answer its every caller asks before calling it (and `resolve` itself,
    for which of its parts runs): on the devices' memory (`on_devices`), a `pipe.length=auto` or an unset
    `pipe.microbatches` to choose; with an integer `pipe.length` and a world of one size (`fixed_world`: one
    machine, a plan's cluster, the world the rendezvous counted), the global batch to fill from a per-pipeline
    one and the layout to check against that world."""
    chooses = on_devices and (pipe.length == "auto" or pipe.microbatches is None)
    return chooses or (fixed_world and pipe.length != "auto")


def resolve(cfg: PtrunConfig, world: int, devices: Devices | None = None, *, check: bool = False):
    """`cfg`'s layout for `world` workers, and the choice when K was chosen (`ptrun.layout.fit.LengthChoice`;
    else None):

    - with `devices`, `pipe.length=auto` chosen by memory (`choose_length`) and an unset `pipe.microbatches`
      from the length (`follow_microbatches`), the global batch from `train.pipeline_batch_size` at that
      length (`fill_batch`); the layout it fills is checked here (`check_concrete`, the rules the config's
      validation applies to a layout the user writes), so nothing needs validating again;
    - otherwise the global batch at the config's K (`fill_batch`), and every layout rule where `check` (a
      world the config's validation did not see: several machines).

    `pipe.microbatches=auto` stays for the trainer to measure. ConfigError naming the key when the layout
    breaks a rule or no layout fits."""
    pipe = cfg.pipe
    if not needs_resolve(pipe, on_devices=devices is not None, fixed_world=False):  # nothing to choose
        cfg = fill_batch(cfg, world)
        if check:
            check_concrete(cfg.pipe, world, cfg.train.global_batch_size)
        return cfg, None
    from ptrun.layout.fit import choose_length, follow_microbatches  # torch: only where K or M is chosen

    choice = None
    if pipe.length == "auto":
        choice = choose_length(devices.memory, cfg, world, devices.budget)
        pipe = replace(
            pipe,
            length=choice.length,
            microbatches=choice.microbatches if pipe.microbatches is None else pipe.microbatches,
        )
    cfg = fill_batch(replace(cfg, pipe=pipe), world)
    if pipe.microbatches is None:
        dp = data_parallel_width(pipe, world)
        pipe = replace(
            pipe, microbatches=follow_microbatches(pipe.length, max(1, cfg.train.global_batch_size // dp), cfg)
        )
    check_concrete(pipe, world, cfg.train.global_batch_size)
    return replace(cfg, pipe=pipe), choice
