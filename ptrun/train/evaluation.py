"""The trainer's evaluation: the eval split's loss (and top-1) over every worker, the data source's own metrics
(GLUE's, SQuAD's) from every output, and the best eval so far. A mixin of `Trainer` (ptrun/train/trainer.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ptrun.models.losses import per_sample_loss


def metric_key(result: dict) -> str:
    """The eval number that ranks checkpoints: the GLUE score, SQuAD F1 or top-1 when there is one (higher
    is better), else the loss (lower is better)."""
    return next((k for k in ("score", "f1", "top1") if k in result), "loss")


class Evaluation:
    @torch.no_grad()
    def evaluate(self) -> dict:
        n = len(self.data.eval)
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss sum, correct, count
        # A task's own metrics (GLUE's, SQuAD's) need every eval output at once: (sample ids, outputs) of the
        # real samples
        outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for step, batch in self._batches("eval"):
            inputs, target = self._inputs_and_target(batch, "eval")
            out = self.runtime.forward_only(inputs, target)
            if out is None:
                continue
            if self.data.metrics is not None:
                real = batch["weight"] > 0
                outputs.append((batch["index"][real], out[real.to(out.device)].float().cpu()))
            weight = target[:, -1].double()
            sums[0] += (per_sample_loss(out, target, self.cfg.model.task).double() * weight).sum()
            if self.cfg.model.task == "classification":
                sums[1] += ((out.argmax(-1) == target[:, 0]).double() * weight).sum()
            sums[2] += weight.sum()
        dist.all_reduce(sums)
        loss, correct, count = sums.tolist()
        assert int(count) == n, f"evaluated {count} samples, expected {n}"
        result = {"loss": loss / count}
        if self.cfg.model.task == "classification":
            result["top1"] = 100.0 * correct / count
        if self.data.metrics is not None:
            result.update(self._task_metrics(outputs))
        return result

    def _task_metrics(self, outputs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
        """The data source's metrics (`DataSplits.metrics`) from every last stage's outputs; computed on rank 0
        and shared."""
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, outputs)
        box: list = [None]
        if self.is_main:
            pairs = [pair for part in gathered for pair in part]
            ids = torch.cat([i for i, _ in pairs])
            order = ids.argsort()
            values = torch.cat([o for _, o in pairs])[order]
            assert torch.equal(ids[order], torch.arange(len(self.data.eval))), "eval outputs do not cover the set"
            box[0] = self.data.metrics(values, self.data.eval)
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _remember(self, ev: dict) -> None:
        """Keep the newest eval, and the best one by its ranking metric (`metric_key`)."""
        if not ev:
            return
        self.last_eval = ev
        key = metric_key(ev)
        better = (ev[key] > self.best_eval.get(key, -1)) if key != "loss" else \
            (ev[key] < self.best_eval.get(key, float("inf")))
        if better:
            self.best_eval = {**ev, "epoch": self.epoch}
