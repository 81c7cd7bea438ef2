"""Project a recipe's epochs onto a cluster: the real Controller plans, a small time model prices each plan.

Planning is not re-implemented here. The starting layout comes from `ptrun.parallel.layout.first_plan`
(given a stand-in model whose units hold meta-device parameters of the analytic sizes) and every later
layout from `Controller.decide`, the call the trainer makes at each epoch boundary, with the config of
each combination of the paper's Figure 9 (`COMBINATIONS`). Only the *time* of a plan is modelled.

The time model and its assumptions
----------------------------------
1. Compute. A unit's forward time per sample is its matmul FLOPs over the device's achieved FLOP/s
   (`Cluster.flops`), or a measured profile's forward time (`forward_s`; else its forward + backward / 3). A
   trainable unit costs forward + backward (3 x forward with FLOPs: backward computes input and weight
   gradients, 2 x forward). A frozen unit that still runs in a stage costs its forward only on the first stage
   (its input carries no gradient, so no graph is built) and forward + the input gradient on a later one (the
   pipeline marks received activations as requiring a gradient, so the unit back-propagates to its input
   without weight gradients: 2 x forward with FLOPs, measured `frozen_s` with a profile). With
   `pipe.recompute` a trainable unit runs its forward once more in backward (+1 x forward). A unit served by
   AutoCache costs nothing in the pipeline. Compute is linear in the micro-batch size: no efficiency loss for
   small GEMMs (the only fixed cost is assumption 2's per micro-batch overhead). With a measured profile each
   trainable unit also costs its optimizer update once per step (`update_s`: the clip's per-parameter work and
   the optimizer step); the slowest rank's update follows the pipeline.
2. Pipeline. A stage's micro-batch time is the cluster's fixed `microbatch_overhead_s`, plus its units'
   compute for one micro-batch, plus sending its output to the next stage and receiving the gradient back
   (always: the next stage's input requires one), each a message of `link_latency_s` plus its bytes at the
   intra-node bandwidth, or the inter-node one where consecutive stages sit on different nodes. A rank
   holding several stages (looped or V schedules) runs them one after the other. A step of M micro-batches
   over K ranks takes the sum of the ranks' micro-batch times (the first micro-batch's way through, GPipe's
   fill and drain) + (M - 1) x the slowest rank's: the makespan of GPipe and of 1F1B, (M + K - 1) x the
   slowest when the ranks are balanced. Interleaved schedules do better, so this is an upper bound for them.
3. Data parallelism. After the pipeline, each stage's replicas all-reduce the gradients of its trainable
   parameters (fp32, ptrun's manual all-reduce after `schedule.step()`, not overlapped) with a ring:
   2(DP-1)/DP x bytes / bandwidth, plus the ring's 2(DP-1) latencies. If a stage's replicas span nodes, the
   rings of all K stages share each node's one inter-node link, so the time is that factor x all trainable
   bytes / inter-node bandwidth; within a node, the largest stage's bytes / intra-node bandwidth. The clip's
   norm is one number all-reduced over the pipeline's K ranks: 2(K-1) latencies.
4. AutoCache. The first stage of each replica reads its batch's cached activations (the output of the cached
   prefix, in `cache.dtype`) from the node's memory at `Cluster.host_gbs` per device, or from the disk tier at
   the node's `disk_gbs` shared by the node's replicas, for the share of samples beyond `cache.max_memory` of
   the node's RAM, plus `cache_sample_s` per entry and `cache_batch_s` per batch. Every node caches the whole
   training set (samples are reshuffled over all replicas every epoch). A first stage the cache serves loads
   no raw samples (`AutoCache.fetch`), except for the misses of a fill from scratch; the other ranks of a
   pipeline still load the raw batch (for the labels). Loading and reads happen in the loader's prefetch
   thread during the previous step (`overlap_io`): the step takes the longer of the slowest rank's loading
   and the compute; without `overlap_io` (this machine's 2 cores) they add up. In an epoch whose cached depth
   C is deeper than what the cache holds (depth d < C, or nothing), the first stage also runs units [d, C)
   forward on the batch and writes the results (AutoCache's incremental update) before the pipeline starts;
   that is not overlapped.
5. Epoch. Steps = ceil(samples / global batch), where the global batch is the Controller's: fixed, or
   per-pipeline batch x DP under `auto.batch=fixed_per_pipeline` (the paper's policy, so wider DP means fewer
   steps). A layout change at an epoch boundary costs `Cluster.transition_s`. Evaluation and start-up are not
   counted; loading raw samples costs `loader_batch_s` + per_replica / `loader_samples_s` in the prefetch
   thread (0, the GPU preset's value, means the input pipeline always keeps up). `step_overhead_s` is added
   to every step.
6. Freezing. No gradient norms exist in a simulation: a policy that reads them (`pipetransformer`) is replaced
   by the closed form of its first term (`alpha`, the paper's schedule and what the released code ran);
   `autofreeze` cannot be simulated.
7. CPU sharing. When the workers are CPU processes on `cores_per_node` cores, shared among themselves (two
   busy workers on this machine's 2 cores get 1.89 cores' worth) and with `background_load` runnable
   processes of other jobs (other people's benchmarks), a step stretches by (the node's busy workers on
   average + the background) / cores when that exceeds 1. The busy workers are the replicas' CPU seconds in
   a step (micro-batches, update, loading, fill) over its time on cores of their own: a pipeline whose ranks
   wait in its bubble leaves room for the others, data-parallel replicas that compute the whole step do not.
   `cores_per_node` 0 (the GPU preset) = nothing shared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Optional, Sequence

from ptrun.auto.controller import Controller, start
from ptrun.config import ConfigError, PtrunConfig, parse_memory
from ptrun.parallel.layout import NEEDS_PROFILE, start_replica_batch, starting_microbatches
from ptrun.parallel.partition import stage_sums
from ptrun.parallel.plan import Plan
from ptrun.sim.cluster import GB, Cluster
from ptrun.sim.costs import FP32, ModelCosts

COMBINATIONS: dict[str, tuple[str, dict[str, bool]]] = {
    "baseline": ("baseline (no freezing, static K0 x DP)", dict(freeze=False, pipe=False, dp=False, cache=False)),
    "freeze": ("freeze only", dict(freeze=True, pipe=False, dp=False, cache=False)),
    "freeze+pipe+cache": ("freeze + AutoPipe + AutoCache", dict(freeze=True, pipe=True, dp=False, cache=True)),
    "freeze+pipe+dp": ("freeze + AutoPipe + AutoDP", dict(freeze=True, pipe=True, dp=True, cache=False)),
    "all": ("freeze + AutoPipe + AutoDP + AutoCache", dict(freeze=True, pipe=True, dp=True, cache=True)),
}
"""Figure 9's component combinations: name -> (label, the `auto.*` switches)."""

