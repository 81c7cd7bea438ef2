"""The machines a plan is projected onto: device speed, links, host memory for AutoCache.

Presets (`PRESETS`), and why their numbers:

`paper`: the paper's testbed, 2 nodes x 8 Quadro RTX 5000 (16 GB), InfiniBand 5 GB/s.
- Peak fp32 11.2 TFLOP/s (3,072 CUDA cores x 1.815 GHz boost x 2). The paper trained in fp32 (no mixed
  precision is mentioned, the released code has none), so tensor cores do not count.
- Achieved 35% of that, 3.9 TFLOP/s. fp32 SGEMM on Turing reaches 50-70% of peak on large matrices, and a
  training step (the memory-bound kernels between the GEMMs, launch gaps, 2021's Python-driven
  `torch.distributed.pipeline.sync.Pipe`) loses about half of that. Checked against the paper: with this
  model, 35% gives ~350 samples/s for ViT-B/16 at K = 8, DP = 2, M = 16 (the paper: "~400") and ~7,100 samples/s
  with one block training and the rest cached at K = 1, DP = 16 (the paper: "~7,400 by epoch 9"). The released
  repository's own log (pipe_transformer/log/Chunk_num_analysis.md) measured 180-210 images/s at K = 8,
  which with its M = K micro-batches means ~18%. Speedups hardly depend on this number (compute scales
  uniformly; 0.35 -> 0.40 moves ImageNet's from 2.76x to 2.74x); absolute times do.
- Intra-node 10 GB/s: PCIe 3.0 x16 peer copies (no NVLink in an 8-GPU server of this card). Inter-node
  5 GB/s, the paper's number, one NIC per node shared by all its GPUs.
- Host side for the cache: 10 GB/s per device (pinned host-to-device over PCIe 3.0 x16, ~12 GB/s peak);
  512 GB of RAM per node (a common 8-GPU server; the paper does not say) and a 2 GB/s NVMe disk tier per
  node. ImageNet's cached activations (1.28 M x 197 x 768 fp32 = 775 GB) do not fit half of that memory,
  so the disk tier matters there; CIFAR-100 (30 GB) and SQuAD fit.
- 20 s per layout change: the original logs show 4-18 s to load the model and 5-23 s to rebuild DDP.
- 2 ms fixed per stage and micro-batch (a guess: the copy to the next GPU and its synchronisation, and the
  schedule's Python loop); it moves the results by about 0.01x.
- The input pipeline is assumed to keep up (`loader_samples_s=0`); see docs/simulator.md for what a
  slow JPEG decoder would do.

`this_machine`: this container, 1 node x 2 CPU workers of one thread each (PLATFORM.md). The fixed costs come from
`python -m benchmarks.cpu_costs --out docs/results/cpu_costs_digits_vit.json --passes 7 --repeats 10`
(2026-11-22 12:20, the digits recipe's model; that file's `cluster` block), which also wrote the per-unit
profile to pass as `--profile docs/results/cpu_costs_digits_vit.json`. The machine was shared with another
benchmark (load ~3) while it ran: compute is in the workers' CPU seconds, messages the fastest of 10.
- 1.89 cores' worth for the two workers (`cores_per_node`): the whole model's forward + backward took 18.2
  ms of CPU on one worker alone and 19.3 ms on each of the two at once.
- 1.35 ms fixed per stage and micro-batch: a one-stage schedule step (K = 1, M = 1, micro-batch 8) took
  21.5 ms against 19.4 ms for its units alone (the schedule's bookkeeping, the loss, autograd's start).
  (It was 12 ms, fitted to the recipe's 380 / 240 samples/s at M = 2 / 4, which also held every cost the
  model had no term for: the update, the loading, the other jobs.)
- 0.51 ms per message and 3.8 GB/s (`link_latency_s`, `intra_gbs`): a gloo send + recv between the workers,
  half the fastest round trip, at 35 kB (0.52 ms) and 4 MB (1.62 ms). There is no second node: inter = intra.
  A gloo all-reduce of the 0.8 MB gradient took 0.90 ms (the model: 2 x 0.51 + 0.21 = 1.24 ms).
- 1.16 ms a batch + 1 / 4214 s a sample to load raw digits (`dataset[ids]`, HF datasets): 3.05 ms for 8,
  4.95 ms for 16. AutoCache hits: 1.06 ms a batch + 34 us an entry (`AutoCache.fetch` + `inputs`: 1.33 ms
  for 8, 1.61 ms for 16). Reads are not overlapped with compute: the prefetch thread competes with the
  two busy workers for two cores. The bytes go at `host_gbs` (a memcpy from /dev/shm, 5 GB/s).
- `background_load` 0: a machine to itself. The benchmarks ran beside other people's (the digits runs of
  /tmp/bench3 took 2.7-11.7 s for the same epoch and plan); benchmarks/simulator_check.py fits it per run.
- Not measured: `step_overhead_s` (the trainer's own Python per step) stays 0; the fit absorbs it.
- Without a profile the FLOP model prices compute: peak 80 GFLOP/s per one-thread worker (torch fp32
  matmul: 150-190 GFLOP/s on 2 threads), achieved 60% (ViT-tiny trained at 46 samples/s x 2.1 GFLOP = 97
  GFLOP/s on 2 threads). For the digits model it is 5x too fast (0.44 ms a sample against 2.4 measured:
  tiny units are dominated by per-op costs), so use the profile there.
- 23 GB of RAM, disk 1 GB/s; a layout change took 0.15-0.25 s on a 4-5 M parameter model (PLATFORM.md; the
  digits runs logged 0.05-0.27 s).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from ptrun.config import ConfigError

GB = 1e9


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: int
    gpus_per_node: int
    """Devices (worker processes) per node."""
    peak_tflops: float
    """Peak fp32 TFLOP/s of one device."""
    efficiency: float
    """Achieved fraction of the peak in training (matmul FLOPs / time)."""
    intra_gbs: float
    """GB/s between two devices of a node (stage boundaries, intra-node all-reduce)."""
    inter_gbs: float
    """GB/s of a node's link to the others, shared by all its devices."""
    host_gbs: float
    """GB/s per device between the node's memory and the device (AutoCache's memory tier)."""
    host_memory_gb: float
    """RAM per node; `cache.max_memory`'s share refers to it."""
    disk_gbs: float
    """GB/s of a node's disk, shared by its devices (AutoCache's disk tier)."""
    transition_s: float
    """Seconds a layout change costs (weights, optimizer state, groups, stages)."""
    microbatch_overhead_s: float = 0.0
    """Fixed seconds each stage spends per micro-batch whatever its size (launches, the schedule's
    bookkeeping, the latency of a send)."""
    loader_samples_s: float = 0.0
    """Samples per second one replica's loading thread delivers (decode, augment); 0 = never the limit."""
    overlap_io: bool = True
    """Loading and cache reads overlap the previous step's compute (the loader's prefetch thread)."""
    link_latency_s: float = 0.0
    """Seconds each message costs besides its bytes: a stage boundary's send of an activation or a gradient,
    and each of a ring all-reduce's 2(n - 1) steps."""
    device_memory_gb: float = 0.0
    """Memory of one device for `pipe.length=auto` (0: the host's memory shared by the node's devices)."""
    loader_batch_s: float = 0.0
    """Fixed seconds a loading thread spends per batch of raw samples (indexing, collation), besides
    `loader_samples_s`'s per-sample time."""
    cache_batch_s: float = 0.0
    """Fixed seconds per batch the first stage reads from AutoCache (its label lookup, unpacking)."""
    cache_sample_s: float = 0.0
    """Seconds per AutoCache entry read or written besides its bytes (the slot's lookup and checksum)."""
    step_overhead_s: float = 0.0
    """Fixed seconds per optimizer step outside the terms above (the trainer's own per-step work)."""
    cores_per_node: float = 0.0
    """CPU cores a node's workers run on when they are CPU processes (0: each worker has a device of its own
    and nothing is shared)."""
    background_load: float = 0.0
    """Runnable processes of other jobs on a node, on average, sharing `cores_per_node` with the workers."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def flops(self) -> float:
        """Achieved FLOP/s of one device."""
        return self.peak_tflops * 1e12 * self.efficiency

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    # What one device holds, as `ptrun.layout.fill.device_budget` reads it (`ptrun.layout.fill.DeviceMemory`).
    @property
    def gpu_bytes(self) -> int | None:
        """One device's memory (`device_memory_gb`); None where the cluster gives none."""
        return int(self.device_memory_gb * GB) if self.device_memory_gb else None

    @property
    def host_bytes(self) -> int:
        return int(self.host_memory_gb * GB)

    @property
    def workers_per_host(self) -> int:
        return self.gpus_per_node


