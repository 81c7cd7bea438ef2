"""Evaluation: the eval split's loss (and top-1) over every worker, and the data source's own metrics (GLUE's,
SQuAD's) from every output."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist

from ptrun.data.splits import DataSplits
from ptrun.models.losses import TOKEN_TASKS, loss_weight, per_sample_loss


@torch.no_grad()
def evaluate(
    runtime,
    batches: Iterable[tuple[dict, tuple, torch.Tensor]],
    data: DataSplits,
    task: str,
    device: torch.device,
    is_main: bool,
) -> dict:
    """Collective. `batches` yields this rank's eval batches as (batch, inputs, target). The loss is a mean
    over samples, or for a token task over the predicted tokens (as in training); a causal LM adds its
    perplexity, exp(loss)."""
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, correct, samples, loss denominator
    # A task's own metrics (GLUE's, SQuAD's) need every eval output at once: (sample ids, outputs) of the
    # real samples
    outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for batch, inputs, target in batches:
        out = runtime.forward_only(inputs, target)
        if out is None:
            continue
        if data.metrics is not None:
            real = batch["weight"] > 0
            outputs.append((batch["index"][real], out[real.to(out.device)].float().cpu()))
        weight = target[:, -1].double()
        sums[0] += (per_sample_loss(out, target, task).double() * weight).sum()
        if task == "classification":
            sums[1] += ((out.argmax(-1) == target[:, 0]).double() * weight).sum()
        sums[2] += weight.sum()
        sums[3] += loss_weight(target, task)
    dist.all_reduce(sums)
    loss, correct, count, denominator = sums.tolist()
    assert int(count) == len(data.eval), f"evaluated {count} samples, expected {len(data.eval)}"
    result = {"loss": loss / denominator if task in TOKEN_TASKS else loss / count}
    if task == "causal_lm":
        result["perplexity"] = math.exp(min(result["loss"], 700.0))  # exp overflows a float beyond ~709
    if task == "classification":
        result["top1"] = 100.0 * correct / count
    if data.metrics is not None:
        result.update(task_metrics(outputs, data, is_main))
    return result


def task_metrics(outputs: list[tuple[torch.Tensor, torch.Tensor]], data: DataSplits, is_main: bool) -> dict:
    """Collective: the data source's metrics (`DataSplits.metrics`) from every last stage's outputs; computed
    on rank 0 and shared."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, outputs)
    box: list = [None]
    if is_main:
        pairs = [pair for part in gathered for pair in part]
        ids = torch.cat([i for i, _ in pairs])
        order = ids.argsort()
        values = torch.cat([o for _, o in pairs])[order]
        assert torch.equal(ids[order], torch.arange(len(data.eval))), "eval outputs do not cover the set"
        box[0] = data.metrics(values, data.eval)
    dist.broadcast_object_list(box, src=0)
    return box[0]