PAPER_TABLE1 = {"vit_imagenet": (2.83, 26 * 3600 + 30 * 60, 9 * 3600 + 21 * 60),
                "vit_cifar100": (2.44, 35 * 60 + 6, 12 * 60 + 23),
                "bert_squad": (2.10, 5 * 3600 + 7 * 60, 2 * 3600 + 26 * 60)}
"""Recipe -> (speedup, baseline seconds, PipeTransformer seconds) of the paper's Table 1."""

PAPER_FIG9 = {"vit_imagenet": {"freeze": 0.95, "freeze+pipe+cache": 1.26, "freeze+pipe+dp": 2.27, "all": 2.83}}
"""The paper's Figure 9 speedups (ViT-B/16 on ImageNet)."""

DATASET_SAMPLES = {"imagefolder": 1_281_167, "cifar100": 50_000, "cifar10": 50_000, "squad": 88_524,
                   "digits": 1_437}
"""Training samples per source: ImageNet-1k's train split (imagefolder is taken to be ImageNet), CIFAR,
SQuAD v1.1's train features at length 384 / stride 128 (BERT tokenizer; more at 256), digits' 80% split."""

GLUE_SAMPLES = {"cola": 8_551, "sst2": 67_349, "mrpc": 3_668, "qqp": 363_846, "mnli": 392_702, "qnli": 104_743,
                "rte": 2_490, "wnli": 635}