PRESETS: dict[str, Cluster] = {
    "paper": Cluster(
        "paper",
        nodes=2,
        gpus_per_node=8,
        peak_tflops=11.2,
        efficiency=0.35,
        intra_gbs=10.0,
        inter_gbs=5.0,
        host_gbs=10.0,
        host_memory_gb=512.0,
        disk_gbs=2.0,
        transition_s=20.0,
        microbatch_overhead_s=0.002,
        device_memory_gb=32.0,
    ),
    "this_machine": Cluster(
        "this_machine",
        nodes=1,
        gpus_per_node=2,
        peak_tflops=0.08,
        efficiency=0.6,
        intra_gbs=3.8,
        inter_gbs=3.8,
        host_gbs=5.0,
        host_memory_gb=23.0,
        disk_gbs=1.0,
        transition_s=0.25,
        microbatch_overhead_s=0.00135,
        overlap_io=False,
        link_latency_s=0.00051,
        loader_batch_s=0.00116,
        loader_samples_s=4214.0,
        cache_batch_s=0.00106,
        cache_sample_s=3.4e-05,
        cores_per_node=1.89,
    ),
}

ZERO_OK = (
    "device_memory_gb",
    "transition_s",
    "microbatch_overhead_s",
    "loader_samples_s",
    "link_latency_s",
    "loader_batch_s",
    "cache_batch_s",
    "cache_sample_s",
    "step_overhead_s",
    "cores_per_node",
    "background_load",
)
"""Fields for which 0 is meaningful (no cost, no limit)."""


