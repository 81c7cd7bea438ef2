"""Mixed-precision cases run inside real worker processes (imported by name by the spawned workers).

bf16: two steps of a 2-stage pipeline under `compute_dtype=bfloat16`, saving the parameters, the losses, the
dtype that crossed the stage boundary and the dtypes of the master weights and optimizer state.

fp16: a K = 2 x DP = 2 job where exactly one rank's gradients are made infinite in a backward pass (the
injected overflow); every rank saves whether it stepped, its loss scale and its parameters after each step.
Then a scale far too large for fp16 (2^32) overflows for real, and the job must skip until it fits.
"""

from __future__ import annotations

from pathlib import Path

import pipeline_cases as pc
import torch
import torch.distributed as dist
from helpers import process_group

from ptrun.auto.autodp import Builder, build_engine, optimizer_state_by_name
from ptrun.config import OptimConfig
from ptrun.layout.plan import Plan
from ptrun.models.losses import WeightedLoss, loss_weight, make_target
from ptrun.numerics.precision import LossScaler
from ptrun.train.state import TrainState
from ptrun.train.step import StepParts, train_step

CPU = torch.device("cpu")
SGD = OptimConfig(name="sgd", lr=0.1, momentum=0.9, weight_decay=0.0, schedule="constant", warmup_fraction=0.0)
"""SGD's update is linear in the gradient, so the bf16 comparison measures the gradients' rounding; AdamW's
first updates are about lr x sign(gradient), which turns tiny rounding on near-zero gradients into full-size
differences."""


def _layout(kind: str, pp: int, dp: int, rank: int, dtype: torch.dtype):
    layered = pc.model(kind)
    n = len(layered.units)
    plan = pc.even_plan(n, pp, dp, 2, "GPipe")
    name_of = {id(p): name for name, p in layered.model.named_parameters()}
    loss = WeightedLoss(pc.task(kind))
    layout = build_engine(Builder(layered, rank, CPU, loss, SGD, name_of, compute_dtype=dtype), plan)
    return layered, layout, loss, name_of


def _step_inputs(layered, plan: Plan, loss: WeightedLoss, kind: str, step: int, rank: int):
    """This rank's inputs and target of the step, and the global batch's loss denominator."""
    full = pc.batch(kind, step)
    denominator = float(loss_weight(make_target(full, loss.task), loss.task))
    replica, _ = plan.coords(rank)
    per = pc.GLOBAL_BATCH // plan.dp
    local = {k: v[replica * per : (replica + 1) * per] for k, v in full.items()}
    return tuple(local[k] for k in layered.input_names), make_target(local, loss.task), denominator


def step_or_skip(runtime, optimizer, scaler: LossScaler, clip: float) -> bool:
    """ptrun's update of one step (`train_step`) at SGD's constant learning rate; whether it stepped."""
    return train_step(TrainState(), 0.0, StepParts(runtime, optimizer, scaler, SGD, clip, total_steps=1))[1].stepped


def _held(layered, runtime) -> dict[str, torch.Tensor]:
    params = dict(layered.model.named_parameters())
    return {n: params[n].detach().clone() for u in runtime.unit_indices for n in layered.unit_param_names(u)}


def run_bf16(kind: str, rank: int, out_dir: Path) -> None:
    layered, layout, loss, name_of = _layout(kind, 2, 1, rank, torch.bfloat16)
    runtime = layout.runtime
    received: list[torch.dtype] = []
    if not runtime.is_first:  # what arrives from the previous stage
        runtime.modules[0].register_forward_pre_hook(lambda _, args: received.append(args[0].dtype))
    scaler = LossScaler(enabled=False)
    losses = []
    for step in range(pc.STEPS):
        inputs, target, denominator = _step_inputs(layered, layout.plan, loss, kind, step, rank)
        share = runtime.forward_backward(inputs, target, denominator).double()
        step_or_skip(runtime, layout.optimizer, scaler, pc.CLIP)
        dist.all_reduce(share)
        losses.append(share.item())
    optim = optimizer_state_by_name(layout.optimizer, name_of)
    saved = {
        "params": _held(layered, runtime),
        "losses": losses,
        "received": sorted(set(map(str, received))),
        "param_dtypes": sorted({str(p.dtype) for p in runtime.trainable_parameters()}),
        "state_dtypes": sorted(
            {str(v.dtype) for s in optim.values() for v in s.values() if torch.is_tensor(v) and v.ndim}
        ),
    }
    process_group.save_rank(saved, out_dir, f"bf16-{kind}", rank)
    layout.groups.destroy()


INJECT_RANK = 3  # replica 1's last stage: only this rank's own gradients overflow
INJECT_STEP = 1


def overflow(grad: torch.Tensor) -> torch.Tensor:
    """A gradient hook that makes one element of a micro-batch's gradient infinite."""
    grad = grad.clone()
    grad.view(-1)[0] = float("inf")
    return grad


def run_fp16(rank: int, out_dir: Path) -> None:
    layered, layout, loss, _ = _layout("vit", 2, 2, rank, torch.float16)
    runtime = layout.runtime
    scaler = LossScaler(enabled=True)
    rows = []
    for step in range(3):
        inputs, target, denominator = _step_inputs(layered, layout.plan, loss, "vit", step, rank)
        inject = None
        if step == INJECT_STEP and rank == INJECT_RANK:
            # In the backward pass, where an overflow happens: before the replicas' gradients are summed.
            inject = runtime.trainable_parameters()[0].register_hook(overflow)
        runtime.forward_backward(inputs, target, denominator, scaler.scale)
        if inject is not None:
            inject.remove()
        stepped = step_or_skip(runtime, layout.optimizer, scaler, pc.CLIP)
        rows.append({"stepped": stepped, "scale": scaler.scale, "params": _held(layered, runtime)})
    # A real overflow: with 2^32 the scaled gradients exceed fp16's 65504 in the backward pass itself.
    big = LossScaler(enabled=True, init_scale=2.0**32)
    verdicts = []
    for step in range(32):
        inputs, target, denominator = _step_inputs(layered, layout.plan, loss, "vit", step % pc.STEPS, rank)
        runtime.forward_backward(inputs, target, denominator, big.scale)
        verdicts.append(step_or_skip(runtime, layout.optimizer, big, pc.CLIP))
    finite = all(torch.isfinite(p).all().item() for p in runtime.trainable_parameters())
    saved = {"rows": rows, "verdicts": verdicts, "final_scale": big.scale, "finite": finite}
    process_group.save_rank(saved, out_dir, "fp16", rank)
    layout.groups.destroy()


def run_job(rank: int, job: str, out_dir: Path) -> None:
    if job == "bf16":
        for kind in ("vit", "bert"):
            run_bf16(kind, rank, out_dir)
    else:
        run_fp16(rank, out_dir)


def launch(job: str, nproc: int, out_dir: Path) -> None:
    process_group.launch(run_job, nproc, job, job, out_dir, minutes=5)
