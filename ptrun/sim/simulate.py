"""Project a recipe's epochs onto a cluster: the real Controller plans, a small time model prices each plan.

Planning is not re-implemented here. The starting layout comes from `ptrun.parallel.layout.first_plan`
(given a stand-in model whose units hold meta-device parameters of the analytic sizes) and every later
layout from `Controller.decide`, the call the trainer makes at each epoch boundary, with the config of
each combination of the paper's Figure 9 (`COMBINATIONS`). Only the *time* of a plan is modelled.

The time model and its assumptions
----------------------------------
1. Compute. A unit's forward time per sample is its matmul FLOPs over the device's achieved FLOP/s
   (`Cluster.flops`), or a measured profile's forward + backward time / 3. A trainable unit costs forward +
   backward = 3 x forward (backward computes input and weight gradients, 2 x forward). A frozen unit that
   still runs in a stage costs its forward only (1 x: no gradients, run under no_grad). With `pipe.recompute`
   a trainable unit runs its forward once more in backward (4 x). A unit served by AutoCache costs nothing in
   the pipeline. Compute is linear in the micro-batch size: no efficiency loss for small GEMMs (the only fixed
   cost is assumption 2's per micro-batch overhead).
2. Pipeline. A stage's micro-batch time is the cluster's fixed `microbatch_overhead_s`, plus its units'
   compute for one micro-batch, plus sending its output to the next stage (and receiving the gradient back,
   when the stage trains something), at the intra-node bandwidth, or the inter-node one where consecutive
   stages sit on different nodes. A rank holding several stages (looped or V schedules) runs them one after
   the other. A step of M micro-batches over K ranks takes (M + K - 1) x the slowest rank's micro-batch time
   (GPipe's fill and drain; 1F1B has the same bubble; interleaved schedules do better, so this is an upper
   bound for them).
3. Data parallelism. After the pipeline, each stage's replicas all-reduce the gradients of its trainable
   parameters (fp32, ptrun's manual all-reduce after `schedule.step()`, not overlapped) with a ring:
   2(DP-1)/DP x bytes / bandwidth. If a stage's replicas span nodes, the rings of all K stages share each
   node's one inter-node link, so the time is that factor x all trainable bytes / inter-node bandwidth; within
   a node, the largest stage's bytes / intra-node bandwidth.
4. AutoCache. The first stage of each replica reads its batch's cached activations (the output of the cached
   prefix, in `cache.dtype`) from the node's memory at `Cluster.host_gbs` per device, or from the disk tier at
   the node's `disk_gbs` shared by the node's replicas, for the share of samples beyond `cache.max_memory` of
   the node's RAM. Every node caches the whole training set (samples are reshuffled over all replicas every
   epoch). Reads happen in the loader's prefetch thread during the previous step (`overlap_io`): the step
   takes the longer of loading + reading and the compute. In an epoch whose cached depth C is deeper than what
   the cache holds (depth d < C, or nothing), the first stage also runs units [d, C) forward on the batch and
   writes the results (AutoCache's incremental update) before the pipeline starts; that is not overlapped.
5. Epoch. Steps = ceil(samples / global batch), where the global batch is the Controller's: fixed, or
   per-pipeline batch x DP under `auto.batch=fixed_per_pipeline` (the paper's policy, so wider DP means fewer
   steps). A layout change at an epoch boundary costs `Cluster.transition_s`. Evaluation and start-up are not
   counted; loading raw samples costs per_replica / `loader_samples_s` in the prefetch thread (0, the presets'
   value, means the input pipeline always keeps up).
6. Freezing. No gradient norms exist in a simulation: a policy that reads them (`pipetransformer`) is replaced
   by the closed form of its first term (`alpha`, the paper's schedule and what the released code ran);
   `autofreeze` cannot be simulated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Optional, Sequence

from ptrun.auto.controller import Controller
from ptrun.config import ConfigError, PtrunConfig, parse_memory
from ptrun.parallel.layout import NEEDS_PROFILE, first_plan, param_costs
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
    """The loading thread's time for a replica batch (0 when the loader is never the limit)."""
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


