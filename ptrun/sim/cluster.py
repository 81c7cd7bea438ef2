"""The machines a plan is projected onto: device speed, links, host memory for AutoCache.

Presets (`PRESETS`), and why their numbers:

`paper`: the paper's testbed (SPEC section 5), 2 nodes x 8 Quadro RTX 5000 (16 GB), InfiniBand 5 GB/s.
- Peak fp32 11.2 TFLOP/s (3,072 CUDA cores x 1.815 GHz boost x 2). The paper trained in fp32 (no mixed
  precision is mentioned, the released code has none), so tensor cores do not count.
- Achieved 35% of that, 3.9 TFLOP/s. fp32 SGEMM on Turing reaches 50-70% of peak on large matrices, and a
  training step (the memory-bound kernels between the GEMMs, launch gaps, 2021's Python-driven
  `torch.distributed.pipeline.sync.Pipe`) loses about half of that. Checked against the paper: with this
  model, 35% gives ~350 samples/s for ViT-B/16 at K = 8, DP = 2, M = 16 (SPEC: "~400") and ~7,100 samples/s
  with one block training and the rest cached at K = 1, DP = 16 (SPEC: "~7,400 by epoch 9"). The released
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

`this_machine`: this container, 1 node x 2 CPU workers of one thread each (PLATFORM.md).
- Peak 80 GFLOP/s per one-thread worker (torch fp32 matmul: 150-190 GFLOP/s on 2 threads); achieved 60%
  (ViT-tiny trained at 46 samples/s x 2.1 GFLOP = 97 GFLOP/s on 2 threads).
- 12 ms fixed per stage and micro-batch: the digits recipe's 2-stage 1F1B ran 380 samples/s at M = 2 and
  240 at M = 4 (batch 16), i.e. 42 and 67 ms a step, ~12 ms per micro-batch slot either way; its compute
  is under 2 ms.
- Loopback gloo ~2.5 GB/s between the workers for large tensors (there is no second node: inter = intra;
  smaller messages get less: 0.8 MB took 0.74 ms). The cache is a memcpy from /dev/shm, 5 GB/s per
  worker; 23 GB of RAM, disk 1 GB/s; a layout change took 0.15-0.25 s on a 4-5 M parameter model. Reads
  are not overlapped with compute: the prefetch thread competes with the two busy workers for two cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Mapping

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

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def flops(self) -> float:
        """Achieved FLOP/s of one device."""
        return self.peak_tflops * 1e12 * self.efficiency

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node


PRESETS: dict[str, Cluster] = {
    "paper": Cluster("paper", nodes=2, gpus_per_node=8, peak_tflops=11.2, efficiency=0.35, intra_gbs=10.0,
                     inter_gbs=5.0, host_gbs=10.0, host_memory_gb=512.0, disk_gbs=2.0, transition_s=20.0,
                     microbatch_overhead_s=0.002),
    "this_machine": Cluster("this_machine", nodes=1, gpus_per_node=2, peak_tflops=0.08, efficiency=0.6,
                            intra_gbs=2.5, inter_gbs=2.5, host_gbs=5.0, host_memory_gb=23.0, disk_gbs=1.0,
                            transition_s=0.25, microbatch_overhead_s=0.012, overlap_io=False),
}

ZERO_OK = ("transition_s", "microbatch_overhead_s", "loader_samples_s")
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