CACHE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def default_samples(cfg: PtrunConfig) -> Optional[int]:
    """Training samples of the recipe's dataset, or None when unknown (`--samples` must say)."""
    if cfg.data.name == "glue":
        return GLUE_SAMPLES.get(cfg.data.task or "")
    return DATASET_SAMPLES.get(cfg.data.name)


# ---- records ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepTime:
    stage_s: tuple[float, ...]
    """Micro-batch seconds of each stage (compute + boundary transfers)."""
    pipeline_s: float
    allreduce_s: float
    cache_read_s: float
    cache_fill_s: float
    load_s: float
    """A loading thread's time for a replica batch of raw samples (0 when the loader is never the limit)."""
    update_s: float
    """The slowest rank's optimizer update (measured profiles only; else 0)."""
    slowdown: float
    """The factor CPU sharing with other jobs stretched the step by (assumption 7; 1 on devices)."""
    total_s: float


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    plan: Plan
    global_batch: int
    steps: int
    step: StepTime
    transition_s: float
    time_s: float


# ---- planning: the real Controller ------------------------------------------------------------------------


def device_budget(cfg: PtrunConfig, cluster: Cluster) -> int:
    """Bytes one of `cluster`'s devices offers a stage: `device.memory` (a share of the device, or a size),
    else the whole device (the host's memory shared by the node's devices when the cluster gives none)."""
    return parse_memory(cfg.device.memory or "100%", key="device.memory", total=int(
        cluster.device_memory_gb * GB if cluster.device_memory_gb else
        cluster.host_memory_gb * GB / cluster.gpus_per_node))


def plannable(cfg: PtrunConfig, costs: ModelCosts | None = None, cluster: Cluster | None = None) -> PtrunConfig:
    """`cfg` with a freeze policy that needs no gradient norms (assumption 6), and with `pipe.length=auto`
    resolved for `cluster`'s devices from `costs` (what the trainer measures, estimated: see `fit_memory`)."""
    if costs is not None and cluster is not None and (cfg.pipe.length == "auto" or cfg.pipe.microbatches is None):
        from ptrun.parallel.fit import resolve_length

        cfg, _ = resolve_length(cfg, None, (), cluster.world_size, device_budget(cfg, cluster),
                                memory=fit_memory(costs, cfg))
    if cfg.freeze.policy == "autofreeze" and cfg.auto.freeze:
        raise ConfigError("freeze.policy='autofreeze' is not allowed: it needs measured gradient norms; "
                          "simulate with alpha, linear, schedule or none")
    if cfg.freeze.policy == "pipetransformer":
        return replace(cfg, freeze=replace(cfg.freeze, policy="alpha"))
    return cfg


ACTIVATION_PER_OUTPUT = 6.0
"""Bytes autograd keeps per byte of a unit's output, for the planner (which measures nothing). Measured with
`ptrun.parallel.fit.measure_unit_memory` on the digits ViT: 4.4-7.6 for its attention and MLP halves."""


def fit_memory(costs: ModelCosts, cfg: PtrunConfig):
    """The planner's per-unit memory: float32 parameters, gradients and optimizer state from the analytic
    sizes; activations from the unit's output size (`ACTIVATION_PER_OUTPUT`)."""
    from ptrun.parallel.fit import OPTIMIZER_COPIES, UnitMemory

    copies = 2 + OPTIMIZER_COPIES.get(cfg.optim.name, 2)
    return UnitMemory([4.0 * copies * n for n in costs.params], [ACTIVATION_PER_OUTPUT * a for a in costs.act_bytes])


def combination_config(cfg: PtrunConfig, name: str) -> PtrunConfig:
    """`cfg` with the `auto.*` switches of one Figure-9 combination."""
    return replace(cfg, auto=replace(cfg.auto, **COMBINATIONS[name][1]))


