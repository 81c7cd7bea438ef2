"""Project a recipe's epochs onto a cluster: the real Controller plans, a small time model prices each plan.

Planning is not re-implemented here. The starting layout comes from `ptrun.layout.first.first_plan`
(given a stand-in model whose units hold meta-device parameters of the analytic sizes) and every later
layout from `Controller.decide`, the call the trainer makes at each epoch boundary, with the config of
each combination of the paper's Figure 9 (`COMBINATIONS`). Only the *time* of a plan is modelled.
`ptrun.sim.planning` gets the plans, `ptrun.sim.pricing` prices them; this module walks the epochs.

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
   the optimizer step); the slowest rank's update follows the pipeline. Under adapters (`adapter=lora`,
   `ptrun.costs.adapters`) a unit's backward is its input gradient plus the weight gradient of the share of
   its weights that trains (about 2 x forward), the units below the lowest adapter cost their forward only,
   and only the trained elements carry gradients, optimizer state (memory) and the all-reduce (assumption 3).
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
5. Epoch. Steps = ceil(samples / global batch), capped by `train.max_steps_per_epoch` (the trainer's
   `ptrun.auto.intervals.epoch_steps`), where the global batch is the Controller's: fixed, or per-pipeline
   batch x DP under `auto.batch=fixed_per_pipeline` (the paper's policy, so wider DP means fewer steps). A
   layout change at an epoch boundary costs `Cluster.transition_s`. Evaluation and start-up are not counted;
   loading raw samples costs `loader_batch_s` + per_replica / `loader_samples_s` in the prefetch thread (0,
   the GPU preset's value, means the input pipeline always keeps up). `step_overhead_s` is added to every
   step.
6. Freezing. Decisions fall where the trainer's do (`ptrun.auto.intervals`: every `freeze.every` epochs, or
   `freeze.every_steps` steps of the first layout's epoch). No gradient norms or weights exist in a
   simulation: `pipetransformer` is replaced by the closed form of its first term (`alpha`, the paper's
   schedule and what the released code ran); `autofreeze` and `plasticity` cannot be simulated.
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
from collections.abc import Sequence
from dataclasses import dataclass

from ptrun.auto.controller import Controller
from ptrun.auto.intervals import epoch_steps
from ptrun.config import ConfigError, PtrunConfig
from ptrun.costs.units import ModelCosts
from ptrun.layout.plan import Plan
from ptrun.sim.cluster import Cluster
from ptrun.sim.planning import (
    COMBINATIONS,
    DATASET_SAMPLES,
    combination_config,
    default_samples,
    device_budget,
    fit_memory,
    plan_epochs,
    plannable,
    stand_in,
    start_profile,
)
from ptrun.sim.pricing import (
    StepTime,
    allreduce_seconds,
    frozen_grad_seconds,
    pipeline_seconds,
    sharing_slowdown,
    stage_seconds,
    step_time,
    unit_seconds,
    unit_work,
    update_seconds,
)

PAPER_TABLE1 = {
    "vit_imagenet": (2.83, 26 * 3600 + 30 * 60, 9 * 3600 + 21 * 60),
    "vit_cifar100": (2.44, 35 * 60 + 6, 12 * 60 + 23),
    "bert_squad": (2.10, 5 * 3600 + 7 * 60, 2 * 3600 + 26 * 60),
}
"""Recipe -> (speedup, baseline seconds, PipeTransformer seconds) of the paper's Table 1."""

PAPER_FIG9 = {"vit_imagenet": {"freeze": 0.95, "freeze+pipe+cache": 1.26, "freeze+pipe+dp": 2.27, "all": 2.83}}
"""The paper's Figure 9 speedups (ViT-B/16 on ImageNet)."""


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    plan: Plan
    global_batch: int
    steps: int
    step: StepTime
    transition_s: float
    time_s: float


def epoch_records(
    plans: Sequence[Plan], controller: Controller, costs: ModelCosts, cluster: Cluster, cfg: PtrunConfig, samples: int
) -> list[EpochRecord]:
    """Price each epoch's plan (assumption 5)."""
    records, filled, prev = [], 0, None
    for epoch, plan in enumerate(plans):
        batch = controller.global_batch(plan)
        steps = epoch_steps(samples, batch, cfg.train.max_steps_per_epoch)
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
    controller, plans = plan_epochs(costs, cluster, cfg, samples)
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


__all__ = [
    "COMBINATIONS",
    "DATASET_SAMPLES",
    "EpochRecord",
    "PAPER_FIG9",
    "PAPER_TABLE1",
    "StepTime",
    "allreduce_seconds",
    "combination_config",
    "default_samples",
    "device_budget",
    "epoch_records",
    "fit_memory",
    "frozen_grad_seconds",
    "pipeline_seconds",
    "plan_epochs",
    "plannable",
    "sharing_slowdown",
    "simulate",
    "simulate_one",
    "speedups",
    "stage_seconds",
    "stand_in",
    "start_profile",
    "step_time",
    "total_seconds",
    "unit_seconds",
    "unit_work",
    "update_seconds",
]