def _parse(name: str, kind: str, text: str):
    """One `cluster.NAME=TEXT` value, checked: integers >= 1; finite numbers > 0 (>= 0 for `ZERO_OK`,
    at most 1 for `efficiency`); booleans."""
    if kind == "bool":
        if text.lower() not in ("true", "false"):
            raise ConfigError(f"cluster.{name}={text!r} is not allowed: true or false")
        return text.lower() == "true"
    if kind == "int":
        value, allowed = (int(text) if text.isdigit() else 0), "an integer >= 1"
        ok = value >= 1
    else:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        zero = name in ZERO_OK
        allowed = f"a number {'>=' if zero else '>'} 0" + (" and <= 1" if name == "efficiency" else "")
        ok = math.isfinite(value) and (value >= 0 if zero else value > 0) and (name != "efficiency" or value <= 1)
    if not ok:
        raise ConfigError(f"cluster.{name}={text!r} is not allowed: {allowed}")
    return value


def get_cluster(name: str, overrides: Mapping[str, str] | None = None) -> Cluster:
    """A preset by name with `cluster.FIELD=VALUE` overrides (values as typed on the command line)."""
    if name not in PRESETS:
        raise ConfigError(f"cluster={name!r} is not allowed: one of {', '.join(PRESETS)}")
    kinds = {f.name: str(f.type) for f in fields(Cluster) if f.name != "name"}
    changes = {}
    for key, text in (overrides or {}).items():
        if key not in kinds:
            raise ConfigError(f"unknown key 'cluster.{key}' (cluster has: {', '.join(kinds)})")
        changes[key] = _parse(key, kinds[key], text)
    return replace(PRESETS[name], **changes)


__all__ = ["Cluster", "GB", "PRESETS", "get_cluster"]