def stand_in(costs: ModelCosts) -> SimpleNamespace:
    """What the start reads of a LayeredModel: its blocks, and units whose parameters have the analytic sizes
    (meta-device tensors: no memory)."""
    import torch
    from torch import nn

    units = []
    for n in costs.params:
        unit = nn.Module()
        unit.weight = nn.Parameter(torch.empty(int(n), device="meta"))
        units.append(unit)
    return SimpleNamespace(units=units, num_blocks=costs.num_blocks)


def start_profile(cfg: PtrunConfig, costs: ModelCosts, cluster: Cluster) -> tuple[SimpleNamespace | None, float | None]:
    """For the time-based partitioners, the profile the trainer would measure (one micro-batch's forward +
    backward seconds and output bytes per unit) and the stage link's bandwidth; (None, None) for the others."""
    if cfg.pipe.partition not in NEEDS_PROFILE:
        return None, None
    m = starting_microbatches(cfg.pipe, cluster.world_size, cfg.train.global_batch_size, cfg.auto.microbatch_table)
    micro = max(1, start_replica_batch(cfg.pipe, cluster.world_size, cfg.train.global_batch_size) // m)
    fb, _ = unit_seconds(costs, cluster)
    return (SimpleNamespace(time_s=[t * micro for t in fb], activation_bytes=[a * micro for a in costs.act_bytes]),
            cluster.intra_gbs * GB)


def plan_epochs(costs: ModelCosts, cluster: Cluster, cfg: PtrunConfig) -> tuple[Controller, list[Plan]]:
    """The Controller for `cfg` on `cluster`'s world, and the Plan of every epoch as the trainer gets them
    (the same `start`, then `decide` before each later epoch, without gradient norms). Nothing is measured
    here: `pipe.microbatches=auto` plans with the M AutoPipe's table gives."""
    cfg = plannable(cfg, costs, cluster)
    profile, bandwidth = start_profile(cfg, costs, cluster)
    controller = start(cfg, stand_in(costs), cluster.world_size, profile=profile, bandwidth=bandwidth)
    from ptrun.parallel.fit import check_fits

    # The first layout must fit a device (later ones only shorten the active part: frozen units keep no
    # gradients or optimizer state).
    check_fits(fit_memory(costs, cfg), controller.first, cfg.train.global_batch_size, device_budget(cfg, cluster))
    plans, interval = [controller.first], 0
    for epoch in range(1, cfg.train.epochs):
        # Every decision up to this boundary; the epoch is priced in the layout it starts with (decisions
        # inside an epoch, `freeze.every` < 1, count from the next boundary: the estimate is conservative).
        plan = plans[-1]
        while (interval + 1) * controller.interval_epochs <= epoch + 1e-9:
            interval += 1
            plan = controller.decide(interval, plan, None)
        plans.append(plan)
    return controller, plans


# ---- pricing a plan --------------------------------------------------------------------------------------


def unit_seconds(costs: ModelCosts, cluster: Cluster) -> tuple[list[float], list[float]]:
    """(forward + backward, forward) seconds per sample of each unit on one device (assumption 1): a
    profile's measured times (its forward, or forward + backward / 3 when it has none), else FLOPs over the
    device's achieved FLOP/s, with backward = 2 x forward."""
    if costs.fb_seconds is not None:
        fwd = costs.fwd_seconds if costs.fwd_seconds is not None else [t / 3 for t in costs.fb_seconds]
        return list(costs.fb_seconds), list(fwd)
    fwd = [f / cluster.flops for f in costs.fwd_flops or ()]
    return [3 * t for t in fwd], fwd


def frozen_grad_seconds(costs: ModelCosts, cluster: Cluster) -> list[float]:
    """Seconds per sample of a frozen unit whose input needs a gradient (assumption 1: a frozen unit on a
    later stage): forward + the input gradient's backward. Measured (`frozen_s`), else forward + half the
    backward (a matmul's input gradient is one of its backward's two products: 2 x forward with FLOPs)."""
    if costs.frozen_seconds is not None:
        return list(costs.frozen_seconds)
    fb, fwd = unit_seconds(costs, cluster)
    return [f + (t - f) / 2 for t, f in zip(fb, fwd)]


def unit_work(plan: Plan, fb: Sequence[float], fwd: Sequence[float], recompute: bool = False,
              frozen_grad: Optional[Sequence[float]] = None) -> list[float]:
    """Seconds per sample each unit costs in the pipeline: trainable fb (plus another forward with
    `pipe.recompute`), cached 0, frozen fwd on the first stage (its input carries no gradient) and
    `frozen_grad` on a later one (the pipeline's received activations require a gradient, so a frozen unit
    there still back-propagates to its input; without `frozen_grad`, fwd)."""
    def frozen(u: int) -> float:
        return fwd[u] if frozen_grad is None or plan.stage_of_unit(u) == 0 else frozen_grad[u]

    return [0.0 if u < plan.cached_units else frozen(u) if u < plan.frozen_units else fb[u] + recompute * fwd[u]
            for u in range(plan.num_units)]


def update_seconds(plan: Plan, costs: ModelCosts) -> list[float]:
    """Each pipeline rank's optimizer update per step: the measured `update_s` of the trainable units its
    stages hold (0 without a measured profile: on a GPU it is milliseconds against seconds)."""
    if costs.update_seconds is None:
        return [0.0] * plan.pp
    per_rank = []
    for r in range(plan.pp):
        units = [u for s in plan.local_stages(r) for u in range(*plan.stage_bounds[s]) if u >= plan.frozen_units]
        per_rank.append(math.fsum(costs.update_seconds[u] for u in units))
    return per_rank


def sharing_slowdown(plan: Plan, cluster: Cluster, busy_s: float, step_s: float) -> float:
    """How much a step stretches when the workers are CPU processes sharing `cores_per_node` cores (among
    themselves, and with `background_load` runnable processes of other jobs; assumption 7): (the node's
    busy workers on average + the background) / cores, when above 1. `busy_s` is one replica's CPU seconds
    a step, summed over its ranks; `step_s` the step's time on cores of its own."""
    if not cluster.cores_per_node or step_s <= 0:
        return 1.0
    ours = min(cluster.gpus_per_node, plan.dp * busy_s / step_s / cluster.nodes)
    return max(1.0, (ours + cluster.background_load) / cluster.cores_per_node)


def boundary_bandwidth(plan: Plan, stage: int, cluster: Cluster) -> float:
    """Bytes/s from stage `stage` to the next: inter-node if any replica's two ranks sit on different nodes."""
    crosses = any(cluster.node_of(plan.rank_of_stage(r, stage)) != cluster.node_of(plan.rank_of_stage(r, stage + 1))
                  for r in range(plan.dp))
    return (cluster.inter_gbs if crosses else cluster.intra_gbs) * GB


def stage_seconds(plan: Plan, work: Sequence[float], act_bytes: Sequence[float], micro: float,
                  cluster: Cluster) -> list[float]:
    """Micro-batch seconds of each stage: the cluster's fixed overhead, compute, plus the output sent on and
    its gradient received back, each a message of `link_latency_s` plus its bytes (assumption 2). The
    gradient comes back even to a frozen stage: the next stage's received activations require one."""
    out = []
    for s, compute in enumerate(stage_sums(plan.stage_bounds, list(work))):
        hi = plan.stage_bounds[s][1]
        last = s == plan.num_stages - 1
        transfer = 0.0 if last else 2 * (cluster.link_latency_s
                                          + micro * act_bytes[hi - 1] / boundary_bandwidth(plan, s, cluster))
        out.append(cluster.microbatch_overhead_s + micro * compute + transfer)
    return out


def pipeline_seconds(plan: Plan, stage_s: Sequence[float]) -> float:
    """A flushing schedule's step: the first micro-batch passes every rank once (fill and drain), the other
    M - 1 follow at the slowest rank's pace: sum of the ranks' micro-batch times + (M - 1) x the slowest
    (GPipe's and 1F1B's makespan; (M + K - 1) x the slowest when the ranks are balanced). A rank runs its
    stages one after the other. PipeDream's asynchronous 1F1B never flushes: in the steady state a step
    takes the slowest rank's time (its K - 1 warm-up steps happen once per epoch and are left out). With
    the first stage replicated (`replicate_first_only`), each later stage's one rank runs all DP replicas'
    mini-batches of a step."""
    per_rank = [math.fsum(stage_s[i] for i in plan.local_stages(r)) for r in range(plan.pp)]
    if plan.replicate_first_only:
        per_rank = per_rank[:1] + [plan.dp * t for t in per_rank[1:]]
    if plan.schedule == "pipedream":
        return max(per_rank)
    return math.fsum(per_rank) + (plan.microbatches - 1) * max(per_rank)


def allreduce_seconds(plan: Plan, params: Sequence[float], cluster: Cluster) -> float:
    """Ring all-reduce of each pipeline position's trainable fp32 gradients over its DP group (assumption 3),
    plus the latency of the ring's 2(DP - 1) steps and of the clip's one-number all-reduce over the K ranks
    of a pipeline."""
    norm = 2 * (plan.pp - 1) * cluster.link_latency_s
    if plan.dp == 1:
        return norm
    norm += 2 * (plan.dp - 1) * cluster.link_latency_s
    trainable = [FP32 * p if u >= plan.frozen_units else 0.0 for u, p in enumerate(params)]
    per_stage = stage_sums(plan.stage_bounds, trainable)
    per_rank = [math.fsum(per_stage[i] for i in plan.local_stages(r)) for r in range(plan.pp)]
    if plan.replicate_first_only:  # only the first stage has replicas to all-reduce with
        per_rank = per_rank[:1]
    ring = 2 * (plan.dp - 1) / plan.dp
    spans = any(len({cluster.node_of(rank) for rank in plan.stage_ranks(r)}) > 1 for r in range(plan.pp))
    if spans:
        return norm + ring * math.fsum(per_rank) / (cluster.inter_gbs * GB)
    return norm + ring * max(per_rank) / (cluster.intra_gbs * GB)


def cache_readers(plan: Plan, cluster: Cluster) -> int:
    """The most replicas whose first stage (the cache reader) sits on one node."""
    nodes = [cluster.node_of(plan.rank_of_stage(r, 0)) for r in range(plan.dp)]
    return max(nodes.count(n) for n in set(nodes))


def cache_io_seconds(nbytes: float, memory_share: float, readers: int, cluster: Cluster) -> float:
    """Moving `nbytes` between the cache and one device: the memory share at `host_gbs`, the rest at the
    node's disk bandwidth split among `readers` (assumption 4)."""
    return nbytes * (memory_share / (cluster.host_gbs * GB) + (1 - memory_share) * readers / (cluster.disk_gbs * GB))


def cache_memory_share(cfg: PtrunConfig, cluster: Cluster, entry_bytes: float, samples: int) -> float:
    """The share of the training set's cache entries inside `cache.max_memory` of a node's RAM."""
    budget = parse_memory(cfg.cache.max_memory, total=int(cluster.host_memory_gb * GB))
    return min(1.0, budget / (entry_bytes * samples)) if entry_bytes * samples else 1.0


def step_time(plan: Plan, costs: ModelCosts, cluster: Cluster, cfg: PtrunConfig, per_replica: int, samples: int,
              filled: int) -> StepTime:
    """One optimizer step under `plan` with `per_replica` samples a replica; `filled` is the cache depth
    the entries hold when the epoch starts (0: nothing cached yet)."""
    fb, fwd = unit_seconds(costs, cluster)
    work = unit_work(plan, fb, fwd, recompute=cfg.pipe.recompute != "none",
                     frozen_grad=frozen_grad_seconds(costs, cluster))
    stages = stage_seconds(plan, work, costs.act_bytes, per_replica / plan.microbatches, cluster)
    pipe = pipeline_seconds(plan, stages)
    allreduce = allreduce_seconds(plan, costs.params, cluster)
    # Every rank's loading thread loads its replica batch's raw samples, except a first stage the cache
    # serves: it reads the entries instead (and loads raw samples only for the misses of a fill from scratch).
    raw = cluster.loader_batch_s + (per_replica / cluster.loader_samples_s if cluster.loader_samples_s else 0.0)
    first_raw, read, fill = raw, 0.0, 0.0
    c = plan.cached_units
    if c:
        stored = PRECISION_BYTES[cfg.train.precision] if cfg.cache.dtype == "auto" else CACHE_DTYPE_BYTES[cfg.cache.dtype]
        entry = costs.act_bytes[c - 1] * stored / FP32
        io = cache_io_seconds(per_replica * entry, cache_memory_share(cfg, cluster, entry, samples),
                              cache_readers(plan, cluster), cluster) + per_replica * cluster.cache_sample_s
        start = filled if filled <= c else 0
        read = cluster.cache_batch_s + (io if start else 0.0)
        first_raw = 0.0 if start else raw
        fill = per_replica * math.fsum(fwd[start:c]) + io if start < c else 0.0
    loading = max(first_raw + read, raw if plan.pp > 1 else 0.0)  # the ranks load side by side
    busy = fill + pipe
    update = update_seconds(plan, costs)
    total = (max(loading, busy) if cluster.overlap_io else loading + busy) + allreduce + max(update) \
        + cluster.step_overhead_s
    cpu = (plan.microbatches * math.fsum(stages) + fill + math.fsum(update) + first_raw + read
           + (plan.pp - 1) * raw + plan.pp * cluster.step_overhead_s)
    slowdown = sharing_slowdown(plan, cluster, cpu, total)
    return StepTime(tuple(stages), pipe, allreduce, read, fill, raw, max(update), slowdown, total * slowdown)


def epoch_records(plans: Sequence[Plan], controller: Controller, costs: ModelCosts, cluster: Cluster,
                  cfg: PtrunConfig, samples: int) -> list[EpochRecord]:
    """Price each epoch's plan (assumption 5)."""
    records, filled, prev = [], 0, None
    for epoch, plan in enumerate(plans):
        batch = controller.global_batch(plan)
        steps = math.ceil(samples / batch)
        if cfg.train.max_steps_per_epoch:
            steps = min(steps, cfg.train.max_steps_per_epoch)
        step = step_time(plan, costs, cluster, cfg, batch // plan.dp, samples, filled)
        transition = cluster.transition_s if prev is not None and plan != prev else 0.0
        records.append(EpochRecord(epoch, plan, batch, steps, step, transition, steps * step.total_s + transition))
        filled = plan.cached_units or filled
        prev = plan
    return records


def simulate_one(costs: ModelCosts, cluster: Cluster, cfg: PtrunConfig, samples: int) -> list[EpochRecord]:
    """Per-epoch records of one config."""
    if costs.num_units < 4 or costs.num_units % 2:
        raise ConfigError(f"the model has {costs.num_units} units: a layered model has 2L + 2 (L >= 1)")
    if samples < 1:
        raise ConfigError(f"--samples {samples} is not allowed: an integer >= 1")
    controller, plans = plan_epochs(costs, cluster, cfg)
    return epoch_records(plans, controller, costs, cluster, cfg, samples)


def simulate(costs: ModelCosts, cluster: Cluster, cfg: PtrunConfig, samples: int) -> dict[str, list[EpochRecord]]:
    """Per-epoch records of every Figure-9 combination of `cfg` (`COMBINATIONS`), by name."""
    return {name: simulate_one(costs, cluster, combination_config(cfg, name), samples) for name in COMBINATIONS}


def total_seconds(records: Sequence[EpochRecord]) -> float:
    return math.fsum(r.time_s for r in records)


def speedups(results: dict[str, list[EpochRecord]]) -> dict[str, float]:
    """Each combination's speedup over `baseline` (total time)."""
    base = total_seconds(results["baseline"])
    return {name: base / total_seconds(records) for name, records in results.items()}

__all__ = ["COMBINATIONS", "DATASET_SAMPLES", "EpochRecord", "PAPER_FIG9", "PAPER_TABLE1", "StepTime",
           "allreduce_seconds", "combination_config", "default_samples", "epoch_records", "frozen_grad_seconds",
           "pipeline_seconds", "plan_epochs", "simulate", "simulate_one", "speedups", "stage_seconds",
           "sharing_slowdown", "step_time", "total_seconds", "unit_seconds", "unit_work",
           "update_seconds"]
