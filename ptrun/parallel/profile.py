"""Per-unit costs measured on this device: forward + backward time and output activation size.

The `time` and `pipedream` partitioners balance stages by these. Every rank measures, then the times are
averaged over all ranks with one all-reduce, so every rank holds bitwise the same vector and computes the
same partition (ranks that disagreed on a boundary would deadlock in the pipeline).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ptrun.models.layered import LayeredModel


@dataclass(frozen=True)
class UnitProfile:
    time_s: list[float]
    """Forward + backward seconds per unit for one micro-batch."""
    activation_bytes: list[float]
    """Bytes of each unit's output (what crosses a stage boundary placed after it)."""


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _leaf_inputs(carry: tuple) -> tuple:
    """Detached copies; the first floating tensor (the hidden state) needs a gradient, like a stage input."""
    out = []
    for k, t in enumerate(carry):
        t = t.detach()
        if k == 0 and t.is_floating_point():
            t.requires_grad_(True)
        out.append(t)
    return tuple(out)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_units(layered: LayeredModel, inputs: tuple, device: torch.device, repeats: int = 3) -> UnitProfile:
    """Time each unit's forward and backward on `inputs` (one micro-batch, already on `device`); the
    median of `repeats` runs after one warm-up. Units run in train mode, as in training."""
    layered.train(True)
    times: list[float] = []
    sizes: list[float] = []
    carry = tuple(inputs)
    for unit in layered.units:
        samples = []
        for rep in range(repeats + 1):
            x = _leaf_inputs(carry)
            _sync(device)
            t0 = time.perf_counter()
            out = _as_tuple(unit(*x))
            head = out[0]
            if head.requires_grad:
                head.backward(torch.ones_like(head))
            _sync(device)
            if rep:
                samples.append(time.perf_counter() - t0)
        unit.zero_grad(set_to_none=True)
        times.append(sorted(samples)[len(samples) // 2])
        sizes.append(float(sum(t.numel() * t.element_size() for t in out)))
        carry = tuple(t.detach() for t in out)
    return UnitProfile(times, sizes)


def agree(profile: UnitProfile, device: torch.device) -> UnitProfile:
    """The mean profile over all ranks, identical on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return profile
    t = torch.tensor(profile.time_s, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    return UnitProfile(t.tolist(), list(profile.activation_bytes))


def measure_bandwidth(device: torch.device, nbytes: int = 4 << 20, repeats: int = 3) -> float:
    """Point-to-point bytes/s from rank 0 to rank 1 (what a stage boundary pays), the same on every rank.
    One rank alone has no boundary to cross: infinity."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return float("inf")
    rank = dist.get_rank()
    buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    result = torch.zeros((), dtype=torch.float64, device=device)
    if rank in (0, 1):
        samples = []
        for _ in range(repeats + 1):
            _sync(device)
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, dst=1)
                dist.recv(result, src=1)  # the echo makes the timing end when the data has arrived
            else:
                dist.recv(buf, src=0)
                dist.send(result, dst=0)
            _sync(device)
            samples.append(time.perf_counter() - t0)
        if rank == 0:
            result.fill_(nbytes / sorted(samples[1:])[len(samples[1:]) // 2])
    dist.broadcast(result, src=0)
    return float(result.item())