def plannable(cfg: PtrunConfig) -> PtrunConfig:
    """`cfg` with a freeze policy that needs no gradient norms (assumption 6)."""
    if cfg.freeze.policy == "autofreeze" and cfg.auto.freeze:
        raise ConfigError("freeze.policy='autofreeze' is not allowed: it needs measured gradient norms; "
                          "simulate with alpha, linear, schedule or none")
    if cfg.freeze.policy == "pipetransformer":
        return replace(cfg, freeze=replace(cfg.freeze, policy="alpha"))
    return cfg


def combination_config(cfg: PtrunConfig, name: str) -> PtrunConfig:
    """`cfg` with the `auto.*` switches of one Figure-9 combination."""
    return replace(cfg, auto=replace(cfg.auto, **COMBINATIONS[name][1]))


def stand_in(costs: ModelCosts) -> SimpleNamespace:
    """What `first_plan` and `param_costs` read of a LayeredModel: units whose parameters have the analytic
    sizes (meta-device tensors: no memory)."""
    import torch
    from torch import nn

    units = []
    for n in costs.params:
        unit = nn.Module()
        unit.weight = nn.Parameter(torch.empty(int(n), device="meta"))
        units.append(unit)
    return SimpleNamespace(units=units)


def profile_kwargs(cfg: PtrunConfig, costs: ModelCosts, cluster: Cluster) -> dict:
    """For the time-based partitioners, the profile the trainer would measure: one micro-batch's forward +
    backward seconds and output bytes per unit, and the stage link's bandwidth. Empty for the others."""
    if cfg.pipe.partition not in NEEDS_PROFILE:
        return {}
    dp = cluster.world_size // cfg.pipe.length
    micro = max(1, cfg.train.global_batch_size // dp // cfg.pipe.microbatches)
    fb, _ = unit_seconds(costs, cluster)
    return dict(time_costs=[t * micro for t in fb], activation=[a * micro for a in costs.act_bytes],
                bandwidth=cluster.intra_gbs * GB)


def plan_epochs(costs: ModelCosts, cluster: Cluster, cfg: PtrunConfig) -> tuple[Controller, list[Plan]]:
    """The Controller for `cfg` on `cluster`'s world, and the Plan of every epoch as the trainer gets them
    (`first_plan`, then `decide` before each later epoch, without gradient norms)."""
    cfg = plannable(cfg)
    layered = stand_in(costs)
    kwargs = profile_kwargs(cfg, costs, cluster)
    prof = SimpleNamespace(time_s=kwargs["time_costs"], activation_bytes=kwargs["activation"]) if kwargs else None
    first = first_plan(cfg.pipe, layered, cluster.world_size, profile=prof, bandwidth=kwargs.get("bandwidth"))
    controller = Controller(cfg, costs.num_blocks, param_costs(layered), first, kwargs)
    plans = [first]
    for epoch in range(1, cfg.train.epochs):
        plans.append(controller.decide(epoch, plans[-1], None))
    return controller, plans


# ---- pricing a plan --------------------------------------------------------------------------------------


def unit_seconds(costs: ModelCosts, cluster: Cluster) -> tuple[list[float], list[float]]:
    """(forward + backward, forward) seconds per sample of each unit on one device (assumption 1)."""
    if costs.fb_seconds is not None:
        return list(costs.fb_seconds), [t / 3 for t in costs.fb_seconds]
    fwd = [f / cluster.flops for f in costs.fwd_flops or ()]
    return [3 * t for t in fwd], fwd


def unit_work(plan: Plan, fb: Sequence[float], fwd: Sequence[float], recompute: bool = False) -> list[float]:
    """Seconds per sample each unit costs in the pipeline: trainable fb (plus another forward with
    `pipe.recompute`), frozen fwd, cached 0."""
    return [0.0 if u < plan.cached_units else fwd[u] if u < plan.frozen_units else fb[u] + recompute * fwd[u]
            for u in range(plan.num_units)]


def boundary_bandwidth(plan: Plan, stage: int, cluster: Cluster) -> float:
    """Bytes/s from stage `stage` to the next: inter-node if any replica's two ranks sit on different nodes."""
    crosses = any(cluster.node_of(plan.rank_of_stage(r, stage)) != cluster.node_of(plan.rank_of_stage(r, stage + 1))
                  for r in range(plan.dp))
    return (cluster.inter_gbs if crosses else cluster.intra_gbs) * GB


def stage_seconds(plan: Plan, work: Sequence[float], act_bytes: Sequence[float], micro: float,
                  cluster: Cluster) -> list[float]:
    """Micro-batch seconds of each stage: the cluster's fixed overhead, compute, plus the output sent on
    and, if the stage trains, the gradient received back (assumption 2)."""
    out = []
    for s, compute in enumerate(stage_sums(plan.stage_bounds, list(work))):
        hi = plan.stage_bounds[s][1]
        moves = 0 if s == plan.num_stages - 1 else 2 if hi > plan.frozen_units else 1
        transfer = moves * act_bytes[hi - 1] / boundary_bandwidth(plan, s, cluster) if moves else 0.0
        out.append(cluster.microbatch_overhead_s + micro * (compute + transfer))
    return out


def pipeline_seconds(plan: Plan, stage_s: Sequence[float]) -> float:
    """(M + K - 1) x the slowest rank's micro-batch time; a rank runs its stages one after the other."""
    per_rank = [math.fsum(stage_s[i] for i in plan.local_stages(r)) for r in range(plan.pp)]
    return (plan.microbatches + plan.pp - 1) * max(per_rank)


def allreduce_seconds(plan: Plan, params: Sequence[float], cluster: Cluster) -> float:
    """Ring all-reduce of each pipeline position's trainable fp32 gradients over its DP group (assumption 3)."""
    if plan.dp == 1:
        return 0.0
    trainable = [FP32 * p if u >= plan.frozen_units else 0.0 for u, p in enumerate(params)]
    per_stage = stage_sums(plan.stage_bounds, trainable)
    per_rank = [math.fsum(per_stage[i] for i in plan.local_stages(r)) for r in range(plan.pp)]
    ring = 2 * (plan.dp - 1) / plan.dp
    spans = any(len({cluster.node_of(rank) for rank in plan.stage_ranks(r)}) > 1 for r in range(plan.pp))
    if spans:
        return ring * math.fsum(per_rank) / (cluster.inter_gbs * GB)
    return ring * max(per_rank) / (cluster.intra_gbs * GB)


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
    work = unit_work(plan, fb, fwd, recompute=cfg.pipe.recompute != "none")
    stages = stage_seconds(plan, work, costs.act_bytes, per_replica / plan.microbatches, cluster)
    pipe = pipeline_seconds(plan, stages)
    allreduce = allreduce_seconds(plan, costs.params, cluster)
    read = fill = 0.0
    c = plan.cached_units
    if c:
        stored = PRECISION_BYTES[cfg.train.precision] if cfg.cache.dtype == "auto" else CACHE_DTYPE_BYTES[cfg.cache.dtype]
        entry = costs.act_bytes[c - 1] * stored / FP32
        io = cache_io_seconds(per_replica * entry, cache_memory_share(cfg, cluster, entry, samples),
                              cache_readers(plan, cluster), cluster)
        start = filled if filled <= c else 0
        read = io if start else 0.0
        fill = per_replica * math.fsum(fwd[start:c]) + io if start < c else 0.0
    load = per_replica / cluster.loader_samples_s if cluster.loader_samples_s else 0.0
    busy = fill + pipe
    total = (max(load + read, busy) if cluster.overlap_io else load + read + busy) + allreduce
    return StepTime(tuple(stages), pipe, allreduce, read, fill, load, total)


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


# ---- the report the CLI prints ---------------------------------------------------------------------------


def hms(seconds: float) -> str:
    s = round(seconds)
    h, m, s = s // 3600, s % 3600 // 60, s % 60
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{seconds:.1f}s"


LEGEND = ("frozen / cached: units of the model's prefix; stage max: the slowest stage's micro-batch time; allred: "
          "the gradient all-reduce of a step; cache: its cache read + fill; epoch: steps x step + a layout change")


def epoch_table(records: Sequence[EpochRecord]) -> str:
    """One line per epoch: the plan (K, DP, M, frozen and cached units) and its estimated time."""
    head = (f"{'epoch':>5} {'frozen':>7} {'cached':>6} {'K':>2} {'DP':>3} {'M':>3} {'batch':>6} {'steps':>6} "
            f"{'stage max':>9} {'allred':>7} {'cache':>7} {'step':>7} {'samples/s':>9} {'epoch':>10}")
    lines = [head]
    for r in records:
        p, st = r.plan, r.step
        per_s = r.steps * r.global_batch / max(r.time_s - r.transition_s, 1e-12)
        lines.append(
            f"{r.epoch:>5} {p.frozen_units:>3}/{p.num_units:<3} {p.cached_units:>6} {p.pp:>2} {p.dp:>3} "
            f"{p.microbatches:>3} {r.global_batch:>6} {r.steps:>6} {1e3 * max(st.stage_s):>7.1f}ms "
            f"{1e3 * st.allreduce_s:>5.0f}ms {1e3 * (st.cache_read_s + st.cache_fill_s):>5.0f}ms "
            f"{st.total_s:>6.2f}s {per_s:>9.0f} {hms(r.time_s):>10}")
    lines.append(f"{'total':>5} {hms(total_seconds(records))}")
    return "\n".join(lines)


def summary(recipe: Optional[str], results: dict[str, list[EpochRecord]]) -> str:
    """Table 1 and Figure 9 in the paper's shape, the paper's numbers beside ours where it has them."""
    up = speedups(results)
    base, ours = total_seconds(results["baseline"]), total_seconds(results["all"])
    t1 = PAPER_TABLE1.get(recipe or "")
    lines = [f"Table 1 ({recipe}):          simulated      paper"]
    lines.append(f"  baseline time        {hms(base):>12} {hms(t1[1]) if t1 else '-':>10}")
    lines.append(f"  PipeTransformer time {hms(ours):>12} {hms(t1[2]) if t1 else '-':>10}")
    lines.append(f"  speedup              {up['all']:>11.2f}x {f'{t1[0]:.2f}x' if t1 else '-':>10}")
    fig = PAPER_FIG9.get(recipe or "", {})
    lines.append("Figure 9 (speedup over the baseline):  simulated   paper")
    for name, (label, _) in COMBINATIONS.items():
        if name != "baseline":
            paper = f"{fig[name]:.2f}x" if name in fig else "-"
            lines.append(f"  {label:<38} {up[name]:>6.2f}x {paper:>7}")
    return "\n".join(lines)


def report(recipe: Optional[str], results: dict[str, list[EpochRecord]]) -> str:
    """The per-combination tables, then the summary."""
    parts = [LEGEND]
    for name, records in results.items():
        label, switches = COMBINATIONS[name]
        flags = " ".join(f"{k}={'on' if v else 'off'}" for k, v in switches.items())
        parts.append(f"== {label}  [auto: {flags}]\n{epoch_table(records)}")
    parts.append(summary(recipe, results))
    return "\n\n".join(parts)


__all__ = ["COMBINATIONS", "DATASET_SAMPLES", "EpochRecord", "PAPER_FIG9", "PAPER_TABLE1", "StepTime",
           "allreduce_seconds", "combination_config", "default_samples", "epoch_records", "pipeline_seconds",
           "plan_epochs", "report", "simulate", "simulate_one", "speedups", "stage_seconds", "step_time",
           "summary", "total_seconds", "unit_seconds"]
