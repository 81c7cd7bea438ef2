"""The layout's one entry, `resolve(cfg, world, devices)`: a config's layout made concrete for `world` workers
(the global batch from a per-pipeline one; with `devices`, `pipe.length=auto` chosen by memory and an unset
micro-batch count following K) and checked against the layout rules where that world is new. The launcher
(`ptrun.compose.for_launch`), `ptrun plan` (`ptrun.sim.planning.plannable`) and the workers' world check
(`ptrun.compose.for_world`) all call it.

Before any worker starts nothing is built or measured: the planner's stand-in gives each unit's memory from the
model's analytic sizes (`ptrun.costs`), and the devices the workers will use give the budget (a GPU's memory
from NVML, or the host's memory shared by its workers): `this_machine`. What one device offers a stage is one
function for the launch, `ptrun plan` and the workers alike: `device_budget`."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ptrun.config import LauncherConfig, PipeConfig, PtrunConfig, check_concrete, data_parallel_width, parse_memory
from ptrun.config.gpus import visible_gpu_memory_without_torch
from ptrun.config.launcher import visible_gpus, workers_per_node
from ptrun.config.layout_rules import batch_at, width_problem
from ptrun.config.rules import require

if TYPE_CHECKING:
    import torch

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
    # inner import: start-up (the costs and torch only where K is chosen)
    from ptrun.costs.adapters import adapter_params, trained_params
    from ptrun.layout.fit import UnitMemory, state_copies

    copies = state_copies(cfg.optim.name)
    added, trained = adapter_params(costs, cfg), trained_params(costs, cfg)
    state = [4.0 * (n + a + (copies - 1) * t) for n, a, t in zip(costs.params, added, trained, strict=True)]
    return UnitMemory(state, [ACTIVATION_PER_OUTPUT * a for a in costs.act_bytes])


DEVICE_SHARE = "90%"
"""What a device offers a stage when `device.memory` is unset. Not all of it: the rest holds what no stage's
tensors can use (the CUDA context and the collectives' buffers, the caching allocator's fragmentation; on
the CPU the processes' own libraries and heaps). One share for the trainer and `ptrun plan`, so the planner
picks the pipeline length the trainer would."""


def memory_budget(setting: str | None, total: int) -> int:
    """Bytes one device offers a stage out of its `total`: `device.memory` (a size, or a share of `total`),
    else `DEVICE_SHARE` of it."""
    return parse_memory(setting or DEVICE_SHARE, total=total, key="device.memory")


@runtime_checkable
class DeviceMemory(Protocol):
    """What one machine's devices hold, as a stage's budget is taken from it: the launching machine
    (`MachineMemory`, `machine_memory`) and a simulated cluster (`ptrun.sim.cluster.Cluster`) say it so."""

    @property
    def gpu_bytes(self) -> int | None:
        """One GPU's memory; None where the workers use the CPU."""

    @property
    def host_bytes(self) -> int:
        """The host's memory."""

    @property
    def workers_per_host(self) -> int:
        """The workers that share the host's memory."""


@dataclass(frozen=True)
class MachineMemory:
    """A `DeviceMemory` measured on this machine."""

    gpu_bytes: int | None
    host_bytes: int
    workers_per_host: int


def _host_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def machine_memory(lc: LauncherConfig) -> MachineMemory:
    """What this machine's devices hold, before any worker starts: the smallest visible GPU's memory where the
    workers use CUDA, and the host's memory shared by this machine's workers (`launcher.nproc_per_node`)."""
    gpu = None
    if visible_gpus(lc):
        gpu = visible_gpu_memory_without_torch()
        if gpu is None:  # device UUIDs, MIG instances, ROCm: only torch can tell
            import torch  # inner import: start-up (this module stays without torch)

            gpu = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
    return MachineMemory(gpu, _host_bytes(), workers_per_node(lc))


def worker_memory(device: torch.device) -> MachineMemory:
    """What a worker's own `device` (a `torch.device`) holds: its GPU's memory, and the host's memory shared by
    the node's workers (`LOCAL_WORLD_SIZE`)."""
    gpu = None
    if device.type == "cuda":
        import torch  # inner import: start-up (this module stays without torch)

        gpu = torch.cuda.get_device_properties(device).total_memory
    return MachineMemory(gpu, _host_bytes(), int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def device_budget(cfg: PtrunConfig, devices: DeviceMemory | torch.device) -> int:
    """Bytes one device offers a stage (`memory_budget` of `device.memory`): of the GPU's memory, or where the
    workers use the CPU, of the host's memory shared by them. `devices` is a `DeviceMemory` (the launching
    machine's, a simulated cluster's) or a worker's own `torch.device` (`worker_memory`): the launch, `ptrun
    plan` and the workers count it alike."""
    if not isinstance(devices, DeviceMemory):
        devices = worker_memory(devices)
    gpu = devices.gpu_bytes
    return memory_budget(cfg.device.memory, gpu if gpu is not None else devices.host_bytes // devices.workers_per_host)


def this_machine(cfg: PtrunConfig, costs: ModelCosts | None = None) -> Devices:
    """The devices of the machine that launches: with `pipe.length=auto`, the stand-in's memory (`costs`, else
    the config's) and the budget one device offers it; otherwise nothing to weigh."""
    if cfg.pipe.length != "auto":
        return Devices(0)
    from ptrun.costs.from_config import costs_from_config  # inner import: start-up (only where K is chosen)

    memory = fit_memory(costs or costs_from_config(cfg.model, cfg.data), cfg)
    return Devices(device_budget(cfg, machine_memory(cfg.launcher)), memory)


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
    from ptrun.layout.fit import choose_length, follow_microbatches  # inner import: start-up (torch: K or M chosen)

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
