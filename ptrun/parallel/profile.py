"""Per-unit costs measured on this device: forward + backward time and output activation size.

The `time` and `pipedream` partitioners balance stages by these. Every rank measures, then the times are
averaged over all ranks with one all-reduce, so every rank holds bitwise the same vector and computes the
same partition (ranks that disagreed on a boundary would deadlock in the pipeline).

With `detail=True` (what `ptrun plan --profile` and benchmarks/cpu_costs.py use) two more times per
unit are measured, the ones a frozen unit costs in a pipeline stage:
- `forward_s`: the forward alone under no_grad (a frozen unit whose input carries no gradient: the first
  stage's frozen prefix, or AutoCache computing a prefix);
- `frozen_s`: forward + backward with the unit's parameters frozen and its input requiring a gradient (a
  frozen unit on a later stage: the pipeline marks received activations as requiring a gradient, so the
  unit still back-propagates the input gradient, without weight gradients).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ptrun.models.layered import LayeredModel
from ptrun.models.lazy import borrowed


@dataclass(frozen=True)
class UnitProfile:
    time_s: list[float]
    """Forward + backward seconds per unit for one micro-batch."""
    activation_bytes: list[float]
    """Bytes of each unit's output (what crosses a stage boundary placed after it)."""
    forward_s: list[float] | None = None
    """Forward-only seconds under no_grad per unit for one micro-batch (`detail=True`; else None)."""
    frozen_s: list[float] | None = None
    """Forward + input-gradient backward seconds per unit with its parameters frozen (`detail=True`)."""


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


def _median_time(run, device: torch.device, repeats: int, setup=tuple, clock=time.perf_counter) -> float:
    """Median seconds of `run(*setup())` over `repeats` calls after one warm-up (`setup` is not timed)."""
    samples = []
    for rep in range(repeats + 1):
        args = setup()
        _sync(device)
        t0 = clock()
        run(*args)
        _sync(device)
        if rep:
            samples.append(clock() - t0)
    return sorted(samples)[len(samples) // 2]


def profile_units(
    layered: LayeredModel,
    inputs: tuple,
    device: torch.device,
    repeats: int = 3,
    detail: bool = False,
    clock=time.perf_counter,
) -> UnitProfile:
    """Time each unit's forward and backward on `inputs` (one micro-batch, already on `device`); the
    median of `repeats` runs after one warm-up. Units run in train mode, as in training. With `detail`,
    also each unit's forward alone (no_grad) and its forward + input-gradient backward with its parameters
    frozen (see the module docstring); the parameters' `requires_grad` flags end as they were. `clock`:
    wall time by default; `time.process_time` (CPU devices) counts only this process's own CPU seconds, what
    the units cost on a core of their own even while other jobs share the machine."""
    layered.train(True)
    times: list[float] = []
    sizes: list[float] = []
    forward: list[float] = []
    frozen: list[float] = []
    carry = tuple(inputs)
    for i, unit in enumerate(layered.units):
        with borrowed(layered, [i]):  # a unit without values (a lazy model) has them while it is timed
            out: tuple = ()

            def unit_step(*x, unit=unit):
                nonlocal out
                out = _as_tuple(unit(*x))
                head = out[0]
                if head.requires_grad:
                    head.backward(torch.ones_like(head))

            def leaves(carry=carry):
                return _leaf_inputs(carry)

            times.append(_median_time(unit_step, device, repeats, leaves, clock))
            unit.zero_grad(set_to_none=True)
            sizes.append(float(sum(t.numel() * t.element_size() for t in out)))
            if detail:

                def forward_only(unit=unit, carry=carry):
                    with torch.no_grad():
                        unit(*carry)

                forward.append(_median_time(forward_only, device, repeats, clock=clock))
                flags = [(p, p.requires_grad) for p in unit.parameters()]
                for p, _ in flags:
                    p.requires_grad_(False)
                try:
                    frozen.append(_median_time(unit_step, device, repeats, leaves, clock))
                finally:
                    for p, flag in flags:
                        p.requires_grad_(flag)
            carry = tuple(t.detach() for t in out)
    return UnitProfile(times, sizes, forward if detail else None, frozen if detail else None)


def agree(profile: UnitProfile, device: torch.device) -> UnitProfile:
    """The mean profile over all ranks, identical on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return profile
    parts = [v for v in (profile.time_s, profile.forward_s, profile.frozen_s) if v is not None]
    t = torch.tensor([x for v in parts for x in v], dtype=torch.float64, device=device)
    dist.all_reduce(t)  # one collective for all the vectors (every rank measured the same ones)
    t /= dist.get_world_size()
    n = len(profile.time_s)
    mean = [t[i * n : (i + 1) * n].tolist() for i in range(len(parts))]
    return UnitProfile(mean[0], list(profile.activation_bytes), *(mean[1:] if len(mean) == 3 else (None, None)))


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
