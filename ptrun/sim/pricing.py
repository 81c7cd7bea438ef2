"""Pricing a Plan: the seconds of one optimizer step under a layout, by the time model of `ptrun.sim.simulate`
(its docstring lists the assumptions this module's functions cite by number)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ptrun.config import PtrunConfig, parse_memory
from ptrun.config.freezing import CACHE_DTYPE_BYTES, cache_dtype
from ptrun.config.pipe import recomputes
from ptrun.costs.adapters import trained_params, trained_share
from ptrun.costs.units import FP32, ModelCosts
from ptrun.layout.partition import stage_sums
from ptrun.layout.plan import Plan
from ptrun.sim.cluster import GB, Cluster


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
    return [f + (t - f) / 2 for t, f in zip(fb, fwd, strict=True)]


def unit_work(
    plan: Plan,
    fb: Sequence[float],
    fwd: Sequence[float],
    recompute: bool = False,
    frozen_grad: Sequence[float] | None = None,
) -> list[float]:
    """Seconds per sample each unit costs in the pipeline: trainable fb (plus another forward with
    `pipe.recompute`), cached 0, frozen fwd on the first stage (its input carries no gradient) and
    `frozen_grad` on a later one (the pipeline's received activations require a gradient, so a frozen unit
    there still back-propagates to its input; without `frozen_grad`, fwd)."""

    def frozen(u: int) -> float:
        return fwd[u] if frozen_grad is None or plan.stage_of_unit(u) == 0 else frozen_grad[u]

    return [
        0.0 if u < plan.cached_units else frozen(u) if u < plan.frozen_units else fb[u] + recompute * fwd[u]
        for u in range(plan.num_units)
    ]


def adapter_seconds(fb: Sequence[float], frozen_grad: Sequence[float], share: Sequence[float]) -> tuple[list, int]:
    """Forward + backward seconds per sample of each unit when only the `share` of its weights trains (an
    adapter's: `ptrun.costs.adapters`), and how many leading units train nothing. A backward pass is the
    input gradient (`frozen_grad` less the forward) and the weight gradient, which is a matmul's second product
    and scales with the weights that take one: a LoRA unit costs about two forwards against full
    fine-tuning's three. A unit whose weights all train keeps `fb`."""
    out = [t if s == 1 else g + (t - g) * s for t, g, s in zip(fb, frozen_grad, share, strict=True)]
    return out, next((u for u, s in enumerate(share) if s > 0), len(share))


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
    crosses = any(
        cluster.node_of(plan.rank_of_stage(r, stage)) != cluster.node_of(plan.rank_of_stage(r, stage + 1))
        for r in range(plan.dp)
    )
    return (cluster.inter_gbs if crosses else cluster.intra_gbs) * GB


def stage_seconds(
    plan: Plan, work: Sequence[float], act_bytes: Sequence[float], micro: float, cluster: Cluster
) -> list[float]:
    """Micro-batch seconds of each stage: the cluster's fixed overhead, compute, plus the output sent on and
    its gradient received back, each a message of `link_latency_s` plus its bytes (assumption 2). The
    gradient comes back even to a frozen stage: the next stage's received activations require one."""
    out = []
    for s, compute in enumerate(stage_sums(plan.stage_bounds, list(work))):
        hi = plan.stage_bounds[s][1]
        last = s == plan.num_stages - 1
        transfer = (
            0.0
            if last
            else 2 * (cluster.link_latency_s + micro * act_bytes[hi - 1] / boundary_bandwidth(plan, s, cluster))
        )
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
    if not plan.flushing:
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


def step_time(
    plan: Plan, costs: ModelCosts, cluster: Cluster, cfg: PtrunConfig, per_replica: int, samples: int, filled: int
) -> StepTime:
    """One optimizer step under `plan` with `per_replica` samples a replica; `filled` is the cache depth
    the entries hold when the epoch starts (0: nothing cached yet)."""
    fb, fwd = unit_seconds(costs, cluster)
    frozen_grad = frozen_grad_seconds(costs, cluster)
    fb, untrained = adapter_seconds(fb, frozen_grad, trained_share(costs, cfg))
    # Units below the lowest that trains run as a frozen prefix does (forward only on the first stage).
    priced = replace(plan, frozen_units=untrained) if untrained > plan.frozen_units else plan
    work = unit_work(priced, fb, fwd, recompute=recomputes(cfg.pipe.recompute), frozen_grad=frozen_grad)
    stages = stage_seconds(plan, work, costs.act_bytes, per_replica / plan.microbatches, cluster)
    pipe = pipeline_seconds(plan, stages)
    allreduce = allreduce_seconds(plan, trained_params(costs, cfg), cluster)
    # Every rank's loading thread loads its replica batch's raw samples, except a first stage the cache
    # serves: it reads the entries instead (and loads raw samples only for the misses of a fill from scratch).
    raw = cluster.loader_batch_s + (per_replica / cluster.loader_samples_s if cluster.loader_samples_s else 0.0)
    first_raw, read, fill = raw, 0.0, 0.0
    c = plan.cached_units
    if c:
        stored = CACHE_DTYPE_BYTES[cache_dtype(cfg.cache.dtype, cfg.train.precision)]
        entry = costs.act_bytes[c - 1] * stored / FP32
        io = (
            cache_io_seconds(
                per_replica * entry,
                cache_memory_share(cfg, cluster, entry, samples),
                cache_readers(plan, cluster),
                cluster,
            )
            + per_replica * cluster.cache_sample_s
        )
        start = filled if filled <= c else 0
        read = cluster.cache_batch_s + (io if start else 0.0)
        first_raw = 0.0 if start else raw
        fill = per_replica * math.fsum(fwd[start:c]) + io if start < c else 0.0
    loading = max(first_raw + read, raw if plan.pp > 1 else 0.0)  # the ranks load side by side
    busy = fill + pipe
    update = update_seconds(plan, costs)
    total = (
        (max(loading, busy) if cluster.overlap_io else loading + busy)
        + allreduce
        + max(update)
        + cluster.step_overhead_s
    )
    cpu = (
        plan.microbatches * math.fsum(stages)
        + fill
        + math.fsum(update)
        + first_raw
        + read
        + (plan.pp - 1) * raw
        + plan.pp * cluster.step_overhead_s
    )
    slowdown = sharing_slowdown(plan, cluster, cpu, total)
    return StepTime(tuple(stages), pipe, allreduce, read, fill, raw, max(update), slowdown, total * slowdown)


__all__ = [
    "StepTime",
    "adapter_seconds",
    "allreduce_seconds",
    "boundary_bandwidth",
    "cache_io_seconds",
    "cache_memory_share",
    "cache_readers",
    "frozen_grad_seconds",
    "pipeline_seconds",
    "sharing_slowdown",
    "stage_seconds",
    "step_time",
    "unit_seconds",
    "unit_work",
    "update_seconds",
]
